"""The run-time side of the dispatcher: one lookup per linear call, then the kernel.

`run_linear` is the hook `QuantLinear.forward` calls. The base `Dispatcher` always runs the
torch reference (the CPU path). `AdaptiveDispatcher` (the default) runs the reference on CPU,
for fp32 inputs, for activation quantizers that are not a plain per-token `ActQuantSpec`, and
for modes without a kernel; on CUDA it looks (mode, group, N, K, M) up in the policy map, takes
the nearest profiled shape's pick for a shape the map never saw, and falls back to a fixed rule
where the map has nothing for the mode. Where the rule's tile cannot run a shape, another tile or
kernel of the mode runs (`_any_served`), dequantize + cuBLAS last; where not even that serves a store
on the GPU, it runs the reference. Both dequantize the whole weight per call and are said once per
mode and weight format (`ReferenceFallbackWarning`).
"""

from __future__ import annotations

import functools
import math
import warnings

import torch

from gearshift.dispatch.policy import Choice, PolicyMap, load_policy_for_device, nearest_shape_keys, type_key
from gearshift.dispatch.strategies import (MAX_TOKENS, STRATEGIES, group_of, mode_key, reads_fragment_codes,
                                           strategies_for, tiles_serve)
from gearshift.errors import GearshiftError
from gearshift.kernels._triton import HAS_TRITON
from gearshift.kernels.act_quant import ActCodes, CodesSpec, codes_qmax, natural_codes
from gearshift.kernels.config import TileConfig, block_m_for
from gearshift.kernels.reference import linear_reference, linear_reference_codes
from gearshift.kernels.switches import glu_epilogue_codes_on, glu_epilogue_on, x_tiles_on
from gearshift.kernels.x_tiles import XTiles
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.base import WeightFormat
from gearshift.quant.int4 import Int4Weight


class ReferenceFallbackWarning(UserWarning):
    """A quantized linear on the GPU runs a path that dequantizes its whole weight on every call (the torch
    reference, or dequantize + cuBLAS) because no fused kernel serves its store and mode."""


_WARNED_FALLBACKS: set = set()


def warn_reference_fallback(store: WeightFormat, act, m: int, runs: str = "the torch reference") -> None:
    """Warn once per (mode, format, group) that a quantized linear runs `runs` on the GPU, which dequantizes
    the whole weight on every call. (Dense weights run `F.linear` there: no warning.)"""
    if store.format_name == "dense":
        return
    mode, group = mode_key(store, act), group_of(store)
    key = (mode, store.format_name, group)
    if key in _WARNED_FALLBACKS:
        return
    _WARNED_FALLBACKS.add(key)
    hint = ""
    if act is not None and isinstance(store, Int4Weight) and store.group_size < 32:
        hint = ("; the W4A8 / W4A4 kernels need int4 groups of at least 32: load the model from a bf16 checkpoint "
                "with --quantize int4 for group 128")
    warnings.warn(f"no fused GPU kernel runs {mode} on {store.format_name} weights"
                  f"{f' of group {group}' if group else ''} (first: {store.out_features}x{store.in_features} at "
                  f"{m} tokens): those linears run {runs}, far slower{hint}", ReferenceFallbackWarning, stacklevel=4)


class Dispatcher:
    """Chooses a kernel per call. This base class always runs the torch reference."""

    name = "reference"

    def linear(self, x: torch.Tensor, store: WeightFormat, act: ActQuantSpec | None,
               bias: torch.Tensor | None = None, codes: ActCodes | None = None) -> torch.Tensor:
        """codes: x already quantized per token by its producer; used where the chosen kernel takes
        them (`codes_qmax` says when), else ignored: the result is the same either way."""
        return linear_reference(x, store, act, bias)

    def codes_qmax(self, store: WeightFormat, act: ActQuantSpec | None, m: int) -> float | None:
        """The code range the kernel chosen for m tokens would take already quantized activations
        in, or None where it quantizes them itself."""
        return None

    def codes_for(self, store: WeightFormat, act: ActQuantSpec | None, m: int,
                  dtype: torch.dtype) -> CodesSpec | None:
        """`codes_qmax` and the dtype the kernel takes the codes in, for activations of `dtype`."""
        qmax = self.codes_qmax(store, act, m)
        return None if qmax is None else CodesSpec(qmax, torch.int8)

    def linear_codes(self, codes: ActCodes, store: WeightFormat, act: ActQuantSpec | None,
                     bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """The linear on activations that exist only as their per-token codes (a producer that did
        not store them because `codes_for` said the kernel takes codes): here the reference on the
        dequantized codes, which is `linear` on the activations they came from."""
        if not isinstance(act, ActQuantSpec) or act.group_size is not None or codes.qmax != codes_qmax(act):
            raise GearshiftError(f"activation codes of range {codes.qmax} do not fit the activation quantizer {act}")
        return linear_reference_codes(natural_codes(codes), codes.scales, store, act, bias, dtype)


@functools.lru_cache(maxsize=4096)
def small_m_choices(mode: str, m: int, n: int, k: int, group: int = 128) -> tuple[Choice, ...]:
    """Un-profiled small-M picks, best first (each is used only where it supports the store):
    the register-fragment MMA kernel up to 16 tokens, then the CUDA-core GEMV at one token. On groups of
    32 / 64 (GGUF Q4_0 / Q4_1) the fragment kernel dequantizes before its MMAs and also runs 17..64 tokens
    of weights above `SMALL_WEIGHT`: on Llama-3-8B's shapes it took 0.47x / 0.85x the time of the tile
    kernel at 32 / 64 tokens (W4A16; W4A8 0.59x / 0.89x), and 0.16-0.40x of the picks before it at 1-16
    tokens (H200, `benchmarks/results/group32_paths.md`). Cached: it runs on every un-profiled linear call."""
    from gearshift.kernels.int4_mma_gemv import DEQUANT_GROUPS, MAX_TOKENS as MMA_MAX_TOKENS, mma_config

    if mode not in ("w4a16", "w4a8", "w4a4", "w4a8fp8"):
        return ()
    if m > 16 and not (group in DEQUANT_GROUPS and m <= MMA_MAX_TOKENS and n * k > SMALL_WEIGHT):
        return ()

    cfg = mma_config(n, k, m)
    if mode == "w4a16":
        out = [Choice("w4a16_mma", cfg)]
    elif mode == "w4a8fp8":  # e4m3 codes are not integers: as exact bf16 through the bf16 MMA
        out = [Choice("w4a8_mma", cfg)]
    else:  # integer codes on the int8 MMA, the bf16 form where that one does not serve the store
        out = [Choice("w4a8_mma_int8", cfg), Choice("w4a8_mma", cfg)]
    if mode == "w4a16" and m == 1:
        out.append(Choice("w4a16_fma", TileConfig(1, 32, 128, 4, 2, 2)))
        out.append(Choice("w4a16_fma", TileConfig(1, 32, 32, 4, 2, 2)))
    return tuple(out)


#: weights up to this many elements count as small in `default_choice` (SmolLM2's largest linear: 1.8 M)
SMALL_WEIGHT = 1 << 21


def default_choice(mode: str, m: int, n: int, group: int | None = None, k: int | None = None) -> Choice | None:
    """Un-profiled fallback: a sensible tile per M regime (replaced by the measured map). Above 16 tokens,
    W4A16 on small weights (`SMALL_WEIGHT`) in groups under 64 (GGUF Q4_0 / Q4_1) runs dequantize + cuBLAS:
    the `tl.dot` tile's K-tiles of 32 took 1.9x its time at 64 tokens on SmolLM2's shapes (H200,
    `benchmarks/results/group32_paths.md`). Larger weights were not measured, and there dequantizing the whole
    weight per call costs more, so they keep the tile."""
    if mode == "w4a16":
        if m > 16 and group is not None and 0 < group < 64 and k is not None and n * k <= SMALL_WEIGHT:
            return Choice("dequant_cublas", None)
        if m <= 16:
            return Choice("w4a16_tc", TileConfig(16, 64, 256, 4, 4, 4, True, True))
        if m <= 64:
            return Choice("w4a16_tc", TileConfig(block_m_for(m, 64), 64, 256, 2, 4, 4, True, True))
        if m <= 256:
            return Choice("w4a16_tc", TileConfig(block_m_for(m, 128), 128, 64, 1, 4, 3, False, True))
        return Choice("dequant_cublas", None)
    if mode in ("w4a8", "w4a4", "w4a8fp8"):
        name = "w4a8_fp8" if mode == "w4a8fp8" else "w4a8_pad"
        if m <= 16:
            return Choice(name, TileConfig(16, 64, 256, 4, 4, 4, True, True))
        if m <= 128:
            return Choice(name, TileConfig(block_m_for(m, 128), 128, 128, 1, 4, 4, True, True))
        return Choice(name, TileConfig(128, 128, 128, 1, 8, 3, True, True))
    if mode in ("w8a16", "w8a8", "w8a4"):
        name = "w8a16_tc" if mode == "w8a16" else "w8a8_tc"
        if m <= 16:
            return Choice(name, TileConfig(16, 64, 256, 4, 4, 4))
        return Choice(name, TileConfig(block_m_for(m, 128), 128, 64, 1, 8, 3))
    if mode == "w16a16":
        return Choice("cublas", None)
    return None


class AdaptiveDispatcher(Dispatcher):
    """ADAngel's dispatcher: policy-map lookup on CUDA, torch reference elsewhere."""

    name = "adaptive"

    def __init__(self, policy: PolicyMap | None = None, autoload: bool = True, static: str | None = None):
        self.policy = policy
        self._autoload = autoload and policy is None
        self.static = static  # force one strategy (ablations); None: use the map
        self.calls: dict[str, int] = {}
        self._served_memo: dict[tuple, Choice] = {}  # `_best_served`, per map, type key, bucket and store kind
        self._nearest_memo: dict[tuple, Choice | None] = {}  # `_nearest_shape`, the same plus the shape
        self._any_memo: dict[tuple, Choice] = {}  # `_any_served`, per mode, M, shape and store kind

    def _policy(self) -> PolicyMap | None:
        if self._autoload:
            self._autoload = False
            self.policy = load_policy_for_device()
        return self.policy

    def choose(self, store: WeightFormat, act: ActQuantSpec | None, m: int) -> Choice | None:
        mode = mode_key(store, act)
        n, k = store.out_features, store.in_features
        if self.static is not None:
            s = STRATEGIES.get(self.static)
            if s is None or mode not in s.modes:
                return None
            pm = self._policy()
            if pm is not None:  # the strategy's own best profiled tile, if the map timed it
                from gearshift.dispatch.policy import parse_candidate

                cands = pm.timings.get(type_key(mode, group_of(store), n, k), {}).get(
                    str(pm.buckets[pm.bucket_index(m)]), {})
                best = min(((us, c) for c, us in cands.items() if parse_candidate(c)[0] == self.static
                            and us is not None), default=None)
                if best is not None:
                    return Choice(self.static, parse_candidate(best[1])[1], best[0])
            d = default_choice(mode, m, n)
            if d is not None and d.strategy == self.static:
                return Choice(self.static, d.config)
            cfgs = s.configs(m)
            if not cfgs:
                return None
            cfg = cfgs[0]
            return Choice(self.static, cfg)
        pm = self._policy()
        if pm is not None and not self._stale_small_m(pm, mode, m):
            key = type_key(mode, group_of(store), n, k)
            c = pm.lookup(key, m)
            if c is not None and self._serves(c, store, act, m):
                return c
            if c is not None:  # e.g. a map profiled on stores with row units, run on plain ones
                c = self._best_served(pm, key, store, act, m)
                if c is not None:
                    return c
            elif key not in pm.entries:  # a shape the map never saw (another model): its nearest shape's picks
                c = self._nearest_shape(pm, mode, group_of(store), n, k, store, act, m)
                if c is not None:
                    return c
        for c in small_m_choices(mode, m, n, k, group_of(store)):
            if self._serves(c, store, act, m):
                return c
        d = default_choice(mode, m, n, group_of(store), k)
        if d is None or self._serves(d, store, act, m):
            return d
        return self._any_served(d, mode, store, act, m)

    def _any_served(self, d: Choice, mode: str, store: WeightFormat, act: ActQuantSpec | None, m: int) -> Choice:
        """Where the rule's tile cannot run this shape (W8A16's K-tile of 256 on SmolLM2's K = 576, say): the
        first of that strategy's own tiles, then of the mode's other kernels, that can, before the torch
        reference. Cached per shape and store kind; `d` itself where none can (`kernel_for` warns then)."""
        kind = (mode, m, store.out_features, store.in_features, store.format_name, getattr(store, "layout", None),
                getattr(store, "row_units", None) is None, None if act is None else (act.dtype, act.bits,
                                                                                     act.group_size))
        hit = self._any_memo.get(kind)
        if hit is None:
            first = STRATEGIES.get(d.strategy)
            order = ([first] if first is not None else []) + [s for s in strategies_for(mode) if s is not first]
            hit = next((Choice(s.name, cfg) for s in order if s.name != "reference"
                        for cfg in s.configs(m) if self._serves(Choice(s.name, cfg), store, act, m)), d)
            self._any_memo[kind] = hit
            if hit.strategy == "dequant_cublas":  # no fused tile could: said once per mode and format
                warn_reference_fallback(store, act, m, "dequantize + cuBLAS")
        return hit

    @staticmethod
    def _serves(c: Choice, store: WeightFormat, act: ActQuantSpec | None, m: int) -> bool:
        s = STRATEGIES.get(c.strategy)
        return s is not None and m <= MAX_TOKENS.get(c.strategy, 1 << 62) and s.supports(store, act, c.config)

    def _best_served(self, pm: PolicyMap, key: str, store: WeightFormat, act: ActQuantSpec | None,
                     m: int) -> Choice | None:
        """The fastest candidate the map timed at m's bucket that can run this store, when the map's
        pick cannot (its kernel needs a property this store lacks). Cached per store kind."""
        from gearshift.dispatch.policy import parse_candidate

        bucket = pm.buckets[pm.bucket_index(m)]
        memo = self._served_memo
        kind = (id(pm), key, bucket, getattr(store, "layout", None), getattr(store, "row_units", None) is None,
                None if act is None else (act.dtype, act.bits, act.group_size))
        hit = memo.get(kind)  # re-checked below: M within the bucket can still matter (MAX_TOKENS)
        if hit is not None and self._serves(hit, store, act, m):
            return hit
        cands = pm.timings.get(key, {}).get(str(bucket), {})
        for cand, us in sorted(((c, us) for c, us in cands.items() if us is not None), key=lambda cu: cu[1]):
            name, cfg = parse_candidate(cand)
            c = Choice(name, cfg, us)
            if self._serves(c, store, act, m):
                memo[kind] = c
                return c
        return None

    def _nearest_shape(self, pm: PolicyMap, mode: str, group: int, n: int, k: int, store: WeightFormat,
                       act: ActQuantSpec | None, m: int) -> Choice | None:
        """For a (N, K) the map never profiled, e.g. a model other than the one it was made for: the
        pick of the profiled shape of the same mode and group nearest in log N + log K (then the next
        nearest) whose kernel runs this store, its map entry first, else its fastest timed candidate
        that does. The un-profiled rules pick first-generation kernels above 16 tokens, 2-5x slower
        on Hopper (docs/kernels_history.md, stop 31). Cached per map, shape, bucket and store kind."""
        bucket = pm.buckets[pm.bucket_index(m)]
        act_kind = None if act is None else (act.dtype, act.bits, act.group_size)
        kind = (id(pm), mode, group, n, k, bucket, getattr(store, "layout", None),
                getattr(store, "row_units", None) is None, act_kind)
        if kind in self._nearest_memo:
            hit = self._nearest_memo[kind]
            if hit is None or self._serves(hit, store, act, m):
                return hit
        found = None
        for key in nearest_shape_keys(pm.entries, mode, group, n, k):
            c = pm.lookup(key, m)
            if c is not None and not self._serves(c, store, act, m):
                c = self._best_served(pm, key, store, act, m)
            if c is not None:
                found = c
                break
        self._nearest_memo[kind] = found
        return found

    def _stale_small_m(self, pm: PolicyMap, mode: str, m: int) -> bool:
        """A map profiled before the small-M kernels existed must not override them at M <= 16."""
        if m > 16 or mode not in ("w4a16", "w4a8", "w4a4", "w4a8fp8"):
            return False
        if getattr(self, "_known_pm", ()) != (id(pm),):
            self._known_pm = (id(pm),)
            self._knows_mma = (any("_mma" in str(c) for cands in pm.timings.values() for per_m in cands.values()
                                   for c in per_m)
                               or any(c is not None and "_mma" in c.strategy
                                      for row in pm.entries.values() for c in row))
        return not self._knows_mma

    def codes_qmax(self, store: WeightFormat, act: ActQuantSpec | None, m: int) -> float | None:
        spec = self.codes_for(store, act, m, torch.bfloat16)
        return None if spec is None else spec.qmax

    def codes_for(self, store: WeightFormat, act: ActQuantSpec | None, m: int,
                  dtype: torch.dtype) -> CodesSpec | None:
        qmax = codes_qmax(act)
        if qmax is None or not HAS_TRITON or store.device.type != "cuda":  # the reference takes no codes
            return None
        c = self.choose(store, act, m)
        s = None if c is None else STRATEGIES.get(c.strategy)
        if s is None or s.run_codes is None or not s.supports(store, act, c.config):
            return None
        return CodesSpec(qmax, dtype if s.codes_float else torch.int8, reads_fragment_codes(s))

    def x_tiles_for(self, store: WeightFormat, act: ActQuantSpec | None, m: int, dtype: torch.dtype) -> bool:
        """Whether the kernel chosen for m tokens reads its inputs in `x_tiles`' layout, so that their producer
        writes them so (`XTiles`): W4A16 fragment tiles without xshare, at the token counts `switches.x_tiles_on`
        takes (1..16 unless the switches say otherwise)."""
        if (not x_tiles_on(m) or act is not None
                or dtype not in (torch.float16, torch.bfloat16) or not HAS_TRITON or store.device.type != "cuda"):
            return False
        planned = self.kernel_for(store, act, m)
        return planned is not None and planned[0].run_tiles is not None and tiles_serve(store, planned[1].config)

    def linear_tiles(self, x: XTiles, store: WeightFormat, act: ActQuantSpec | None,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
        """`linear` on inputs a producer stored in `x_tiles`' layout (`x_tiles_for` asked for them); where the
        kernel for these tokens does not read them, `linear` runs on their rows (a copy; the same bits)."""
        m = x.tokens
        planned = self.kernel_for(store, act, m) if x.is_cuda and act is None else None
        y = None
        if planned is not None and planned[0].run_tiles is not None:
            y = planned[0].run_tiles(x.data, m, store, planned[1].config)
        if y is None:
            return self.linear(x.rows(), store, act, bias)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], store.out_features)

    def linear(self, x: torch.Tensor, store: WeightFormat, act: ActQuantSpec | None,
               bias: torch.Tensor | None = None, codes: ActCodes | None = None) -> torch.Tensor:
        if isinstance(x, XTiles):
            return self.linear_tiles(x, store, act, bias)
        if (not x.is_cuda or not HAS_TRITON or x.dtype not in (torch.float16, torch.bfloat16)
                or not (act is None or isinstance(act, ActQuantSpec)) or x.numel() == 0):
            return linear_reference(x, store, act, bias)
        k = store.in_features
        x2 = x if x.dim() == 2 else x.reshape(-1, k)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        planned = self.kernel_for(store, act, x2.shape[0])
        if planned is None:
            return linear_reference(x, store, act, bias)
        strat, c = planned
        if codes is not None and _takes(strat, codes, act, x2.shape, x2.dtype):
            y = strat.run_codes(codes, store, c.config, x2.dtype)
        else:
            y = strat.run(x2, store, act, c.config)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], store.out_features)

    def linear_glu(self, x: torch.Tensor | XTiles | None, store: WeightFormat, act: ActQuantSpec | None,
                   codes: ActCodes | None = None, shape: tuple | None = None,
                   dtype: torch.dtype | None = None, y_tiles: bool = False) -> torch.Tensor | XTiles | None:
        """SwiGLU's silu(gate) * up [..., N / 2] from the fused gate_up store, computed in the epilogue of
        the kernel that `linear` would run for these tokens, where that kernel has such an epilogue (fragment
        tiles: W4A16 on x, W4A8 / W4A4 on the `codes` of x); None elsewhere (the caller runs `linear` and the
        SwiGLU kernel: same bits). x may be None where the producer stored only the codes: `shape` and `dtype`
        are then x's. x may be `XTiles`; y_tiles: the product as `XTiles` where this kernel can store it so
        (down's kernel reads that layout: `x_tiles_for`), else in rows."""
        shape = tuple(x.shape) if x is not None else tuple(shape)
        dtype = x.dtype if x is not None else dtype
        dev = (x.data if isinstance(x, XTiles) else x if x is not None else codes.codes).device
        if (not (glu_epilogue_on() if codes is None else glu_epilogue_codes_on()) or dev.type != "cuda"
                or not HAS_TRITON or math.prod(shape) == 0
                or dtype not in (torch.float16, torch.bfloat16) or (act is None) != (codes is None)):
            return None
        m = math.prod(shape[:-1])
        c = self.choose(store, act, m)
        strat = None if c is None else STRATEGIES.get(c.strategy)
        if strat is None or not strat.supports(store, act, c.config):
            return None
        if codes is None:
            if strat.run_glu is None:
                return None
            if strat.run_tiles is not None and (isinstance(x, XTiles) or y_tiles):
                return self._glu_tiles(x, strat, store, c, m, shape, y_tiles)
            if isinstance(x, XTiles):
                x = x.rows()
            x2 = x if x.dim() == 2 else x.reshape(-1, store.in_features)
            y = strat.run_glu(x2 if x2.stride(-1) == 1 else x2.contiguous(), store, c.config)
        else:
            if strat.run_glu_codes is None or not _takes(strat, codes, act, (m, store.in_features), dtype):
                return None
            y = strat.run_glu_codes(codes, store, c.config, dtype)
        return None if y is None else y.reshape(*shape[:-1], store.out_features // 2)

    @staticmethod
    def _glu_tiles(x, strat, store: WeightFormat, c: Choice, m: int, shape: tuple, y_tiles: bool):
        """`linear_glu` where the inputs are `XTiles` or the product is wanted so: the tile's epilogue reads and
        stores what layouts it can (its inputs in rows where it cannot read tiles); None where it has no
        epilogue for these tokens."""
        if isinstance(x, XTiles) and tiles_serve(store, c.config):
            data, kw = x.data, {"x_tiles": m}
        else:
            x2 = (x.rows() if isinstance(x, XTiles) else x).reshape(-1, store.in_features)
            data, kw = (x2 if x2.stride(-1) == 1 else x2.contiguous()), {}
        y = strat.run_glu(data, store, c.config, y_tiles=y_tiles, **kw)
        if y is None:
            return None
        return XTiles(y, (*shape[:-1], store.out_features // 2)) if y_tiles else y.reshape(*shape[:-1], -1)

    def kernel_for(self, store: WeightFormat, act: ActQuantSpec | None, m: int):
        """(strategy, choice) that runs m tokens of this store on the GPU, or None where none serves it
        (the reference runs then: warned once per mode and format, `warn_reference_fallback`)."""
        c = self.choose(store, act, m)
        strat = None if c is None else STRATEGIES.get(c.strategy)
        if strat is not None and c.strategy == "w4a16_gemv" and m > c.config.bm:
            c = default_choice(mode_key(store, act), m, store.out_features, group_of(store),
                               store.in_features)  # bucket rounded down
            strat = STRATEGIES.get(c.strategy)
        if strat is None or not strat.supports(store, act, c.config):
            warn_reference_fallback(store, act, m)
            return None
        return strat, c

    def linear_codes(self, codes: ActCodes, store: WeightFormat, act: ActQuantSpec | None,
                     bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """`linear` for activations the producer never stored (only their codes). Where `linear`
        runs the reference (CPU, fp32), so does this, on the dequantized codes; on the GPU the kernel
        `linear` would choose must take them, else this raises (there is nothing else to run on)."""
        if not codes.codes.is_cuda or not HAS_TRITON or dtype not in (torch.float16, torch.bfloat16):
            return super().linear_codes(codes, store, act, bias, dtype)
        m = codes.codes.shape[0]
        c = self.choose(store, act, m)
        strat = None if c is None else STRATEGIES.get(c.strategy)
        if (strat is None or not strat.supports(store, act, c.config)
                or not _takes(strat, codes, act, (m, store.in_features), dtype)):
            raise GearshiftError(
                f"no kernel takes these activation codes ({m} x {store.in_features}, range {codes.qmax}, "
                f"{codes.codes.dtype}) for {mode_key(store, act)}; the producer must store its activations "
                "unless codes_for() asked for the codes")
        y = strat.run_codes(codes, store, c.config, dtype)
        return y if bias is None else y + bias.to(y.dtype)


def _takes(strat, codes: ActCodes, act, shape, dtype: torch.dtype) -> bool:
    """Whether strategy `strat` takes these codes for activations of `shape` and `dtype`."""
    return (strat.run_codes is not None and codes.qmax == codes_qmax(act) and tuple(codes.codes.shape) == tuple(shape)
            and codes.codes.dtype == (dtype if strat.codes_float else torch.int8)
            and codes.fragment_order == reads_fragment_codes(strat))


_active: Dispatcher = AdaptiveDispatcher()


def get_dispatcher() -> Dispatcher:
    return _active


def set_dispatcher(d: Dispatcher) -> None:
    global _active
    _active = d


def install_policy(model_dir=None, device: str | None = None) -> AdaptiveDispatcher:
    """Load the device's policy map (beside the model, then ~/.cache/gearshift/policy) and make it active.

    The engine calls this once at model load; without a map the rule-based defaults run.
    """
    d = AdaptiveDispatcher(load_policy_for_device(device, model_dir), autoload=False)
    set_dispatcher(d)
    return d


def run_linear(x: torch.Tensor, store: WeightFormat, act: ActQuantSpec | None,
               bias: torch.Tensor | None = None, codes: ActCodes | None = None) -> torch.Tensor:
    if codes is None:  # a dispatcher installed with set_dispatcher may predate the codes argument
        return _active.linear(x, store, act, bias)
    return _active.linear(x, store, act, bias, codes)


def run_linear_codes(codes: ActCodes, store: WeightFormat, act: ActQuantSpec | None, bias: torch.Tensor | None,
                     dtype: torch.dtype) -> torch.Tensor:
    """`run_linear` on activations that exist only as codes (`Dispatcher.linear_codes`)."""
    run = getattr(_active, "linear_codes", None)
    if run is None:
        raise GearshiftError(f"the installed dispatcher {type(_active).__name__} takes no activation codes")
    return run(codes, store, act, bias, dtype)
