"""Switches of the engine's kernels: the small fused Triton kernels (RMSNorm, RoPE, KV-cache write,
SwiGLU, decode attention) and where the fragment GEMV lets its PDL successor in.

The fused kernels are on by default on CUDA; `set_fused_kernels(False)` restores the torch ops
(benchmarks compare the two). GEMM kernels are chosen by the dispatcher, not here; `e2e_ab.py`
A/Bs any switch end to end, with CUDA graphs keyed by `state()`.
"""

from __future__ import annotations

from gearshift.kernels._triton import HAS_TRITON
from gearshift.kernels.x_tiles import X_TILE_TOKENS

_FUSED = {"enabled": True, "on_cpu": False, "swiglu_codes": True, "swiglu_codes_min_rows": 1,
          "decode_attention": True, "decode_attention_codes": False, "decode_attention_min_batch": 1,
          "decode_attention_launch": "rule", "gemv_trigger": -1, "small_trigger": "rule", "glu_epilogue": True,
          "glu_epilogue_codes": False, "x_tiles": True, "x_tiles_from": 1,
          "x_tiles_linears": "qkv+o+gate_up+down", "norm_warps": 0, "norm_codes_warps": 0,
          "sdpa_backend": "efficient", "s8_fragment_order": True, "group_index": "rule",
          "tile_room": True}


def state() -> tuple:
    """The switches as they stand (hashable): captured CUDA graphs are keyed by it, so a switch
    changed between steps never replays kernels captured under another setting."""
    return tuple(sorted(_FUSED.items()))


def set_switches(**values) -> None:
    """Set switches by name (benchmarks' A/B runs), e.g. decode_attention=False."""
    unknown = set(values) - set(_FUSED)
    if unknown:
        raise ValueError(f"unknown switches {sorted(unknown)}; known: {sorted(_FUSED)}")
    if "small_trigger" in values and values["small_trigger"] not in SMALL_TRIGGERS:
        raise ValueError(f"small_trigger must be one of {SMALL_TRIGGERS}, not {values['small_trigger']!r}")
    if "decode_attention_launch" in values and values["decode_attention_launch"] not in DECODE_ATTENTION_LAUNCHES:
        raise ValueError(f"decode_attention_launch must be one of {DECODE_ATTENTION_LAUNCHES}, "
                         f"not {values['decode_attention_launch']!r}")
    if "group_index" in values and values["group_index"] not in GROUP_INDEXES:
        raise ValueError(f"group_index must be one of {GROUP_INDEXES}, not {values['group_index']!r}")
    if "sdpa_backend" in values and values["sdpa_backend"] not in SDPA_BACKENDS:
        raise ValueError(f"sdpa_backend must be one of {SDPA_BACKENDS}, not {values['sdpa_backend']!r}")
    if "x_tiles_linears" in values:
        named = [n for n in str(values["x_tiles_linears"]).split("+") if n]
        if set(named) - set(X_TILE_LINEARS):
            raise ValueError(f"x_tiles_linears: '+'-joined names among {X_TILE_LINEARS}, not "
                             f"{values['x_tiles_linears']!r}")
    for k, v in values.items():
        _FUSED[k] = type(_FUSED[k])(v)


def fused_kernels_enabled() -> bool:
    return HAS_TRITON and _FUSED["enabled"]


def set_fused_kernels(enabled: bool) -> None:
    _FUSED["enabled"] = bool(enabled)


def fused_for(t) -> bool:
    """Whether the model runs the fused kernels on tensor t: on CUDA, or on CPU when a test has
    asked for it (`fused_on_cpu`, under TRITON_INTERPRET=1: the model-level check of the fused
    path that CI can run)."""
    return fused_kernels_enabled() and (t.is_cuda or _FUSED["on_cpu"])


def fused_on_cpu(enabled: bool) -> None:
    _FUSED["on_cpu"] = bool(enabled)


def swiglu_codes_for(rows: int) -> bool:
    """Whether the fused SwiGLU also emits the down projection's activation codes (where its kernel
    takes them) for `rows` tokens. With one program per row (the codes need the row's max) that was
    slower than SwiGLU plus the quantizer below 64 tokens (H100, benchmarks/swiglu_codes.py, per layer:
    6.0 against 5.5 us at 1 token), so it started at 64 until stop 34; since then up to
    `silu_mul.SPLIT_ROWS` rows split each row over programs that meet at a barrier: 3.8 against 5.3 us
    at 1 token, 4.7 against 6.2 at 16, 6.9 against 9.4 at 64 (and 11.9 against 13.9 at 256, 157
    against 202 at 4096 with one program per row). `set_swiglu_codes` changes it (same bits either
    way: for A/B timing)."""
    return _FUSED["swiglu_codes"] and rows >= _FUSED["swiglu_codes_min_rows"]


def set_swiglu_codes(enabled: bool, min_rows: int | None = None) -> None:
    _FUSED["swiglu_codes"] = bool(enabled)
    if min_rows is not None:
        _FUSED["swiglu_codes_min_rows"] = int(min_rows)


def glu_epilogue_on() -> bool:
    """Whether the gate_up projection's kernel may store silu(gate) * up itself where it can (W4A16 fragment
    tiles, `int4_mma_gemv.mma_glu_supports`), so SwiGLU is no kernel of its own (same bits either way)."""
    return _FUSED["glu_epilogue"]


#: the linears whose inputs a producer may write in `x_tiles`' layout, by the name of their projection (qkv and
#: gate_up from the RMSNorms, o from decode attention, down from gate_up's SwiGLU epilogue)
X_TILE_LINEARS = ("qkv", "o", "gate_up", "down")


def x_tiles_on(tokens: int, linear: str | None = None) -> bool:
    """Whether the producers of a linear's input write it in `x_tiles`' layout where the linear's kernel reads
    it so (W4A16 fragment tiles): same bits, fewer L1 wavefronts per input load (stop 64) and no input PRMTs
    (stop 65). From `x_tiles_from` tokens (1; 3 in stop 65, when one sequence's step lost 2.6% with them, until
    stop 66 let an absent token's lanes read the last token's place) up to the layout's 16; `linear` (an
    `X_TILE_LINEARS` name; None: any) among `x_tiles_linears` (all four unless an A/B leaves some out)."""
    return (_FUSED["x_tiles"] and tokens in X_TILE_TOKENS and tokens >= _FUSED["x_tiles_from"]
            and (linear is None or linear in _FUSED["x_tiles_linears"].split("+")))


def tile_room_on() -> bool:
    """Whether the linears' producers allocate whole token tiles and the wgmma kernels read the rows past their input
    from there (`tile_room.py`; off: exact rows, and zero rows copied where `tma_rows` / `code_rows` say)."""
    return bool(_FUSED["tile_room"])


def s8_fragment_order_on() -> bool:
    """Whether int8 activation codes for the fragment kernel (`w4a8_mma_int8`) are stored with each 8 columns in
    `x_tiles.S8_FRAGMENT_ORDER`, so its block needs no input PRMTs (stop 69; same bits). Their producers (the
    RMSNorms, SwiGLU, decode attention, the strategy's own quantizer) write them so where `codes_for` asks."""
    return _FUSED["s8_fragment_order"]


def glu_epilogue_codes_on() -> bool:
    """The same on activation codes (W4A8 / W4A4): gate_up's kernel stores silu(gate) * up and down quantizes
    it itself, instead of SwiGLU emitting down's codes (same codes, same bits). Off by default: end to end it
    was even (H100, stop 49: W4A8 0.989-1.005, W4A4 0.990-1.002 at batch 1-16): down's quantizer replaces
    SwiGLU's codes kernel, so the step keeps one launch either way."""
    return _FUSED["glu_epilogue"] and _FUSED["glu_epilogue_codes"]


def norm_warps(codes: bool) -> int:
    """Warps of an RMSNorm program (one row each): 0 leaves it to the rule (8 from 4096 columns, else 4).
    codes: of a norm that also emits the next linear's codes (W4A8 / W4A4). The warps set the order of the
    sum of squares, and so the statistics' last bit; timing switches (`benchmarks/step_ab.py`)."""
    return _FUSED["norm_codes_warps" if codes else "norm_warps"]


def decode_attention_on() -> bool:
    """Whether short passes (decode, QSPEC draft / verify) run `kernels/decode_attention.py` instead
    of SDPA where the fused kernels run. Both attend the same keys; the bits differ (another
    summation order), so an A/B (`set_decode_attention`, e2e.py --no-decode-attention) compares
    speed, not tokens."""
    return _FUSED["decode_attention"]


def decode_attention_codes_on() -> bool:
    """Whether that kernel also emits the o projection's activation codes where o's kernel takes
    them (W4A8 / W4A4), instead of o quantizing its input in a launch of its own (same bits)."""
    return _FUSED["decode_attention_codes"]


def set_decode_attention(enabled: bool, codes: bool | None = None) -> None:
    _FUSED["decode_attention"] = bool(enabled)
    if codes is not None:
        _FUSED["decode_attention_codes"] = bool(codes)


def decode_attention_min_batch() -> int:
    """Sequences in the cache from which short passes run the decode attention kernel (fewer: SDPA).

    Stop 35 set 3: one or two sequences measured 3-7% / 4-13% slower end to end with the kernel. Stop 46
    found why (`benchmarks/decode_attention_chunks.py` and `step_ab.py`, the graphed decode step on the H100): the kernel let
    the o projection in at its start, and o's weight preload then competed with the attention's few
    programs (16 at one sequence and 512 keys). Launched without PDL at 1-2 rows it is 1.3% faster
    than SDPA at batch 1 and 2 (`decode_attention_launch_rule`), so the kernel now runs from one sequence."""
    return _FUSED["decode_attention_min_batch"]


DECODE_ATTENTION_LAUNCHES = ("rule", "start", "loop", "off")

#: torch SDPA backends the model's attention over the cache runs on CUDA (`model.attention`)
SDPA_BACKENDS = ("efficient", "auto", "math")


def sdpa_backend() -> str:
    """"efficient" (default): torch's memory-efficient kernel, on K/V heads repeated to the query's; "auto":
    torch's own choice (cuDNN on an H100 / H200: a plan per new shape, and a kernel compile per new kind of
    shape on a fresh machine); "math": torch's reference kernel."""
    return _FUSED["sdpa_backend"]


def decode_attention_launch_rule(rows: int, codes: bool, tiles: bool = False) -> str:
    """Where the decode attention kernel lets its PDL successor in, for a pass of `rows` query tokens
    whose linears take activation codes or not, and whose producers write x tiles or not: "off" (no PDL:
    the o projection starts once attention has completed) at 1-2 rows on bf16 inputs without x tiles, else
    "start". Stop 46 (`benchmarks/step_ab.py`, the graphed decode step on the H100): on bf16 inputs at 1-2
    rows o's weight preload slowed the attention's few programs ("start" 1.07-1.08x the time of "off"); with
    codes the quantizer comes between the two and "start" is 0.982-0.988 of "off"; from 3 rows "off" cost
    1.018-1.022. Stop 66 (H200, W4A16): with x tiles, whose passes of 1-2 rows run the small kernels'
    "wait" trigger, "start" is 0.990 / 0.967 of "off" at 1 / 2 rows. Timing only: same bits."""
    return "off" if rows <= 2 and not codes and not tiles else "start"


def decode_attention_launch(rows: int, codes: bool = False, tiles: bool = False) -> str:
    """The switch ("rule", the default, or one point for every launch: "start", "loop", "off")."""
    where = _FUSED["decode_attention_launch"]
    return decode_attention_launch_rule(rows, codes, tiles) if where == "rule" else where


def attention_launch(rows: int) -> str:
    """Decode attention's launch point for the launch at hand: the running pass's (`pdl_pass`), else
    the switch for `rows` bf16 tokens."""
    return _PASS["attention"] if _PASS["attention"] is not None else decode_attention_launch(rows)


def gemv_trigger() -> int:
    """-1: the fragment GEMV lets its PDL successor in where `int4_mma_gemv.pdl_trigger` says; 0-3:
    at that one point for every launch (end-to-end A/B of the rule; the bits never change)."""
    return _FUSED["gemv_trigger"]


GROUP_INDEXES = ("rule", "signed", "unsigned")


def group_signed(tiles: int, codes: bool, dequant: bool) -> int:
    """1: the fragment GEMV divides a block's word index by the group's words signed, 0: unsigned (same bits).

    Unsigned takes 2-6 SASS off a block (`sass_loop.py`), but ptxas then schedules and allocates some tiles
    otherwise, and whole steps move either way (stop 70, `policy_ab.py --set-b int4_mma_gemv.GROUP_SIGNED=0`,
    the H200): bf16 inputs at one token tile 0.979 / 0.980 / 0.990 / 0.998 at 1 / 2 / 4 / 8 tokens, but 1.024 at
    16 (down 1.089, qkv 1.037 alone), and int8 codes 1.010-1.037 (qkv's preload tiles 1.07-1.12 alone). The
    "rule" takes unsigned only where it gained: 16-bit inputs, no codes, one token tile, no dequantize-first."""
    where = _FUSED["group_index"]
    if where == "rule":
        return int(tiles > 1 or codes or dequant)
    return int(where == "signed")


SMALL_TRIGGERS = ("rule", "start", "wait")
_PASS = {"small": None, "attention": None}  # the running forward pass's resolved launch points (`pdl_pass`)


def small_trigger_rule(rows: int, codes: bool, tiles: bool = False) -> str:
    """Where the small kernels between the linears (RMSNorm, SwiGLU, RoPE + KV write, the activation
    quantizer) let their PDL successor in, for a pass of `rows` tokens whose linears take activation
    codes or not, and whose producers write x tiles (`x_tiles_on`) or not: "start" (before their wait, so
    the next linear preloads its weights while they wait) or "wait" (right after it, once their
    predecessor has completed).

    Stop 44 (`engine_trace.py`): with "start", a linear that lets its successor in early lets the linear
    after the norm in too, and two linears share the SMs. Stop 45 (`benchmarks/trigger_matrix.py`, the
    engine's graphed decode step on the H100): "wait" costs W4A16 3.4-3.7% at 1-2 tokens, is even at
    3-16 under the old GEMV rule and lets the GEMV trigger earlier from 3 tokens without losing; W4A8
    (codes) gains 0.5-1.9% from it at every batch. Stop 66 (`step_ab.py`, the H200's W4A16 step): with x tiles
    at 1 / 2 rows "wait" is 0.994 / 0.962 of "start". Timing only: the bits never change."""
    return "start" if rows <= 2 and not codes and not tiles else "wait"


class pdl_pass:
    """Context of one forward pass of `rows` tokens whose linears take activation codes or not (and whose
    producers write x tiles or not): the small kernels and decode attention launched inside it let their PDL
    successors in where the switches say, resolved once here ("rule": `small_trigger_rule`,
    `decode_attention_launch_rule`), so a captured CUDA graph holds one setting. Outside any pass: the small
    kernels at their start, attention by the rule for bf16 inputs."""

    def __init__(self, rows: int, codes: bool, tiles: bool = False):
        where = _FUSED["small_trigger"]
        self.small = small_trigger_rule(rows, codes, tiles) if where == "rule" else where
        self.attention = decode_attention_launch(rows, codes, tiles)

    def __enter__(self):
        self.before = dict(_PASS)
        _PASS.update(small=self.small, attention=self.attention)
        return self

    def __exit__(self, *exc):
        _PASS.update(self.before)


def small_trigger() -> str:
    """The small kernels' trigger for the launch at hand: "start" or "wait" (see `small_trigger_rule`)."""
    if _PASS["small"] is not None:
        return _PASS["small"]
    return "start" if _FUSED["small_trigger"] == "rule" else _FUSED["small_trigger"]


def set_small_trigger(where: str) -> None:
    """"rule" (the default), or "start" / "wait" for every pass (A/B timing)."""
    set_switches(small_trigger=where)
