"""The warp-specialized Gluon W4A16 kernel (`kernels/w4a16_wgmma.py`).

Gluon has no CPU interpreter, so on CPU: the torch model of its numerics against the reference,
the config / support rules, the clear error on a store it cannot read, and an sm_90 compile of
the kernel (which also proves the byte tile's register layout is exactly the wgmma A fragment:
the kernel asserts that conversion is free). On a Hopper GPU: the kernel against its torch model.
"""

from __future__ import annotations

import re

import pytest
import torch

from gearshift.dispatch.profiler import PRESETS, random_store
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels import w4a16_wgmma as W16
from gearshift.kernels.w4a16_wgmma import (BKS, HAS_GLUON, smem_bytes, tma_rows, w4a16_wgmma, w4a16_wgmma_emulate,
                                           wgmma_configs, wgmma_supports)
from gearshift.quant.int4 import BLOCKS16, ROWS, Int4Weight

from hopper import needs_hopper  # tests/hopper.py

pytestmark = pytest.mark.skipif(not HAS_GLUON, reason="this Triton has no Gluon")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulation_is_the_reference_up_to_rounding(dtype):
    torch.manual_seed(0)
    st = random_store("int4", 96, 512, 128, "cpu")
    x = torch.randn(37, 512, dtype=dtype)
    emu = w4a16_wgmma_emulate(x, st).float()
    ref = linear_reference(x.float(), st, None)
    assert ((emu - ref).norm() / ref.norm()).item() < 1e-2


def _shape_only_store(n, k, layout):
    """An int4 store of the right shapes whose values are never read (support rules only)."""
    g = k // 128
    return Int4Weight(torch.empty(n, k // 2, dtype=torch.uint8), torch.ones(n, g, dtype=torch.float16),
                      torch.zeros(n, g, dtype=torch.float16), 128, layout=layout)


def test_configs_fit_the_llama_shapes():
    for _, n, k in PRESETS["llama3-8b"]["shapes"]:
        for layout in (ROWS, BLOCKS16):
            st = _shape_only_store(n, k, layout)
            for m in (64, 100, 128, 256, 512, 1024, 4096):
                for cfg in wgmma_configs(m):
                    assert cfg.bk in BKS and cfg.bn == 16 * cfg.warps and cfg.bm <= max(64, m)
                    assert smem_bytes(cfg) <= 227 * 1024
                    assert wgmma_supports(st, cfg), (n, k, m, cfg)
    assert wgmma_configs(16) == []  # small M belongs to the fragment kernels


def test_hybrid_tiles_are_stream_k_launches_profiled_from_m256():
    st = random_store("int4", 4096, 4096, 128, "cpu", layout=BLOCKS16)
    assert wgmma_supports(st, TileConfig(256, 128, 128, 1, 8, 3, stream_k=1, hybrid=True))
    assert not wgmma_supports(st, TileConfig(256, 128, 128, 1, 8, 3, hybrid=True))
    assert not any(c.hybrid for c in wgmma_configs(128)) and any(c.hybrid for c in wgmma_configs(256))
    assert TileConfig(256, 128, 128, 1, 8, 3, stream_k=1, hybrid=True).key().endswith("z1h")
    assert "hybrid" not in TileConfig(256, 128, 128, 1, 8, 3, stream_k=1).to_dict()  # old maps' candidate names


def test_unsupported_stores_are_refused_with_a_reason():
    st = random_store("int4", 128, 256, 32, "cpu")  # groups of 32 columns: a 64-column tile would straddle them
    cfg = wgmma_configs(128)[0]
    assert not wgmma_supports(st, cfg)
    with pytest.raises(ValueError, match="w4a16_wgmma cannot run"):
        w4a16_wgmma(torch.randn(4, 256, dtype=torch.bfloat16), st, cfg)
    assert not wgmma_supports(random_store("int4", 128, 256, 128, "cpu"), TileConfig(64, 128, 64, 1, 4, 4))


def test_weight_descriptors_are_built_once_per_store_and_follow_moved_tensors():
    from gearshift.kernels.w4a16_wgmma import _weight_descriptor
    from gearshift.kernels.w4a8_wgmma import group_descriptors

    st = random_store("int4", 256, 1024, 128, "cpu", layout=BLOCKS16)
    d = _weight_descriptor(st, 64, 128)
    assert _weight_descriptor(st, 64, 128) is d and _weight_descriptor(st, 128, 128) is not d
    g = group_descriptors(st, 64)
    assert group_descriptors(st, 64) is g
    st.qweight = st.qweight.clone()  # the tensors moved (as Module.to does): new descriptors
    d2 = _weight_descriptor(st, 64, 128)
    assert d2 is not d and d2.base.data_ptr() == st.qweight.data_ptr()
    assert group_descriptors(st, 64) is not g
    other = random_store("int4", 256, 1024, 128, "cpu", layout=BLOCKS16)
    assert _weight_descriptor(other, 64, 128).base.data_ptr() == other.qweight.data_ptr()


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize("tiles,kt,programs", [(192, 32, 264), (128, 32, 396), (448, 32, 132), (18, 8, 264),
                                               (200, 7, 132), (1, 4, 132), (896, 32, 132), (192, 32, 132),
                                               (264, 32, 132)])
def test_stream_k_schedule_covers_every_iteration_once(tiles, kt, programs, hybrid):
    """The kernel's stream-K index math (`stream_k_segment`, `_store_segment_sk`) replayed in
    Python: every (tile, K tile) iteration runs in exactly one program, a tile's partials come from
    the programs the finisher sums, no two partials share a workspace slot, and a hybrid's whole
    tiles leave no partials."""
    from gearshift.kernels.w4a16_wgmma import stream_k_plan, stream_k_runs

    per, grid, cmax, dpt = stream_k_plan(tiles, kt, programs, hybrid)
    base = grid * dpt
    assert grid <= programs and base + grid * per >= tiles * kt
    assert dpt == (kt * (tiles // programs) if hybrid else 0)
    seen, slots, parts, runs_of = [0] * (tiles * kt), set(), {}, {}
    for p in range(grid):
        for seg in (0, 1):
            if seg == 0:  # whole tiles: tile p of each full wave
                start, end, first, last, step = 0, tiles * kt, p, p + (dpt // kt - 1) * grid, grid
            else:
                start = grid * dpt + p * per
                end = min(start + per, tiles * kt)
                first = start // kt
                last, step = (end - 1) // kt if end > start else first - 1, 1
            for t in range(first, last + 1, step):
                k_lo, k_hi = max(start - t * kt, 0), min(end - t * kt, kt)
                for k in range(k_lo, k_hi):
                    seen[t * kt + k] += 1
                runs_of.setdefault(t, []).append((k_lo, k_hi))
                if (k_lo, k_hi) != (0, kt):
                    assert seg == 1
                    slot = p * 2 + (t != first)
                    assert slot not in slots
                    slots.add(slot)
                    parts.setdefault(t, []).append((k_lo, slot))
    assert seen == [1] * (tiles * kt)
    assert all(stream_k_runs(t, kt, per, base) == runs_of[t] for t in range(tiles))  # what the torch models slice
    for t, runs in parts.items():  # the finisher's slots, in its summation order, are these runs in K order
        c_first, c_last = (t * kt - base) // per, ((t + 1) * kt - 1 - base) // per
        assert c_last - c_first < cmax  # the finisher's unrolled sum covers them all
        slots_c = [c * 2 + ((base + c * per) // kt != t) for c in range(c_first, c_last + 1)]
        assert slots_c == [s for _, s in sorted(runs)]
    if hybrid and tiles >= programs:
        assert len(parts) <= tiles - (tiles // programs) * programs


_COMPILE = r"""
import torch
from triton.runtime.jit import mangle_type
from triton.experimental.gluon._runtime import GluonASTSource
from gearshift.dispatch.profiler import random_store
from gearshift.kernels import w4a16_wgmma as W

def gluon_ptx(bm, bn, warps, stages, a_smem, layout, f16, maxnreg=None, split_k=1, consumers=1, token_scales=False,
              stream_k=False, bk=64, packed=False, pdl=False, vec=False):
    x = torch.empty(bm, 4096, dtype=torch.float16 if f16 else torch.bfloat16)
    st = random_store("int4", 4096, 4096, 128, "cpu", layout=layout)
    xd, wd = W._descriptors(x, st, bm, bn, bk)
    sig = {"x_desc": mangle_type(xd), "w_desc": mangle_type(wd), "s_ptr": "*fp16", "mn_ptr": "*fp16",
           "y_ptr": "*fp16" if f16 else "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "xs_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
           "per": "i32", "dpt": "i32"}
    attrs = {(list(sig).index(n),): [["tt.divisibility", 16]] for n in ("s_ptr", "mn_ptr", "y_ptr", "N", "K")}
    cx = {"G": 128, "BN": bn, "STAGES": stages, "BLOCKS": layout == "blocks16", "F16": f16, "A_SMEM": a_smem,
          "SPLIT_K": split_k, "CONSUMERS": consumers, "TOKEN_SCALES": token_scales, "STREAM_K": stream_k, "CMAX": 3,
          "PACKED": packed, "PDL": pdl, "num_warps": warps, "VEC_STORE": vec}
    sig.update({name: "constexpr" for name in cx})
    names = list(sig)
    src = GluonASTSource(fn=W.w4a16_wgmma_kernel, signature=sig,
                         constexprs={(names.index(k),): v for k, v in cx.items()}, attrs=attrs)
    opts = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]

out["reg_rows_bf16"] = gluon_ptx(128, 64, 4, 4, False, "rows", False, 128, 2)
out["smem_blocks16_bf16"] = gluon_ptx(256, 128, 8, 4, True, "blocks16", False)
out["smem_rows_fp16"] = gluon_ptx(64, 64, 4, 6, True, "rows", True, token_scales=True)
out["two_consumers_blocks16_bf16"] = gluon_ptx(256, 128, 4, 4, False, "blocks16", False, 168, 1, 2)
out["stream_k_two_consumers"] = gluon_ptx(256, 128, 4, 3, False, "blocks16", False, 168, 1, 2, stream_k=True, bk=128)
out["stream_k_codes_fp16"] = gluon_ptx(128, 64, 4, 3, False, "rows", True, 128, token_scales=True, stream_k=True,
                                       bk=128)
out["packed_two_consumers_bf16"] = gluon_ptx(256, 128, 4, 3, False, "blocks16", False, 168, 1, 2, bk=128, packed=True)
out["packed_stream_k_fp16"] = gluon_ptx(128, 64, 4, 3, False, "rows", True, 128, stream_k=True, bk=128, packed=True)
out["pdl_two_consumers"] = gluon_ptx(256, 128, 4, 3, False, "blocks16", False, 168, 1, 2, bk=128, pdl=True)
out["pdl_stream_k"] = gluon_ptx(256, 128, 4, 3, False, "blocks16", False, 168, 1, 2, bk=128, stream_k=True, pdl=True)
out["vec_two_consumers_bf16"] = gluon_ptx(256, 128, 4, 3, False, "blocks16", False, 168, 1, 2, bk=128, vec=True)
out["vec_stream_k_codes_fp16"] = gluon_ptx(128, 64, 4, 3, False, "rows", True, 128, token_scales=True, stream_k=True,
                                           bk=128, vec=True)
"""


@pytest.fixture(scope="module")
def gluon_ptx(compile_sm90):
    return compile_sm90(_COMPILE)


def _acc_defined_in_flight(ptx: str) -> list[str]:
    """Non-wgmma instructions that write a wgmma accumulator register between the first
    wgmma.mma_async and the last `wgmma.wait_group 0` (PTX order). ptxas 12.8 serializes every
    wgmma of a kernel that has one (warning C7515)."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    mma = [i for i, ln in enumerate(lines) if ln.startswith("wgmma.mma_async")]
    last_wait = max(i for i, ln in enumerate(lines) if ln.startswith("wgmma.wait_group.sync.aligned 0"))
    acc = set().union(*(re.findall(r"%r\d+", lines[i].split("}")[0]) for i in mma))
    bad = []
    for ln in lines[mma[0]:last_wait]:
        m = re.match(r"(?:@!?%p\d+\s+)?[a-z][\w.]*\s+(%r\d+)\b", ln)
        if m and not ln.startswith("wgmma") and m.group(1) in acc:
            bad.append(ln)
    return bad


@pytest.mark.parametrize("name", ["smem_blocks16_bf16", "smem_rows_fp16"])
def test_a_smem_wgmmas_can_pipeline(gluon_ptx, name):
    """A through shared memory keeps one wgmma in flight; a loop that may run zero times zeroed the
    accumulator on its skip path inside that window, and ptxas then serialized all wgmmas (stop 29:
    the first tile is peeled off the loop). Triton 3.6 (the GPU machine's) emitted that zeroing and
    this test fails on the old loop there; Triton 3.9 does not emit it either way."""
    assert _acc_defined_in_flight(gluon_ptx[name]) == []


@pytest.mark.parametrize("name", ["reg_rows_bf16", "smem_blocks16_bf16", "smem_rows_fp16",
                                  "two_consumers_blocks16_bf16", "stream_k_two_consumers", "stream_k_codes_fp16",
                                  "packed_two_consumers_bf16", "packed_stream_k_fp16", "pdl_two_consumers",
                                  "pdl_stream_k", "vec_two_consumers_bf16", "vec_stream_k_codes_fp16"])
def test_compiles_for_sm90_with_tma_and_wgmma(gluon_ptx, name):
    p = gluon_ptx[name]
    assert "wgmma.mma_async" in p and "cp.async.bulk.tensor" in p and "mbarrier" in p
    assert "setmaxnreg" in p  # the load warp and the MMA warps run with their own register budgets
    # the byte -> weight conversion is the mantissa trick (no integer-to-float cvt in the loop)
    assert "cvt.rn.f32.u32" not in p and "cvt.rn.f32.s32" not in p
    packed = name.startswith("packed")  # one packed FMA per byte instead of two fp32 FMAs and a convert
    op = "bf16x2" if name.endswith("bf16") else "f16x2"
    assert (f"fma.rn.{op}" in p and f"sub.rn.{op}" in p) == packed and ("0x000F0000, 0x43000000" in p) != packed
    assert ("griddepcontrol.wait" in p and "griddepcontrol.launch_dependents" in p) == name.startswith("pdl")
    if name == "pdl_two_consumers":  # the first ring's weights (3-d blocks16 boxes) go out before the wait,
        # every activation tile (2-d) after it
        head, tail = p.split("griddepcontrol.wait", 1)
        assert "cp.async.bulk.tensor.3d" in head and "cp.async.bulk.tensor.2d" not in head
        assert "cp.async.bulk.tensor.2d" in tail
    # the finished tile: 16-byte stores of 8 weight rows (`store_rows`), else 2-byte stores from the
    # wgmma layout
    stores = set(re.findall(r"st\.global(?:\.v\d)?\.b\d+", p))
    assert ("st.global.v4.b32" in stores) == name.startswith("vec"), stores
    if name == "reg_rows_bf16" or "stream_k" in name:  # partials meet behind an acq_rel counter
        assert "atom.global.gpu.acq_rel.add" in p
    else:
        assert "atom." not in p



@needs_hopper
@pytest.mark.parametrize("layout", [ROWS, BLOCKS16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_matches_its_torch_model(layout, dtype):
    torch.manual_seed(0)
    st = random_store("int4", 384, 1024, 128, "cuda", layout=layout)
    for m in (1, 64, 100, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        emu = w4a16_wgmma_emulate(x, st).float()
        for cfg in wgmma_configs(max(m, 64)):
            if not wgmma_supports(st, cfg):
                continue
            y = w4a16_wgmma(x, st, cfg)
            assert ((y.float() - emu).norm() / emu.norm()).item() < 1e-3, (m, cfg)
            if cfg.split_k > 1 or cfg.stream_k:  # the reductions sum in a fixed order: the same bits every run
                assert torch.equal(y, w4a16_wgmma(x, st, cfg)), (m, cfg)


def test_activations_are_padded_to_whole_token_tiles_only_where_many_rows_are_absent(monkeypatch):
    """`tma_rows`: where 3/8 or more of the last token tile's TMA box lies past x (a quarter where it is the only
    tile), x gets zero rows up to the tile (stop 71: such boxes read slowly); with fewer rows absent, or
    PAD_ABSENT_EIGHTHS -1, x goes as it is (x's storage ends at x here: `test_pad_rows.py` has the room views)."""
    x = torch.randn(33, 64)
    p = tma_rows(x, 64)
    assert p.shape == (64, 64) and torch.equal(p[:33], x) and not p[33:].any()
    for m, bm, rows in ((47, 64, 64), (129, 256, 256), (400, 256, 512), (80, 128, 128)):  # 17/64 of the only
        assert tma_rows(torch.randn(m, 64), bm).shape == (rows, 64)  # tile, 127/256, 112/256 of the second, 48/128
    for m, bm in ((49, 64), (200, 256), (64, 64), (700, 256), (100, 128)):  # 15/64, 56/256, 0, 68/256 of the
        assert tma_rows(torch.randn(m, 64), bm).shape == (m, 64)  # third, 28/128
    big = torch.randn(1024, 64)
    assert tma_rows(big[:49], 64).data_ptr() == big.data_ptr()  # room in the storage: taken, whatever the rule
    monkeypatch.setattr(W16, "PAD_ABSENT_EIGHTHS", -1)
    assert tma_rows(x, 64) is x


@needs_hopper
@pytest.mark.parametrize("m", [33, 40, 47, 65, 129])
def test_padded_token_tiles_give_the_same_bits(m, monkeypatch):
    """x padded to whole token tiles (`tma_rows`), read from NaN rows past it in its own storage, or read with the
    rows past M out of bounds: the same output."""
    from gearshift.kernels import switches

    torch.manual_seed(0)
    st = random_store("int4", 384, 1024, 128, "cuda", layout=BLOCKS16)
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    room = torch.full((512, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
    room[:m] = x
    for cfg in wgmma_configs(m):
        if not wgmma_supports(st, cfg):
            continue
        monkeypatch.setattr(W16, "PAD_ABSENT_EIGHTHS", 0)  # every partial tile padded
        monkeypatch.setattr(W16, "PAD_ONE_TILE_EIGHTHS", 0)
        y = w4a16_wgmma(x, st, cfg)
        assert torch.equal(y, w4a16_wgmma(room[:m], st, cfg)), (m, cfg)
        monkeypatch.setattr(W16, "PAD_ABSENT_EIGHTHS", -1)
        monkeypatch.setitem(switches._FUSED, "tile_room", False)
        assert torch.equal(y, w4a16_wgmma(x, st, cfg)), (m, cfg)
        monkeypatch.setitem(switches._FUSED, "tile_room", True)


@needs_hopper
@pytest.mark.parametrize("m", [300, 512])
def test_stream_k_runs_that_cross_tiles_match_the_model(m):
    """Runs longer than a tile's K (200 tiles of 7 K tiles on 132 SMs) cross from one output tile
    into the next, and partial tiles meet in the fixed-order sum: close to the model, same bits
    every run."""
    torch.manual_seed(0)
    st = random_store("int4", 12800, 896, 128, "cuda", layout=BLOCKS16)
    x = torch.randn(m, 896, device="cuda", dtype=torch.bfloat16)
    emu = w4a16_wgmma_emulate(x, st).float()
    cfgs = [c for c in wgmma_configs(m) if c.stream_k and wgmma_supports(st, c)]
    assert cfgs
    for cfg in cfgs:
        y = w4a16_wgmma(x, st, cfg)
        assert ((y.float() - emu).norm() / emu.norm()).item() < 1e-3, cfg
        assert torch.equal(y, w4a16_wgmma(x, st, cfg)), cfg


def test_packed_dequantization_only_where_it_gives_the_same_bits():
    """The packed path rounds q * s + m once in x's dtype; the fp32 path computes it exactly in fp32
    and rounds once, so they agree where s and m are x-dtype values and m - 128 s is exact."""
    import gearshift.kernels.w4a16_wgmma as W
    from gearshift.quant.int4 import quantize_int4, quantize_int4_progressive

    torch.manual_seed(0)
    w = torch.randn(64, 512)
    plain, prog = quantize_int4(w, 128), quantize_int4_progressive(w, 128)
    assert W.packed_dequant(plain, torch.float16) and not W.packed_dequant(plain, torch.bfloat16)
    assert W.packed_dequant(prog, torch.bfloat16) and W.packed_dequant(prog, torch.float16)
    bf16_values = quantize_int4(w, 128, values=torch.bfloat16)  # what the loader writes for a bf16 model
    assert W.packed_dequant(bf16_values, torch.bfloat16, W.PACKED_MAX_TOKENS)
    assert not W.packed_dequant(bf16_values, torch.bfloat16, W.PACKED_MAX_TOKENS + 1)  # the fp32 path beyond
    tiny = Int4Weight(plain.qweight, plain.scales, plain.scales * 2.0 ** -10, 128)  # m - 128 s inexact in fp32
    assert not W.packed_exact(tiny.scales, tiny.mins, torch.float16)
    zero = Int4Weight(plain.qweight, plain.scales, torch.zeros_like(plain.mins), 128)
    assert W.packed_exact(zero.scales, zero.mins, torch.float16)
    plain.mins.mul_(2.0 ** -10)  # changed in place: checked again
    assert not W.packed_dequant(plain, torch.float16)
    for mode, want in (("never", False), ("always", True)):
        W.PACKED_DEQUANT = mode
        try:
            assert W.packed_dequant(plain, torch.bfloat16) is want
        finally:
            W.PACKED_DEQUANT = "exact"


@needs_hopper
@pytest.mark.parametrize("fmt,dtype", [("int4p", torch.bfloat16), ("int4", torch.float16), ("int4", torch.bfloat16)])
def test_packed_dequantization_gives_the_fp32_paths_bits(fmt, dtype):
    """(Plain int4 under bf16 since stop 46: random stores, like the loader's, hold bf16-valued scales.)"""
    import gearshift.kernels.w4a16_wgmma as W

    torch.manual_seed(0)
    st = random_store(fmt, 512, 1024, 128, "cuda", layout=BLOCKS16)
    assert W.packed_dequant(st, dtype)
    for m in (64, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        for cfg in [c for c in wgmma_configs(m) if wgmma_supports(st, c) and not c.a_smem][:6]:
            y = w4a16_wgmma(x, st, cfg)
            W.PACKED_DEQUANT = "never"
            try:
                assert torch.equal(y, w4a16_wgmma(x, st, cfg)), (m, cfg)
            finally:
                W.PACKED_DEQUANT = "exact"


@needs_hopper
def test_pdl_launches_give_the_same_bits_in_a_dependent_chain():
    """With PDL a launch may start while its predecessor still runs and must not read the
    activations before griddepcontrol.wait: a chain whose every launch reads the previous one's
    output gives the same bits with and without PDL, eager and replayed from a CUDA graph."""
    import gearshift.kernels.w4a16_wgmma as W
    from gearshift.kernels.pdl import pdl_enabled

    torch.manual_seed(0)
    s1 = random_store("int4", 2048, 2048, 128, "cuda", layout=BLOCKS16)
    s2 = random_store("int4", 2048, 2048, 128, "cuda", layout=BLOCKS16)
    x = 0.1 * torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    assert pdl_enabled(x)
    cfgs = (TileConfig(256, 128, 128, 1, 8, 3), TileConfig(128, 64, 128, 1, 4, 3, maxnreg=128, stream_k=2),
            TileConfig(128, 128, 128, 2, 8, 4))

    def chain():
        y = x
        for c in cfgs:
            y = W.w4a16_wgmma(W.w4a16_wgmma(y, s1, c), s2, c)
        return y

    W.WGMMA_PDL = False
    try:
        want = chain()
    finally:
        W.WGMMA_PDL = True
    assert torch.isfinite(want).all()
    assert torch.equal(chain(), want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = chain()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_quantized_modes_are_served_by_the_same_kernel():
    from gearshift.dispatch.strategies import STRATEGIES, strategies_for
    from gearshift.quant.activations import ActQuantSpec

    for mode in ("w4a8", "w4a4", "w4a8fp8"):
        assert "w4a8_wgmma" in {s.name for s in strategies_for(mode)}
    st = random_store("int4", 128, 256, 128, "cpu")
    cfg = wgmma_configs(128)[0]
    sup = STRATEGIES["w4a8_wgmma"].supports
    assert sup(st, ActQuantSpec("int8"), cfg) and sup(st, ActQuantSpec("fp8"), cfg)
    assert not sup(st, None, cfg) and not sup(st, ActQuantSpec("int8", group_size=32), cfg)


@needs_hopper
@pytest.mark.parametrize("act_dtype", ["int8", "int4", "fp8"])
def test_quantized_activations_match_the_reference(act_dtype):
    from gearshift.kernels.w4a16_wgmma import w4a8_wgmma
    from gearshift.quant.activations import ActQuantSpec

    torch.manual_seed(0)
    act = ActQuantSpec(act_dtype)
    st = random_store("int4", 256, 1024, 128, "cuda", layout=BLOCKS16)
    bound = 3e-2 if act_dtype == "int4" else 5e-3  # W4A4: the quantizers' rounding (docs/kernels.md bounds)
    for m in (64, 200):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        ref = linear_reference(x.float(), st, act)
        for cfg in wgmma_configs(m)[:4]:
            y = w4a8_wgmma(x, st, act, cfg).float()
            assert ((y - ref).norm() / ref.norm()).item() < bound, (act_dtype, m, cfg)
