"""The register-fragment W4A16/W4A8 tensor-core kernel (kernels/int4_mma_gemv.py).

Its PTX cannot run in the Triton interpreter, so on CPU a torch model of the fragment plan (lanes,
nibble pairs, B-fragment permutation, the +128 offset folded into the min term, the 1.0 rows that
yield sum(x)) is checked against the reference linear; on a GPU the kernel itself is checked."""

import dataclasses

import pytest
import torch

from gearshift.kernels.config import TileConfig
from gearshift.kernels.int4_mma_gemv import (BLOCK_COLS, CONSTRAINTS, HAS_TRITON, MMA_ASM, OFFSET, mma_config,
                                             mma_gemv_supports)
from gearshift.kernels.reference import linear_reference
from gearshift.quant.activations import ActQuantSpec, quantize_activations
from gearshift.quant.int4 import quantize_int4

# nibble pairs per MMA: (low half, high half) of a0 and a2; MMA 1 covers (0,4),(1,5), MMA 2 (2,6),(3,7)
PAIRS = (((0, 4), (1, 5)), ((2, 6), (3, 7)))


def emulate(x: torch.Tensor, store) -> torch.Tensor:
    """fp32 torch model of one warp's math per 128-column block, rows in tiles of 8 (one-row plan)."""
    q = store.unpacked().long()  # [N, K]
    n, k = q.shape
    m = x.shape[0]
    y = torch.zeros(m, n, dtype=torch.float64)
    for c0 in range(0, k, BLOCK_COLS):
        g = c0 // store.group_size
        for r0 in range(0, n, 8):
            rows = torch.arange(r0, min(r0 + 8, n))
            a = torch.ones(16, 16 * 8, dtype=torch.float64)  # A: 16 rows x (8 MMAs x 16 k-slots)
            b = torch.zeros(16 * 8, 8, dtype=torch.float64)  # B: k-slots x 8 token columns
            slot = 0
            for j in range(4):  # word j of every lane
                for pairs in PAIRS:
                    for lane_t in range(4):
                        word = c0 // 8 + 4 * lane_t + j
                        for half, (lo, hi) in enumerate(pairs):
                            ks = slot + 2 * lane_t + 8 * half  # a0 -> k 2t..2t+1, a2 -> k 2t+8..2t+9
                            for e, nib in enumerate((lo, hi)):
                                col = 8 * word + nib
                                a[: len(rows), ks + e] = (OFFSET["bf16"] + q[rows, col]).double()
                                for tok in range(8):
                                    b[ks + e, tok] = x[min(tok, m - 1), col].double()
                    slot += 16
            d = a @ b  # rows 0..7: (128 + q) . x ; rows 8..15: sum(x)
            s = store.scales[rows, g].double()[:, None]
            mn = store.mins[rows, g].double()[:, None]
            part = s * d[: len(rows)] + (mn - OFFSET["bf16"] * s) * d[8:9]
            y[:, rows] += part[:, :m].T
    return y


@pytest.mark.parametrize("n,k,group,m", [(16, 256, 128, 1), (24, 384, 128, 3), (8, 512, 256, 8)])
def test_fragment_plan_matches_reference(n, k, group, m):
    g = torch.Generator().manual_seed(n * k + m)
    store = quantize_int4(torch.randn(n, k, generator=g), group)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).float()
    ref = linear_reference(x, store, None).double()
    assert ((emulate(x, store) - ref).norm() / ref.norm()).item() < 1e-6  # fp32 reference rounding only


def test_ptx_matches_the_plan():
    """The PTX string builds exactly the pairs the CPU model assumes."""
    asm = MMA_ASM[("bf16", 8, 1)]
    assert asm.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 8
    for shift in (4, 8, 12):
        assert f"shr.b32 t, $4, {shift};" in asm
    for a, b in (("x0", "x2"), ("x1", "x3")):  # word 0: (x0, x4), (x1, x5) then (x2, x6), (x3, x7)
        assert f"prmt.b32 b0, {a}, {b}, 0x5410;" in asm and f"prmt.b32 b1, {a}, {b}, 0x7632;" in asm
    assert MMA_ASM[("bf16", 16, 1)].count("mma.sync") == 16 and "0x64006400" in MMA_ASM[("f16", 8, 1)]
    two_tiles = MMA_ASM[("bf16", 16, 2)]  # 9..16 tokens: the second tile reuses every A fragment
    assert two_tiles.count("mma.sync") == 32 and two_tiles.count("lop3.b32 a0") == 8
    assert "[$21+0]" in two_tiles and "[$20+48]" in two_tiles  # 12 outputs, 8 words, then the 2 pointers


def test_ptx_32_rows_per_warp():
    """32 rows per warp: two A fragments (rows g/g+8 and g+16/g+24) share every B fragment and
    the token-sum MMA, so the block's activation loads are those of 16 rows."""
    for tiles in (1, 2):
        asm, asm16 = MMA_ASM[("bf16", 32, tiles)], MMA_ASM[("bf16", 16, tiles)]
        assert asm.count("mma.sync") == 24 * tiles and asm.count("ld.global") == asm16.count("ld.global") == 4 * tiles
        n_out = 10 * tiles
        assert f"lop3.b32 c0, ${n_out + 8}, 0x000F000F, mg, 0xEA;" in asm  # row c's first word follows rows a and b
        assert f"[${n_out + 16}+0]" in asm and f"[${n_out + 16 + tiles - 1}+48]" in asm
        assert "{c0, c1, c2, c3}" in asm
    assert CONSTRAINTS[(32, 2)].count("=r") == 20 and CONSTRAINTS[(32, 2)].count(",r") == 16


def test_supports_and_config():
    st = quantize_int4(torch.randn(64, 512), 128)
    assert mma_gemv_supports(st, TileConfig(16, 0, 128, 4, 4, 1), 16)
    assert not mma_gemv_supports(st, TileConfig(16, 0, 128, 8, 4, 1))  # 512 columns do not split 8 ways
    assert not mma_gemv_supports(st, TileConfig(16, 0, 128, 1, 4, 1), 65)
    assert not mma_gemv_supports(st, TileConfig(16, 0, 128, 1, 4, 2), 1)  # the bulk ring is a patch now
    assert not mma_gemv_supports(quantize_int4(torch.randn(64, 512), 64), TileConfig(16, 0, 128, 1, 4, 1), 1,
                                 torch.int8)  # 16-bit inputs run groups of 32 / 64 (test_dequant_supports)
    assert not mma_gemv_supports(quantize_int4(torch.randn(64, 512), 16), TileConfig(16, 0, 128, 1, 4, 1))
    assert [(c.bm, c.kwarps, c.prefetch) for c in (mma_config(28672, 4096, 16), mma_config(4096, 14336, 9))] == \
        [(32, 4, True)] * 2
    assert (mma_config(64, 512, 16).bm, mma_config(64, 512, 16).split_k) == (16, 2)  # 4 blocks: no 4 x 2-block slices
    one = (mma_config(4096, 4096), mma_config(28672, 4096), mma_config(896, 896), mma_config(64, 256))
    assert [(c.split_k, c.warps, c.kwarps) for c in one] == [(1, 8, 8), (1, 8, 4), (1, 4, 1), (1, 4, 1)]
    assert all(mma_gemv_supports(quantize_int4(torch.randn(64, 1024), 128), mma_config(64, 1024, m), m)
               for m in (1, 8, 9, 16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,split,prefetch", [(8, 1, False), (16, 2, False), (16, 4, True), (8, 2, True),
                                                (32, 1, False), (32, 2, True)])
def test_gpu_kernel_matches_reference(rows, split, prefetch):
    from gearshift.kernels.int4_mma_gemv import mma_gemv, mma_gemv_quantized

    torch.manual_seed(rows + split)
    store = quantize_int4(torch.randn(200, 1024), 128).cuda()
    cfg = TileConfig(rows, 0, 128, split, 2, 1, prefetch=prefetch)
    for m in (1, 2, 5, 8, 9, 16):
        for dt in (torch.bfloat16, torch.float16):
            x = torch.randn(m, 1024, device="cuda", dtype=dt)
            y = mma_gemv(x, store, cfg)
            ref = linear_reference(x.float(), store, None)
            assert ((y.float() - ref).norm() / ref.norm()).item() < 3e-3, (m, dt)
            assert torch.equal(mma_gemv(x, store, cfg), y)  # fixed split-K order: reproducible
        act = ActQuantSpec("int8")
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        y = mma_gemv_quantized(x, store, act, cfg)
        ref = linear_reference(x.float(), store, act)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 3e-3
        codes, scales = quantize_activations(x.float(), act)
        assert codes.abs().max() <= 127 and scales.shape[0] == m


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,split,warps,kwarps,prefetch,layout", [
    (16, 1, 2, 2, False, "rows"), (16, 2, 4, 2, False, "rows"), (8, 1, 4, 4, True, "rows"),
    (16, 1, 8, 8, False, "blocks16"), (16, 1, 8, 4, False, "blocks16"), (16, 2, 8, 4, True, "blocks16"),
    (32, 1, 4, 4, False, "blocks16"), (32, 1, 8, 4, True, "blocks16"), (32, 1, 2, 1, False, "blocks16"),
    (32, 2, 4, 2, False, "rows")])
def test_gpu_k_warps_match_reference(rows, split, warps, kwarps, prefetch, layout):
    """The K split inside the CTA (kwarps): every row group's warps summed in shared memory."""
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    torch.manual_seed(warps + kwarps)
    store = quantize_int4(torch.randn(208, 2048), 128).cuda().to_layout(layout)  # 208: a ragged 32-row tile
    cfg = TileConfig(rows, 0, 128, split, warps, 1, prefetch=prefetch, kwarps=kwarps)
    assert mma_gemv_supports(store, cfg, 16)
    for m in (1, 3, 8, 9, 16):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        y = mma_gemv(x, store, cfg)
        ref = linear_reference(x.float(), store, None)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 3e-3, m
        assert torch.equal(mma_gemv(x, store, cfg), y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,warps,kwarps,xshare,dtype", [
    (16, 8, 8, False, torch.bfloat16), (16, 16, 16, False, torch.bfloat16), (8, 8, 8, False, torch.bfloat16),
    (16, 2, 2, False, torch.bfloat16), (32, 8, 4, False, torch.bfloat16), (32, 4, 2, True, torch.bfloat16),
    (16, 16, 8, True, torch.bfloat16), (16, 8, 4, False, torch.int8), (32, 4, 2, False, torch.int8)])
def test_gpu_shared_memory_k_sum_matches_the_reduce_epilogue(rows, warps, kwarps, xshare, dtype):
    """TileConfig.ksum: the K slices summed by one thread per output in slice order, through the
    kernel's own shared memory, against stop 22's tl.reduce epilogue: the same sums up to fp32
    rounding order (two slices: the same bits), at every token count (9..16: the passes over both
    token tiles; 17..64: token groups), and reproducible."""
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    torch.manual_seed(rows + warps + kwarps)
    store = quantize_int4(torch.randn(208, 2048), 128).cuda().to_layout("blocks16")
    cfg = TileConfig(rows, 0, 128, 1, warps, 1, kwarps=kwarps, xshare=xshare)
    ks = dataclasses.replace(cfg, ksum=True)
    tested = 0
    for m in (1, 2, 5, 8, 9, 12, 16, 40):
        if not mma_gemv_supports(store, cfg, m, dtype):
            continue
        assert mma_gemv_supports(store, ks, m, dtype), m
        tested += 1
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        if dtype == torch.int8:
            x = x.mul(40).round().clamp(-127, 127).to(torch.int8)
            args = dict(token_scales=torch.rand(m, device="cuda") + 0.5, out_dtype=torch.bfloat16)
        else:
            args = {}
        y = mma_gemv(x, store, ks, **args)
        assert torch.equal(mma_gemv(x, store, ks, **args), y)
        ref = mma_gemv(x, store, cfg, **args)
        if kwarps == 2:
            assert torch.equal(y, ref), m
        else:
            assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-3, m
    assert tested >= 4


def test_shared_memory_k_sum_needs_k_warps_no_split_and_room():
    """The K-sum buffer (static shared memory, 33 words per warp and value) with any xshare buffers
    stays within 48 KB; the tile needs K slices in the CTA and no split-K."""
    from gearshift.kernels import int4_mma_gemv as mg

    store = quantize_int4(torch.randn(256, 4096), 128).to_layout("blocks16")
    assert mg.ksum_bytes(16, 1, 8) == 4 * 33 * 4 * 8
    assert mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 8, 1, kwarps=8, ksum=True), 1)
    assert TileConfig(16, 0, 128, 1, 8, 1, kwarps=8, ksum=True).key().endswith("q8K")
    assert not mma_gemv_supports(store, TileConfig(16, 0, 128, 2, 8, 1, kwarps=4, ksum=True), 1)  # split-K
    assert not mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 4, 1, ksum=True), 1)  # nothing to sum
    big = TileConfig(32, 0, 128, 1, 8, 1, kwarps=4, xshare=True, ksum=True)  # 16.5 KB + 32 KB of xshare buffers
    assert mma_gemv_supports(store, big, 8) and not mma_gemv_supports(store, big, 16)
    assert mg.KSUM_LOAD_ASM[(4, 4)].count("ld.shared.f32") == 4 and mg.KSUM_LOAD_ASM[(4, 4)].count("add.rn") == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,split,warps,kwarps,layout", [
    (16, 1, 8, 4, "blocks16"), (16, 2, 4, 2, "rows"), (32, 1, 4, 4, "blocks16"), (8, 1, 4, 1, "blocks16"),
    (32, 1, 4, 1, "rows")])
def test_gpu_l2_prefetch_is_bit_identical(rows, split, warps, kwarps, layout, monkeypatch):
    """The rolling L2 prefetch (`L2_AHEAD`, stop 31) and the whole-slice one only touch L2: the same
    bits as without, including at the ends of short and long K slices."""
    from gearshift.kernels import int4_mma_gemv as mg
    from gearshift.kernels import pdl

    torch.manual_seed(rows + warps)
    store = quantize_int4(torch.randn(208, 4096), 128).cuda().to_layout(layout)
    cfg = TileConfig(rows, 0, 128, split, warps, 1, kwarps=kwarps)
    monkeypatch.setattr(pdl, "L2_PREFETCH", True)  # the whole-slice switch, GEARSHIFT_L2_PREFETCH=1
    for m in (1, 3, 9):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        monkeypatch.setattr(mg, "L2_AHEAD", 0)
        ref = mg.mma_gemv(x, store, cfg, l2_prefetch=False)
        assert pdl.l2_prefetch_enabled(ref) and torch.equal(mg.mma_gemv(x, store, cfg, l2_prefetch=True), ref)
        for ahead in (1, 3, 40):
            monkeypatch.setattr(mg, "L2_AHEAD", ahead)
            assert torch.equal(mg.mma_gemv(x, store, cfg, l2_prefetch=False), ref), (m, ahead)


def test_l2_ahead_compiles_to_bulk_prefetches_in_the_loop(compile_sm90):
    """L2_AHEAD: one bulk L2 prefetch per 16-row group before the loop and one per step inside it
    (blocks16), one per row (rows); the MMAs are unchanged."""
    out = compile_sm90(r"""
from gearshift.kernels import int4_mma_gemv as mg
sig = {"x_ptr": "*bf16", "qw_ptr": "*u8", "s_ptr": "*fp16", "mn_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
       "cnt_ptr": "*i32", "xs_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"}
for rows, tiled, ahead in ((16, True, 0), (16, True, 2), (32, True, 2), (16, False, 2)):
    ce = dict(G=128, WARPS=8, SPLIT_K=1, ASM=mg.MMA_ASM[("bf16", rows, 1)], CONSTRAINTS=mg.CONSTRAINTS[(rows, 1)],
              ROWS=rows, TILES=1, TG=1, ZPID=True, OFFSET=128.0, U=1, HAS_XS=False, PDL=True, L2_PREFETCH=False,
              LOAD=mg.WEIGHT_LOADS["plain"], SHINT=0, TILED=tiled, TRIGGER=1, TAIL=0, KWARPS=4, L2_AHEAD=ahead)
    out[f"{rows}{tiled}{ahead}"] = ptx(mg._mma_gemv_kernel, sig, ce, num_warps=8, ints16=("K",))
""")
    count = {k: p.count("cp.async.bulk.prefetch.L2") for k, p in out.items()}
    assert count == {"16True0": 0, "16True2": 2, "32True2": 4, "16False2": 4}
    for key, p in out.items():
        assert p.count("mma.sync") == (24 if key.startswith("32") else 16)
        if count[key]:  # the loop's prefetch sits after the wait, the first one before it
            wait = p.index("griddepcontrol.wait")
            assert p.index("cp.async.bulk.prefetch.L2") < wait < p.rindex("cp.async.bulk.prefetch.L2")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,split,warps,kwarps,prefetch,preload,maxnreg", [
    (16, 1, 8, 4, False, False, 0), (16, 1, 8, 4, False, False, 64), (16, 1, 8, 8, True, False, 0),
    (16, 1, 8, 8, False, True, 80), (32, 1, 4, 4, False, False, 0), (8, 1, 4, 1, False, False, 0),
    (16, 2, 4, 2, False, False, 0)])
def test_gpu_fused_lop3_paired_loop_and_register_cap_give_the_same_bits(rows, split, warps, kwarps, prefetch, preload,
                                                                         maxnreg, monkeypatch):
    """Stop 33's instruction cuts (one LOP3 per nibble pair, two blocks per loop trip) and a register
    cap change no result bit: against the AND + OR fragments with the one-block loop, uncapped."""
    from gearshift.kernels import int4_mma_gemv as mg

    torch.manual_seed(rows + warps + maxnreg)
    store = quantize_int4(torch.randn(208, 2048), 128).cuda().to_layout("blocks16")
    cfg = TileConfig(rows, 0, 128, split, warps, 1, prefetch=prefetch, kwarps=kwarps, preload=preload)
    capped = dataclasses.replace(cfg, maxnreg=maxnreg, pairs=not (prefetch or preload))
    assert mma_gemv_supports(store, capped, 16)
    for m in (1, 3, 8, 9, 16):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        monkeypatch.setattr(mg, "FUSED_LOP3", False)
        ref = mg.mma_gemv(x, store, cfg)
        monkeypatch.setattr(mg, "FUSED_LOP3", True)
        assert torch.equal(mg.mma_gemv(x, store, cfg), ref), m
        assert torch.equal(mg.mma_gemv(x, store, capped), ref), m


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,split,warps,kwarps,loop", [
    (16, 1, 8, 4, ""), (16, 1, 8, 8, "U"), (16, 1, 8, 8, "L"), (32, 1, 4, 4, "T"), (8, 1, 4, 1, ""),
    (16, 2, 4, 2, ""), (16, 1, 16, 8, "X")])
def test_gpu_unsigned_group_index_gives_the_same_bits(rows, split, warps, kwarps, loop, monkeypatch):
    """The scale group of a block's words, divided unsigned (stop 70's `group_index` switch), reads the same
    scales as the signed division, on 16-bit inputs and int8 codes, in the stepped (U: 2 blocks a step), paired (T),
    preload (L) and xshare (X) loops, with groups of 64 (16-bit inputs, dequantized first), 128 and 256."""
    from gearshift.kernels import int4_mma_gemv as mg

    cfg = TileConfig(rows, 0, 128, split, warps, 1, kwarps=kwarps, prefetch=loop == "U", pairs=loop == "T",
                     preload=loop == "L", xshare=loop == "X")
    checked = 0
    for group in (64, 128, 256):
        torch.manual_seed(rows + warps + group)
        store = quantize_int4(torch.randn(208, 4096), group).cuda().to_layout("blocks16")
        for m in (1, 5, 9, 16):
            for int8 in (False, True):
                if not mma_gemv_supports(store, cfg, m, torch.int8 if int8 else torch.bfloat16):
                    continue
                if int8:
                    x = torch.randint(-127, 128, (m, 4096), device="cuda", dtype=torch.int8)
                    kw = {"token_scales": torch.rand(m, device="cuda") + 0.01, "out_dtype": torch.bfloat16}
                else:
                    x, kw = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16), {}
                monkeypatch.setattr(mg, "GROUP_SIGNED", 1)
                ref = mg.mma_gemv(x, store, cfg, **kw)
                monkeypatch.setattr(mg, "GROUP_SIGNED", 0)
                assert torch.equal(mg.mma_gemv(x, store, cfg, **kw), ref), (group, m, int8)
                checked += 1
    assert checked


def test_pairs_need_an_even_block_count_per_warp():
    store = quantize_int4(torch.randn(64, 768), 128)  # 6 blocks of 128 columns
    assert mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 2, 1, pairs=True), 1)  # 6 per warp
    assert not mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 2, 1, kwarps=2, pairs=True), 1)  # 3 per warp
    assert not mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 2, 1, prefetch=True, pairs=True), 1)
    assert not mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 2, 1, preload=True, pairs=True), 1)


def test_fragment_pairs_are_one_lop3_each():
    """Each nibble pair becomes bf16/fp16 with one LOP3 ((w & 0x000F000F) | magic, the magic in a
    register), not AND + OR; the switch's old form keeps both."""
    from gearshift.kernels import int4_mma_gemv as mg

    for (dt, rows, tiles), asm in mg.MMA_ASM.items():
        pairs = 4 * 4 * max(2, rows // 8)  # 4 words x 4 pairs per A register set (8 rows: a0 and a2 only)
        assert asm.count("lop3.b32") == pairs // (2 if rows == 8 else 1) and "and.b32" not in asm
        old = mg.MMA_ASM_ANDOR[(dt, rows, tiles)]
        assert old.count("and.b32") == asm.count("lop3.b32") and "lop3" not in old
        assert asm.count("mma.sync") == old.count("mma.sync")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,split,warps,kwarps,layout", [
    (16, 1, 8, 4, "blocks16"), (16, 1, 8, 8, "blocks16"), (16, 2, 4, 2, "rows"), (32, 1, 4, 4, "blocks16"),
    (8, 1, 4, 1, "rows")])
def test_gpu_preload_is_bit_identical(rows, split, warps, kwarps, layout):
    """TileConfig.preload (the warp's whole K slice loaded before the PDL wait) only moves loads:
    the same bits as the stepped loop, alone and in a PDL chain."""
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    torch.manual_seed(rows + warps)
    store = quantize_int4(torch.randn(208, 2048), 128).cuda().to_layout(layout)
    cfg = TileConfig(rows, 0, 128, split, warps, 1, kwarps=kwarps)
    pre = dataclasses.replace(cfg, preload=True)
    assert mma_gemv_supports(store, pre, 16)
    for m in (1, 2, 5, 8, 9, 16):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        for c in (cfg, pre):
            y = mma_gemv(x, store, c)
            z = mma_gemv(mma_gemv(x, store, c)[:, :128].repeat(1, 16), store, c)
            if c is cfg:
                ref, chain = y, z
        assert torch.equal(y, ref) and torch.equal(z, chain), m


def test_preload_supports():
    """Preload holds the whole slice in registers: at most 128 weight registers per lane, no 2-block steps."""
    store = quantize_int4(torch.randn(64, 4096), 128)
    assert mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 8, 1, kwarps=4, preload=True))  # 8 blocks x 8
    assert mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 4, 1, kwarps=2, preload=True))  # 16 x 8
    assert not mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 2, 1, kwarps=1, preload=True))  # 32 x 8
    assert not mma_gemv_supports(store, TileConfig(32, 0, 128, 1, 4, 1, kwarps=2, preload=True))  # 16 x 16
    assert not mma_gemv_supports(store, TileConfig(16, 0, 128, 1, 8, 1, prefetch=True, kwarps=4, preload=True))
    assert TileConfig(16, 0, 128, 1, 8, 1, kwarps=4, preload=True).key().endswith("L")
    assert "preload" not in TileConfig().to_dict()


def test_k_warps_compile_for_sm90(compile_sm90):
    """The in-CTA K split compiles for sm_90 (one reduction per token tile, no split-K atomics)."""
    out = compile_sm90(r"""
from gearshift.kernels import int4_mma_gemv as mg
sig = {"x_ptr": "*bf16", "qw_ptr": "*u8", "s_ptr": "*fp16", "mn_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
       "cnt_ptr": "*i32", "xs_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"}
for tiles in (1, 2):
    ce = dict(G=128, WARPS=8, SPLIT_K=1, ASM=mg.MMA_ASM[("bf16", 16, tiles)], CONSTRAINTS=mg.CONSTRAINTS[(16, tiles)],
              ROWS=16, TILES=tiles, TG=1, ZPID=True, OFFSET=128.0, U=1, HAS_XS=False, PDL=False, L2_PREFETCH=False,
              LOAD=mg.WEIGHT_LOADS["plain"], SHINT=0, TILED=True, TRIGGER=1, TAIL=0, KWARPS=4)
    out[str(tiles)] = ptx(mg._mma_gemv_kernel, sig, ce, num_warps=8, ints16=("K",))
""")
    for tiles, p in out.items():
        assert p.count("mma.sync") == 16 * int(tiles) and "atom" not in p


def test_32_rows_per_warp_compile_for_sm90(compile_sm90):
    """32 rows per warp compiles for sm_90 with one or two token tiles, in-CTA and global K splits."""
    out = compile_sm90(r"""
from gearshift.kernels import int4_mma_gemv as mg
sig = {"x_ptr": "*bf16", "qw_ptr": "*u8", "s_ptr": "*fp16", "mn_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
       "cnt_ptr": "*i32", "xs_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"}
for tiles, kw, sk, tiled in ((1, 4, 1, True), (2, 4, 1, True), (2, 1, 2, False)):
    ce = dict(G=128, WARPS=4, SPLIT_K=sk, ASM=mg.MMA_ASM[("bf16", 32, tiles)], CONSTRAINTS=mg.CONSTRAINTS[(32, tiles)],
              ROWS=32, TILES=tiles, TG=1, ZPID=True, OFFSET=128.0, U=1, HAS_XS=False, PDL=False, L2_PREFETCH=False,
              LOAD=mg.WEIGHT_LOADS["plain"], SHINT=0, TILED=tiled, TRIGGER=1, TAIL=0, KWARPS=kw)
    out[f"{tiles}{kw}{sk}"] = ptx(mg._mma_gemv_kernel, sig, ce, num_warps=4, ints16=("K",))
""")
    for key, p in out.items():
        tiles, split = int(key[0]), int(key[2])
        assert p.count("mma.sync") == 24 * tiles and ("atom" in p) == (split > 1)


def test_chained_accumulators_ptx():
    """The chains ablation keeps every MMA and folds the extra accumulator sets into the outputs."""
    from gearshift.kernels.int4_mma_gemv import _mma_asm

    one, two = _mma_asm("bf16", 0x4300, 16, 1), _mma_asm("bf16", 0x4300, 16, 1, chains=2)
    assert one.count("mma.sync") == two.count("mma.sync") == 16
    assert two.count("add.f32") == 8 and "add.f32 d0, d0, d4;" in two and "{d4, d5, d6, d7}" in two


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("ahead", [0, 1, 2, 4])
def test_x_ahead_only_moves_the_input_loads(shared, ahead):
    """The x_ahead ablation (step_ladder.py) emits the same instructions as the shipped block, with
    each word's input loads moved to `ahead` words before their first use; the default is the shipped text."""
    from gearshift.kernels.int4_mma_gemv import MMA_ASM, MMA_ASM_SHARED, _mma_asm

    base = (MMA_ASM_SHARED if shared else MMA_ASM)[("bf16", 32, 2)]
    assert _mma_asm("bf16", 0x4300, 32, 2, shared=shared) == base
    moved = _mma_asm("bf16", 0x4300, 32, 2, shared=shared, x_ahead=ahead).split("\n")
    assert sorted(moved) == sorted(base.split("\n"))
    for j in range(4):  # word j's loads (x registers 4j..4j+3 of each tile) come before word j's first PRMT
        load = max(i for i, line in enumerate(moved) if line.startswith("ld.") and f"{{x{4 * j}," in line)
        first_use = min(i for i, line in enumerate(moved) if line.startswith("prmt") and f" x{4 * j}," in line)
        assert load < first_use
        words_before = sum(1 for line in moved[:load] if line.startswith("prmt") and ", 0x5410" in line) // 4
        assert words_before == max(0, j - ahead)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("strategy,codes_dtype,act_dtype,m,rows", [
    ("w4a8_mma", torch.bfloat16, "int8", 4, 16), ("w4a8_mma", torch.bfloat16, "int4", 4, 16),
    ("w4a8_mma", torch.bfloat16, "int8", 16, 32), ("w4a8_mma", torch.bfloat16, "int4", 13, 32),
    ("w4a8_mma_int8", torch.int8, "int8", 1, 16), ("w4a8_mma_int8", torch.int8, "int4", 4, 16),
    ("w4a8_mma_int8", torch.int8, "int8", 16, 32)])
def test_dispatcher_takes_the_codes_the_chosen_fragment_kernel_takes(strategy, codes_dtype, act_dtype, m, rows):
    """Where the map picks a fragment kernel for W4A8 / W4A4, the dispatcher asks the norm for its
    codes in that kernel's form (exact integers in bf16 for w4a8_mma, int8 for w4a8_mma_int8), uses
    them (zeros give zeros) and, given the real ones, returns the bits of quantizing itself; codes
    in the other form, or (int8) in the other column order (`CodesSpec.fragment_order`), are ignored."""
    from gearshift.dispatch.dispatcher import AdaptiveDispatcher
    from gearshift.dispatch.policy import Choice, PolicyMap, type_key
    from gearshift.kernels.act_quant import ActCodes
    from gearshift.kernels.rmsnorm import rms_norm_codes_triton

    torch.manual_seed(2)
    act = ActQuantSpec(act_dtype)
    st = quantize_int4(torch.randn(256, 1024), 128).cuda().to_layout("blocks16")
    cfg = TileConfig(rows, 0, 128, 1, 4, 1, kwarps=4)
    pm = PolicyMap("test", [m], {type_key(f"w4a{act.bits}", 128, 256, 1024): [Choice(strategy, cfg)]})
    disp = AdaptiveDispatcher(pm)
    qmax = 127.0 if act_dtype == "int8" else 7.0
    spec = disp.codes_for(st, act, m, torch.bfloat16)
    assert spec is not None and spec.qmax == qmax and spec.dtype == codes_dtype
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    assert spec.fragment_order == (codes_dtype == torch.int8)  # (the switch's default)
    h, codes = rms_norm_codes_triton(x, w, 1e-5, qmax, codes_dtype, fragment_order=spec.fragment_order)
    plain = disp.linear(h, st, act)
    assert torch.equal(disp.linear(h, st, act, codes=codes), plain)
    zeros = ActCodes(torch.zeros_like(codes.codes), codes.scales, qmax, codes.fragment_order)
    assert not disp.linear(h, st, act, codes=zeros).any()
    if spec.fragment_order:
        rows_zeros = ActCodes(torch.zeros_like(codes.codes), codes.scales, qmax)
        assert torch.equal(disp.linear(h, st, act, codes=rows_zeros), plain)
    other = rms_norm_codes_triton(x, w, 1e-5, qmax, torch.bfloat16 if codes_dtype == torch.int8 else torch.int8)[1]
    assert torch.equal(disp.linear(h, st, act, codes=other), plain)
    ref = linear_reference(h.float(), st, act)
    assert ((plain.float() - ref).norm() / ref.norm()).item() < 3e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,split,warps,kwarps,prefetch,preload,pairs", [
    (16, 1, 8, 4, False, False, True), (16, 1, 8, 8, True, False, False), (16, 1, 8, 8, False, True, False),
    (32, 1, 4, 4, False, False, True), (8, 1, 4, 1, False, False, False), (16, 2, 4, 2, False, False, False),
    (32, 2, 2, 1, True, False, False)])
def test_gpu_int8_codes_match_the_16_bit_codes(rows, split, warps, kwarps, prefetch, preload, pairs):
    """The int8 MMA on int8 codes computes the same integers as the bf16 MMA on the same codes as
    bf16; only the fp32 epilogue rounds differently (no +128 offset to take back out)."""
    from gearshift.kernels import int4_mma_gemv as mg

    torch.manual_seed(rows + warps + split)
    store = quantize_int4(torch.randn(208, 2048), 128).cuda().to_layout("blocks16")
    cfg = TileConfig(rows, 0, 128, split, warps, 1, prefetch=prefetch, kwarps=kwarps, preload=preload, pairs=pairs)
    assert mma_gemv_supports(store, cfg, 16, torch.int8)
    for m in (1, 3, 8, 9, 16):
        for qmax in (127, 7):
            codes = torch.randint(-qmax, qmax + 1, (m, 2048), device="cuda", dtype=torch.int8)
            scales = torch.rand(m, device="cuda") / 100
            y16 = mg.mma_gemv(codes.to(torch.bfloat16), store, cfg, token_scales=scales, out_dtype=torch.bfloat16)
            y8 = mg.mma_gemv(codes, store, cfg, token_scales=scales, out_dtype=torch.bfloat16)
            ref = linear_reference(codes.float() * scales[:, None], store, None)
            assert ((y8.float() - ref).norm() / ref.norm()).item() < 3e-3, (m, qmax)
            assert ((y8.float() - y16.float()).norm() / y16.float().norm()).item() < 3e-3, (m, qmax)
            assert torch.equal(mg.mma_gemv(codes, store, cfg, token_scales=scales, out_dtype=torch.bfloat16), y8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,split,warps,kwarps,pairs", [(16, 1, 8, 4, True), (32, 1, 4, 4, False),
                                                           (16, 2, 4, 1, False), (8, 1, 8, 8, False)])
def test_gpu_17_to_64_tokens_run_as_16_token_groups(rows, split, warps, kwarps, pairs):
    """Above 16 tokens each row tile runs one program per 16-token group: every group's columns
    equal what the kernel gives those tokens alone (bf16 and int8 codes), and the reference."""
    from gearshift.kernels import int4_mma_gemv as mg

    torch.manual_seed(rows + split)
    store = quantize_int4(torch.randn(208, 2048), 128).cuda().to_layout("blocks16")
    cfg = TileConfig(rows, 0, 128, split, warps, 1, kwarps=kwarps, pairs=pairs)
    for m in (17, 33, 64):
        assert mma_gemv_supports(store, cfg, m) and mma_gemv_supports(store, cfg, m, torch.int8)
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        y = mg.mma_gemv(x, store, cfg)
        ref = linear_reference(x.float(), store, None)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 3e-3, m
        for g0 in range(0, m, 16):
            part = x[g0:g0 + 16]
            if part.shape[0] > 8:  # a group of 9..16 runs two tiles, as a call with those tokens alone does
                assert torch.equal(y[g0:g0 + 16], mg.mma_gemv(part.contiguous(), store, cfg)), (m, g0)
        codes = torch.randint(-127, 128, (m, 2048), device="cuda", dtype=torch.int8)
        scales = torch.rand(m, device="cuda") / 100
        y8 = mg.mma_gemv(codes, store, cfg, token_scales=scales, out_dtype=torch.bfloat16)
        ref8 = linear_reference(codes.float() * scales[:, None], store, None)
        assert ((y8.float() - ref8).norm() / ref8.norm()).item() < 3e-3, m
    assert not mma_gemv_supports(store, cfg, 65)


# --- xshare: each block's activations staged once per CTA in shared memory (stop 41) -------------

if HAS_TRITON:
    import triton
    import triton.language as tl

    from gearshift.kernels.int4_mma_gemv import _xs_chunk, _xs_lane

    @triton.jit
    def _xshare_addresses(w_ptr, r_ptr, ROWB: tl.constexpr):
        """Buffer offsets of the xshare writer and reader for 16 token rows of ROWB bytes: (row, chunk) =
        (i // C, i % C) and lane (g, t) = (i // C, (i % C) // L) reading its chunk i % L (C = ROWB / 16
        chunks per row, L = C / 4 per lane)."""
        C: tl.constexpr = ROWB // 16
        i = tl.arange(0, 16 * C)
        tl.store(w_ptr + i, _xs_chunk(0, i // C, i % C, ROWB))
        tl.store(r_ptr + i, _xs_lane(0, i // C, (i % C) // (C // 4), i % (C // 4), ROWB))

def test_xshare_supports():
    """xshare needs 16-bit activations, >= 2 row groups that split a block's token rows evenly, one
    block per step, and its buffers (two blocks per K slice of the CTA) in 48 KB of static shared memory."""
    from gearshift.kernels.int4_mma_gemv import xshare_bytes

    store = quantize_int4(torch.randn(64, 4096), 128)
    xs = TileConfig(16, 0, 128, 1, 8, 1, kwarps=4, xshare=True)  # 2 row groups x 4 K slices
    assert mma_gemv_supports(store, xs, 16) and mma_gemv_supports(store, xs, 5)
    # int8 codes: a token row is 128 bytes, so 8 tokens (64 chunks) split over at most 2 row groups
    assert mma_gemv_supports(store, xs, 16, torch.int8) and mma_gemv_supports(store, xs, 8, torch.int8)
    four = dataclasses.replace(xs, warps=16)  # 4 row groups
    assert mma_gemv_supports(store, four, 16, torch.int8) and not mma_gemv_supports(store, four, 8, torch.int8)
    assert not mma_gemv_supports(store, xs, 16, torch.float32)
    assert not mma_gemv_supports(store, dataclasses.replace(xs, kwarps=8), 16)  # one row group: nothing to share
    assert not mma_gemv_supports(store, dataclasses.replace(xs, prefetch=True), 16)
    assert mma_gemv_supports(store, dataclasses.replace(xs, pairs=True), 16)
    assert mma_gemv_supports(store, dataclasses.replace(xs, preload=True), 16)
    # 8 row groups share a 16-token block (256 chunks, one per lane) but not an 8-token one (128 chunks)
    wide = TileConfig(16, 0, 128, 1, 8, 1, kwarps=1, xshare=True)
    assert mma_gemv_supports(store, wide, 16) and not mma_gemv_supports(store, wide, 8)
    # 16 tokens x 256 bytes x 2 buffers x 8 K slices = 64 KB: only where 8 tokens halve it
    big = TileConfig(16, 0, 128, 1, 16, 1, kwarps=8, xshare=True)
    assert xshare_bytes(2, 8) == 64 << 10 and not mma_gemv_supports(store, big, 16) and mma_gemv_supports(store, big, 8)
    assert xs.key().endswith("X") and "xshare" not in TileConfig().to_dict()


@pytest.mark.parametrize("rowb", [256, 128])
def test_xshare_chunks_are_read_where_they_were_stored_without_bank_conflicts(rowb):
    """The writer (`_xs_chunk`: chunk c of token row r) and the fragment reader (`_xs_lane`: lane (g, t)
    reads its chunks of row g) agree on every address, the buffer is a permutation of its rows'
    chunks, and both patterns hit 8 distinct 16-byte bank groups in each quarter warp (one wavefront
    per 128-bit access), for bf16 / fp16 rows (256 bytes) and int8 codes (128)."""
    if not HAS_TRITON:
        pytest.skip("needs Triton")
    import os

    dev = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    c, per_lane = rowb // 16, rowb // 64
    w = torch.zeros(16 * c, dtype=torch.int32, device=dev)
    r = torch.zeros(16 * c, dtype=torch.int32, device=dev)
    _xshare_addresses[(1,)](w, r, rowb)
    w, r = w.cpu(), r.cpu()
    assert torch.equal(w, r)
    assert sorted(w.tolist()) == list(range(0, 16 * rowb, 16))
    # reader: instruction j of the lanes 8q..8q+7 (rows g = 2q, 2q+1, t = 0..3); tokens 8.. repeat it
    for j in range(per_lane):
        for q in range(4):
            lanes = [(2 * q + lane // 4, lane % 4) for lane in range(8)]
            banks = {(r[c * g + per_lane * t + j].item() // 16) % 8 for g, t in lanes}
            assert len(banks) == 8, (j, q, banks)
    # writer: lanes store consecutive chunks of one row
    for start in range(0, 16 * c, 8):
        assert len({(w[i].item() // 16) % 8 for i in range(start, start + 8)}) == 8


def test_xshare_compiles_for_sm90(compile_sm90):
    """xshare tiles (one block per trip, two, and preloaded) compile for sm_90 with one static
    buffer declaration, named barriers on registers, and the fragment inputs read from shared memory."""
    out = compile_sm90(r"""
from gearshift.kernels import int4_mma_gemv as mg
sig = {"x_ptr": "*bf16", "qw_ptr": "*u8", "s_ptr": "*fp16", "mn_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
       "cnt_ptr": "*i32", "xs_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"}
import torch
for dt, rows, tiles, warps, kw, even, pre in (("bf16", 32, 2, 4, 2, 0, 0), ("bf16", 16, 1, 16, 8, 1, 0),
                                              ("bf16", 16, 2, 8, 4, 0, 4), ("s8", 16, 2, 8, 4, 0, 0),
                                              ("s8", 32, 1, 4, 2, 1, 0)):
    s = dict(sig, x_ptr="*i8", xs_ptr="*fp32") if dt == "s8" else sig
    ce = dict(G=128, WARPS=warps, SPLIT_K=1, ASM=mg.block_asm(dt, rows, tiles, True),
              CONSTRAINTS=mg.block_constraints(dt, rows, tiles, True), ROWS=rows, TILES=tiles, TG=1, ZPID=False,
              OFFSET=mg.OFFSET[dt], U=1, HAS_XS=dt == "s8", PDL=True, L2_PREFETCH=False, LOAD=mg.WEIGHT_LOADS["plain"],
              SHINT=0, TILED=True, TRIGGER=0, TAIL=0, KWARPS=kw, EVEN=even, PRE=pre,
              **mg.xshare_args(tiles, kw, torch.int8 if dt == "s8" else torch.bfloat16))
    out[f"{dt}_{rows}_{tiles}_{warps}_{kw}_{even}_{pre}"] = ptx(mg._mma_gemv_kernel, s, ce, num_warps=warps,
                                                               ints16=("K",))
""")
    import re

    for key, p in out.items():
        dt, tiles = key.split("_")[0], int(key.split("_")[2])
        assert ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in p) == (dt == "s8"), key
        assert p.count(".shared .align 128 .b8 gs_xshare[") == 1, key
        assert re.search(r"bar\.sync %r\d+, %r\d+", p), key  # the K slice's named barrier
        assert "ld.shared.v4.b32" in p and "st.shared.v4.b32" in p, key
        assert "ld.global.v4.b32" in p and "griddepcontrol.wait" in p, key  # the row loads, after the PDL wait
        assert p.count("ld.shared.v4.b32") >= (2 if dt == "s8" else 4) * tiles, key  # per token tile and block


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("wait", [False, True])
def test_gpu_trace_records_every_program_and_changes_no_bits(wait):
    """int4_mma_gemv.TRACE (chain_trace.py's timeline): every program of every traced launch writes its
    start <= (wait <=) end and an SM number into its own rows of TRACE_ARENA, in launch order, and the
    outputs are the untraced launch's bits; split-K launches are not traced."""
    from gearshift.kernels import int4_mma_gemv as mg

    torch.manual_seed(7)
    store = quantize_int4(torch.randn(208, 2048), 128).cuda().to_layout("blocks16")
    tiles = [TileConfig(16, 0, 128, 1, 8, 1, kwarps=8, preload=True, ksum=True),
             TileConfig(16, 0, 128, 1, 2, 1, kwarps=2),
             TileConfig(16, 0, 128, 1, 16, 1, kwarps=8, xshare=True, ksum=True), TileConfig(16, 0, 128, 2, 4, 1)]
    x = torch.randn(5, 2048, device="cuda", dtype=torch.bfloat16)
    ref = [mg.mma_gemv(x, store, c) for c in tiles]
    mg.TRACE, mg.TRACE_WAIT = [], wait
    arena = mg.TRACE_ARENA = torch.full((4096, 4), -1, device="cuda", dtype=torch.int64)
    try:
        out = [mg.mma_gemv(x, store, c) for c in tiles]
        torch.cuda.synchronize()
        launches = mg.TRACE
    finally:
        mg.TRACE, mg.TRACE_WAIT, mg.TRACE_ARENA = None, False, None
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert [t["tile"] for t in launches] == [c.key() for c in tiles[:3]]  # (split-K: untraced)
    used = 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for t, c in zip(launches, tiles):
        rows = t["rows"].cpu()
        assert rows.shape[0] == -(-208 // (c.bm * c.warps // c.kwarps))
        assert t["rows"].data_ptr() == arena[used:].data_ptr()  # the arena's rows, in launch order
        used += rows.shape[0]
        assert (rows[:, 0] > 0).all() and (rows[:, 0] <= rows[:, 2]).all()
        assert ((rows[:, 3] >= 0) & (rows[:, 3] < sms)).all()
        if wait:
            assert ((rows[:, 0] <= rows[:, 1]) & (rows[:, 1] <= rows[:, 2])).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,split,warps,kwarps,loop,layout", [
    (16, 1, 8, 4, "", "blocks16"), (32, 1, 4, 2, "T", "blocks16"), (16, 1, 16, 8, "T", "blocks16"),
    (16, 1, 8, 4, "L", "blocks16"), (32, 2, 8, 4, "", "rows"), (32, 1, 2, 1, "", "rows")])
def test_gpu_xshare_is_bit_identical(rows, split, warps, kwarps, loop, layout):
    """xshare only changes where a lane's inputs come from: the same bits as the same tile without it,
    for one and two token tiles, ragged token counts and several token groups, alone and in a chain."""
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    torch.manual_seed(rows + warps + kwarps)
    store = quantize_int4(torch.randn(208, 2048), 128).cuda().to_layout(layout)
    cfg = TileConfig(rows, 0, 128, split, warps, 1, kwarps=kwarps, pairs=loop == "T", preload=loop == "L")
    xs = dataclasses.replace(cfg, xshare=True)
    for m in (1, 2, 3, 4, 5, 8, 9, 13, 16, 23, 40):
        if not mma_gemv_supports(store, xs, m):
            continue
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        ref, chain = mma_gemv(x, store, cfg), mma_gemv(mma_gemv(x, store, cfg)[:, :128].repeat(1, 16), store, cfg)
        y, z = mma_gemv(x, store, xs), mma_gemv(mma_gemv(x, store, xs)[:, :128].repeat(1, 16), store, xs)
        assert torch.equal(y, ref) and torch.equal(z, chain), m
        assert (y.float() - linear_reference(x.float(), store, None)).norm() <= 3e-3 * ref.float().norm()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("rows,warps,kwarps,loop", [(16, 8, 4, ""), (32, 4, 2, "T"), (16, 16, 8, "L"), (16, 16, 4, "")])
def test_gpu_xshare_int8_codes_are_bit_identical(rows, warps, kwarps, loop):
    """W4A8 / W4A4 on the int8 MMA (int8 codes, 128-byte token rows) give the same bits with xshare."""
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    torch.manual_seed(rows + warps)
    store = quantize_int4(torch.randn(208, 2048), 128).cuda().to_layout("blocks16")
    cfg = TileConfig(rows, 0, 128, 1, warps, 1, kwarps=kwarps, pairs=loop == "T", preload=loop == "L")
    xs = dataclasses.replace(cfg, xshare=True)
    timed = 0
    for m in (2, 4, 5, 8, 9, 16, 23):
        if not mma_gemv_supports(store, xs, m, torch.int8):
            continue
        codes = torch.randint(-127, 128, (m, 2048), device="cuda", dtype=torch.int8)
        scales = torch.rand(m, device="cuda") + 0.01
        ref = mma_gemv(codes, store, cfg, token_scales=scales, out_dtype=torch.bfloat16)
        y = mma_gemv(codes, store, xs, token_scales=scales, out_dtype=torch.bfloat16)
        assert torch.equal(y, ref), m
        timed += 1
    assert timed


def test_glu_epilogue_compiles_for_sm90(compile_sm90):
    """The SwiGLU epilogue (gate_up stores silu(gate) * up) compiles for sm_90 with 16 / 32 rows per warp, one
    or two token tiles, in-CTA K slices and both layouts: the same MMAs as the plain launch, and the exp of
    SwiGLU's silu in the epilogue."""
    out = compile_sm90(r"""
from gearshift.kernels import int4_mma_gemv as mg
sig = {"x_ptr": "*bf16", "qw_ptr": "*u8", "s_ptr": "*fp16", "mn_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
       "cnt_ptr": "*i32", "xs_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"}
for rows, tiles, kw, tiled in ((16, 1, 2, True), (16, 2, 1, False), (32, 1, 2, True), (32, 2, 2, True)):
    for glu in (0, 1):
        ce = dict(G=128, WARPS=4, SPLIT_K=1, ASM=mg.MMA_ASM[("bf16", rows, tiles)], CONSTRAINTS=mg.CONSTRAINTS[(rows, tiles)],
                  ROWS=rows, TILES=tiles, TG=1, ZPID=True, OFFSET=128.0, U=1, HAS_XS=False, PDL=False,
                  L2_PREFETCH=False, LOAD=mg.WEIGHT_LOADS["plain"], SHINT=0, TILED=tiled, TRIGGER=1, TAIL=0, KWARPS=kw,
                  GLU=glu)
        out[f"{rows}_{tiles}_{kw}_{tiled}_{glu}"] = ptx(mg._mma_gemv_kernel, sig, ce, num_warps=4, ints16=("K",))
""")
    for key in [k for k in out if k.endswith("_1")]:
        glu, plain = out[key], out[key[:-1] + "0"]
        assert glu.count("mma.sync") == plain.count("mma.sync") > 0, key
        assert "ex2.approx" in glu and "ex2.approx" not in plain, key


def test_glu_epilogue_on_int8_codes_compiles_for_sm90(compile_sm90):
    """The SwiGLU epilogue on int8 activation codes (W4A8 / W4A4: the token scales applied to both halves)."""
    out = compile_sm90(r"""
from gearshift.kernels import int4_mma_gemv as mg
sig = {"x_ptr": "*i8", "qw_ptr": "*u8", "s_ptr": "*fp16", "mn_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
       "cnt_ptr": "*i32", "xs_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"}
for rows, tiles in ((16, 1), (32, 2)):
    for glu in (0, 1):
        ce = dict(G=128, WARPS=4, SPLIT_K=1, ASM=mg.block_asm("s8", rows, tiles), CONSTRAINTS=mg.block_constraints("s8", rows, tiles),
                  ROWS=rows, TILES=tiles, TG=1, ZPID=False, OFFSET=0.0, U=1, HAS_XS=True, PDL=False,
                  L2_PREFETCH=False, LOAD=mg.WEIGHT_LOADS["plain"], SHINT=0, TILED=True, TRIGGER=1, TAIL=0, KWARPS=2,
                  GLU=glu)
        out[f"{rows}_{tiles}_{glu}"] = ptx(mg._mma_gemv_kernel, sig, ce, num_warps=4, ints16=("K",))
""")
    for key in [k for k in out if k.endswith("_1")]:
        glu, plain = out[key], out[key[:-1] + "0"]
        assert glu.count("mma.sync") == plain.count("mma.sync") > 0 and "ex2.approx" in glu, key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows,warps,kwarps,extra", [(16, 2, 2, {}), (32, 4, 2, {}), (16, 8, 4, {"preload": True}),
                                                     (32, 2, 2, {"pairs": True})])
@pytest.mark.parametrize("int8", [True, False])
def test_gpu_glu_epilogue_on_codes_is_gate_up_then_swiglu_bit_for_bit(rows, warps, kwarps, extra, int8):
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.int4_mma_gemv import mma_gemv, mma_glu_supports
    from gearshift.kernels.silu_mul import silu_mul_triton

    g = torch.Generator().manual_seed(rows * warps + kwarps + int8)
    inter, k = 104, 512
    store = quantize_int4(torch.randn(2 * inter, k, generator=g) * 0.05, 128).cuda().to_layout("blocks16")
    act = ActQuantSpec("int8")
    ran = 0
    for m in (1, 3, 8, 9, 16, 24, 40):
        x = torch.randn(m, k, generator=g).to("cuda", torch.bfloat16)
        codes, scales = quantize_act_triton(x, act, codes_dtype=torch.int8 if int8 else torch.bfloat16)
        cfg = TileConfig(bm=rows, warps=warps, kwarps=kwarps, stages=1, **extra)
        if not mma_glu_supports(store, cfg, m, codes.dtype, codes=True):
            continue
        want = silu_mul_triton(mma_gemv(codes, store, cfg, token_scales=scales, out_dtype=torch.bfloat16))
        got = mma_gemv(codes, store, cfg, token_scales=scales, out_dtype=torch.bfloat16, glu=True)
        assert got.shape == (m, inter) and torch.equal(got, want), m
        ran += 1
    assert ran >= 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows,warps,kwarps,extra", [(16, 2, 2, {}), (16, 4, 1, {}), (32, 4, 2, {"xshare": True}),
                                                     (32, 2, 2, {"maxnreg": 128}), (16, 8, 4, {"preload": True}),
                                                     (16, 4, 2, {"pairs": True}), (32, 4, 4, {})])
@pytest.mark.parametrize("layout", ["rows", "blocks16"])
def test_gpu_glu_epilogue_is_gate_up_then_swiglu_bit_for_bit(rows, warps, kwarps, extra, layout):
    from gearshift.kernels.int4_mma_gemv import mma_gemv, mma_glu_supports
    from gearshift.kernels.silu_mul import silu_mul_triton

    g = torch.Generator().manual_seed(rows * warps + kwarps)
    inter, k = 104, 512  # 104 pairs: the last program's pairs run past I (clamped, never stored)
    store = quantize_int4(torch.randn(2 * inter, k, generator=g) * 0.05, 128).cuda().to_layout(layout)
    ran = 0
    for dtype in (torch.bfloat16, torch.float16):
        for m in (1, 3, 8, 9, 16, 24, 40):  # (17..64 tokens: 16-token groups of programs)
            cfg = TileConfig(bm=rows, warps=warps, kwarps=kwarps, stages=1, **extra)
            if not mma_glu_supports(store, cfg, m, dtype):
                continue
            x = torch.randn(m, k, generator=g).to("cuda", dtype)
            want = silu_mul_triton(mma_gemv(x, store, cfg))
            got = mma_gemv(x, store, cfg, glu=True)
            assert got.shape == (m, inter) and torch.equal(got, want), (dtype, m)
            ran += 1
    assert ran >= 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("cfg", [
    TileConfig(16, 0, 128, 1, 2, 1, kwarps=2), TileConfig(8, 0, 128, 1, 8, 1, kwarps=8, preload=True, ksum=True),
    TileConfig(16, 0, 128, 1, 16, 1, kwarps=8, pairs=True, xshare=True, ksum=True),
    TileConfig(32, 0, 128, 1, 4, 1, kwarps=2, xshare=True), TileConfig(32, 0, 128, 2, 2, 1, prefetch=True)])
def test_gpu_fragment_order_inputs_give_the_same_bits(cfg):
    """`mma_gemv(to_fragment_order(x), ..., fragment_order=True)`, the block without its input PRMTs,
    gives the shipped kernel's bits on x, from global or (xshare) shared memory: 16-bit inputs and int8 codes
    (CPU: test_fragment_asm)."""
    from gearshift.kernels.int4_mma_gemv import mma_gemv, to_fragment_order

    torch.manual_seed(cfg.bm + cfg.warps)
    store = quantize_int4(torch.randn(256, 2048), 128).cuda().to_layout("blocks16")
    for m in (1, 5, 8, 9, 16):
        if not mma_gemv_supports(store, cfg, m):
            continue
        for dt in (torch.bfloat16, torch.float16):
            x = torch.randn(m, 2048, device="cuda", dtype=dt)
            assert torch.equal(mma_gemv(to_fragment_order(x), store, cfg, fragment_order=True),
                               mma_gemv(x, store, cfg)), (m, dt)
        codes = torch.randint(-127, 128, (m, 2048), device="cuda", dtype=torch.int8)
        ts = torch.rand(m, device="cuda") + 0.5
        assert torch.equal(mma_gemv(to_fragment_order(codes), store, cfg, ts, torch.bfloat16, fragment_order=True),
                           mma_gemv(codes, store, cfg, ts, torch.bfloat16)), m


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("cfg", [
    TileConfig(16, 0, 128, 1, 2, 1, kwarps=2), TileConfig(8, 0, 128, 1, 8, 1, kwarps=8, preload=True, ksum=True),
    TileConfig(16, 0, 128, 1, 16, 1, kwarps=8, pairs=True, ksum=True), TileConfig(32, 0, 128, 2, 2, 1, prefetch=True),
    TileConfig(32, 0, 128, 1, 8, 1, kwarps=8, pairs=True, ksum=True, trigger=2)])
def test_gpu_x_tile_inputs_give_the_same_bits(cfg):
    """`mma_gemv(to_x_tiles(x), ..., x_tiles=M)`, whose warps load 512 contiguous input bytes at a time, gives
    the shipped kernel's bits on x: bf16 / fp16 inputs and int8 codes (their chunks in fragment order, and in
    natural order), up to 40 tokens (CPU: test_fragment_asm), whatever the padding rows hold (the producers
    leave them unwritten)."""
    from gearshift.kernels.int4_mma_gemv import mma_gemv, to_x_tiles, x_tile_rows

    def to_x_tiles_padded_with(x, fill, **kw):  # x's tiles with fill in the padding rows
        pad = torch.full((x_tile_rows(x.shape[0]) - x.shape[0], x.shape[1]), fill, dtype=x.dtype, device=x.device)
        return to_x_tiles(torch.cat([x, pad]), **kw)

    torch.manual_seed(cfg.bm + cfg.warps)
    store = quantize_int4(torch.randn(256, 2048), 128).cuda().to_layout("blocks16")
    ran = 0
    for m in (1, 5, 8, 9, 16, 40):
        if not mma_gemv_supports(store, cfg, m):
            continue
        for dt in (torch.bfloat16, torch.float16):
            x = torch.randn(m, 2048, device="cuda", dtype=dt)
            want = mma_gemv(x, store, cfg)
            assert torch.equal(mma_gemv(to_x_tiles(x), store, cfg, x_tiles=m), want), (m, dt)
            assert torch.equal(mma_gemv(to_x_tiles_padded_with(x, float("nan")), store, cfg, x_tiles=m), want)
            assert torch.equal(mma_gemv(to_x_tiles_padded_with(x, 1e4, fragment_order=False), store, cfg,
                                        fragment_order=False, x_tiles=m), want), (m, dt)
        codes = torch.randint(-127, 128, (m, 2048), device="cuda", dtype=torch.int8)
        ts = torch.rand(m, device="cuda") + 0.5
        want = mma_gemv(codes, store, cfg, ts, torch.bfloat16)
        assert torch.equal(mma_gemv(to_x_tiles_padded_with(codes, -128), store, cfg, ts, torch.bfloat16, x_tiles=m),
                           want), m
        assert torch.equal(mma_gemv(to_x_tiles_padded_with(codes, 127, fragment_order=True), store, cfg, ts,
                                    torch.bfloat16, x_tiles=m, fragment_order=True), want), m
        ran += 1
    assert ran >= 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("cfg", [TileConfig(32, 0, 128, 1, 2, 1, kwarps=2, maxnreg=128),
                                 TileConfig(16, 0, 128, 1, 8, 1, kwarps=4, pairs=True)])
def test_gpu_glu_x_tile_outputs_are_the_row_outputs_in_the_fragment_layout(cfg):
    """`mma_gemv(..., glu=True, y_tiles=True)` stores SwiGLU's product in `x_tiles`' layout: the row-order
    product's bits at their places (the padding rows, which no fragment kernel reads, are left unwritten), from
    row-order or x-tile inputs."""
    from gearshift.kernels.int4_mma_gemv import from_x_tiles, mma_gemv, mma_glu_supports, to_x_tiles

    torch.manual_seed(3)
    store = quantize_int4(torch.randn(512, 1024), 128).cuda().to_layout("blocks16")
    ran = 0
    for m in (1, 3, 9, 12, 16):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        if not mma_glu_supports(store, cfg, m, x.dtype):
            continue
        want = mma_gemv(x, store, cfg, glu=True)
        for got in (mma_gemv(x, store, cfg, glu=True, y_tiles=True),
                    mma_gemv(to_x_tiles(x), store, cfg, glu=True, y_tiles=True, x_tiles=m)):
            assert got.shape == to_x_tiles(want).shape and torch.equal(from_x_tiles(got, m), want), m
        ran += 1
    assert ran == 5


def test_x_tile_inputs_refuse_what_the_layout_cannot_serve():
    from gearshift.kernels.int4_mma_gemv import mma_gemv, to_x_tiles

    store = quantize_int4(torch.randn(64, 512), 128).to_layout("blocks16")
    x = torch.randn(5, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x-tile"):
        mma_gemv(x, store, TileConfig(16, 0, 128, 1, 2, 1, kwarps=2), x_tiles=5)  # not the tiled shape
    with pytest.raises(ValueError, match="x-tile"):
        mma_gemv(to_x_tiles(x), store, TileConfig(16, 0, 128, 1, 4, 1, kwarps=2, xshare=True), x_tiles=5)


# --- groups of 32 / 64 columns (GGUF Q4_0 / Q4_1): weights dequantized before the MMA ---------------------

def dequantized_weights(store, dtype) -> torch.Tensor:
    """What a dequantize-first block feeds its MMAs: q * s + m with the scale and min in the activation
    dtype, rounded once to it (the products and sums are exact in fp32 for 4-bit q and 8/11-bit s, m)."""
    q = store.unpacked().float()
    g = store.group_size
    s = store.scales.to(dtype).float().repeat_interleave(g, dim=1)
    mn = store.mins.to(dtype).float().repeat_interleave(g, dim=1)
    return (q * s + mn).to(dtype)


def emulate_dequant(x: torch.Tensor, store, dtype) -> torch.Tensor:
    """fp64 model of the dequantize-first plan, lane by lane: lane t of each 128-column block holds words
    4t..4t+3 and takes the scale and min of group (block start + 32 t) / G for all of them."""
    q = store.unpacked().long()
    n, k = q.shape
    g = store.group_size
    y = torch.zeros(x.shape[0], n, dtype=torch.float64)
    for c0 in range(0, k, BLOCK_COLS):
        for lane_t in range(4):
            grp = (c0 + 32 * lane_t) // g
            s = store.scales[:, grp].to(dtype).float()[:, None]
            mn = store.mins[:, grp].to(dtype).float()[:, None]
            cols = slice(c0 + 32 * lane_t, c0 + 32 * lane_t + 32)
            w = (q[:, cols].float() * s + mn).to(dtype).double()
            y += x[:, cols].double() @ w.T
    return y


@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequant_plan_matches_dequantized_weights_and_reference(group, dtype):
    """Every lane's 32 columns of a block lie in one group, so the per-lane scale pick is the whole
    dequantization; its only departures from the reference are the scale's and min's rounding to the input dtype
    (bf16 keeps 8 of an fp16 scale's 11 significant bits) and each weight's."""
    g = torch.Generator().manual_seed(group)
    store = quantize_int4(torch.randn(24, 512, generator=g), group)
    x = torch.randn(3, 512, generator=g).to(dtype).float()
    model = emulate_dequant(x, store, dtype)
    whole = x.double() @ dequantized_weights(store, dtype).double().T
    assert ((model - whole).norm() / whole.norm()).item() < 1e-12
    ref = linear_reference(x, store, None).double()
    assert ((model - ref).norm() / ref.norm()).item() < (8e-3 if dtype == torch.bfloat16 else 1e-3)


def test_dequant_ptx():
    """Two `fma.rn` per nibble pair (the exact - 128, then s * q + m with the row's packed operands, which
    follow the pointers), and no token-sum MMA."""
    from gearshift.kernels.int4_mma_gemv import MMA_ASM_DQ, block_asm, block_constraints

    for rows, per in ((8, 1), (16, 2), (32, 4)):
        for tiles in (1, 2):
            asm = MMA_ASM_DQ[("bf16", rows, tiles, False)]
            plain = MMA_ASM[("bf16", rows, tiles)]
            pairs = 16 * per  # 4 words x 4 nibble pairs per lane row
            assert asm.count("fma.rn.bf16x2") == 2 * pairs and "fma.rn" not in plain
            sums = 0 if per == 1 else 8 * tiles  # plain: one token-sum MMA per k-step and tile
            assert asm.count("mma.sync") == plain.count("mma.sync") - sums
            n_out = {1: 4, 2: 6, 4: 10}[per] * tiles
            sp0 = n_out + 4 * per + tiles
            for r in range(per):
                assert f"${sp0 + 2 * r}, ${sp0 + 2 * r + 1};" in asm
            cons = block_constraints("bf16", rows, tiles, dequant=True)
            assert cons == CONSTRAINTS[(rows, tiles)] + ",r" * (2 * per)
            assert cons.count(",") + 1 == max(int(v[1:]) for v in __import__("re").findall(r"\$\d+", asm)) + 1
    assert "fma.rn.f16x2" in MMA_ASM_DQ[("f16", 16, 1, True)] and "0xE400E400" in MMA_ASM_DQ[("f16", 16, 1, True)]
    shared = MMA_ASM_DQ[("bf16", 16, 1, True)]
    assert "$18, $19;" in shared and "$20, $21;" in shared  # 6 outputs, 8 words, 4 shared addresses, then the pairs
    with pytest.raises(ValueError):
        block_asm("s8", 16, 1, dequant=True)


def test_dequant_supports():
    from gearshift.kernels.int4_mma_gemv import DEQUANT_GROUPS

    cfg = TileConfig(16, 0, 128, 1, 4, 1)
    for group in DEQUANT_GROUPS:
        st = quantize_int4(torch.randn(64, 512), group)
        assert mma_gemv_supports(st, cfg, 4, torch.bfloat16) and mma_gemv_supports(st, cfg, 4, torch.float16)
        assert not mma_gemv_supports(st, cfg, 4, torch.int8)  # codes keep the scale-after fold
    assert not mma_gemv_supports(quantize_int4(torch.randn(64, 512), 16), cfg, 4)


def test_dequant_kernel_compiles_for_sm90(compile_sm90):
    """The dequantize-first kernel compiles for sm_90 (ptxas) at 8 / 16 / 32 rows per warp, one or two token
    tiles, in-CTA K slices, shared-memory inputs and the SwiGLU epilogue, with the lane's group offset."""
    out = compile_sm90(r"""
from gearshift.kernels import int4_mma_gemv as mg
sig = {"x_ptr": "*bf16", "qw_ptr": "*u8", "s_ptr": "*fp16", "mn_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
       "cnt_ptr": "*i32", "xs_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"}
for rows, tiles, kw, g, extra in ((8, 1, 1, 32, {}), (16, 2, 2, 64, {}), (32, 1, 4, 32, {"GLU": 1}),
                                  (16, 1, 2, 32, {"xs": 1}), (32, 2, 1, 32, {})):
    xs = extra.pop("xs", 0)
    ce = dict(G=g, WARPS=4, SPLIT_K=1, ASM=mg.block_asm("bf16", rows, tiles, bool(xs), dequant=True),
              CONSTRAINTS=mg.block_constraints("bf16", rows, tiles, bool(xs), dequant=True), ROWS=rows, TILES=tiles,
              TG=1, ZPID=True, OFFSET=128.0, U=1, HAS_XS=False, PDL=False, L2_PREFETCH=False,
              LOAD=mg.WEIGHT_LOADS["plain"], SHINT=0, TILED=True, TRIGGER=1, TAIL=0, KWARPS=kw, DQ=1, **extra)
    if xs:
        ce.update(mg.xshare_args(tiles, kw, __import__("torch").bfloat16))
    out[f"{rows}_{tiles}_{kw}_{g}_{xs}"] = ptx(mg._mma_gemv_kernel, sig, ce, num_warps=4, ints16=("K",))
""")
    for key, p in out.items():
        rows, tiles = int(key.split("_")[0]), int(key.split("_")[1])
        per = rows // 8
        assert p.count("fma.rn.bf16x2") == 32 * per, key
        assert p.count("mma.sync") == 8 * tiles * {1: 1, 2: 1, 4: 2}[per], key  # no token-sum MMAs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("cfg", [
    TileConfig(16, 0, 128, 1, 4, 1), TileConfig(8, 0, 128, 2, 2, 1, prefetch=True),
    TileConfig(16, 0, 128, 1, 8, 1, kwarps=8, preload=True, ksum=True),
    TileConfig(32, 0, 128, 1, 4, 1, kwarps=4, prefetch=True), TileConfig(32, 0, 128, 1, 4, 1, kwarps=2, xshare=True),
    TileConfig(16, 0, 128, 1, 16, 1, kwarps=8, pairs=True, xshare=True, ksum=True)])
@pytest.mark.parametrize("layout", ["rows", "blocks16"])
def test_gpu_dequant_kernel_matches_the_dequantized_weights(group, cfg, layout):
    """Groups of 32 / 64 on the GPU: the kernel computes x @ dequantized_weights(store).T up to fp32 summation
    order, within the bf16 weight rounding of the reference, and reproducibly."""
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    g = torch.Generator().manual_seed(group + cfg.warps + cfg.bm)
    n, k = (200 if layout == "rows" else 208), 2048  # (blocks16 needs whole 16-row chunks)
    host = quantize_int4(torch.randn(n, k, generator=g), group)
    store = host.cuda().to_layout(layout)
    ran = 0
    for m in (1, 3, 8, 9, 16, 40):
        for dt in (torch.bfloat16, torch.float16):
            if not mma_gemv_supports(store, cfg, m, dt):
                continue
            x = torch.randn(m, k, generator=g).to("cuda", dt)
            y = mma_gemv(x, store, cfg)
            w = dequantized_weights(host, dt).to("cuda")
            want = x.double() @ w.double().T
            assert ((y.double() - want).norm() / want.norm()).item() < (8e-3 if dt == torch.bfloat16 else 1e-3), (m, dt)
            exact = (x.float() @ w.float().T).to(dt)
            assert ((y.float() - exact.float()).norm() / exact.float().norm()).item() < 2e-3, (m, dt)
            ref = linear_reference(x.float(), store, None)
            assert ((y.float() - ref).norm() / ref.norm()).item() < 8e-3, (m, dt)
            assert torch.equal(mma_gemv(x, store, cfg), y)
            ran += 1
    assert ran >= 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX needs a CUDA GPU")
@pytest.mark.parametrize("group", [32, 64])
def test_gpu_dequant_glu_epilogue_is_gate_up_then_swiglu(group):
    from gearshift.kernels.int4_mma_gemv import mma_gemv, mma_glu_supports
    from gearshift.kernels.silu_mul import silu_mul_triton

    g = torch.Generator().manual_seed(group)
    inter, k = 104, 512
    store = quantize_int4(torch.randn(2 * inter, k, generator=g) * 0.05, group).cuda().to_layout("blocks16")
    cfg = TileConfig(bm=32, warps=4, kwarps=2, stages=1)
    for m in (1, 9, 16):
        assert mma_glu_supports(store, cfg, m, torch.bfloat16)
        x = torch.randn(m, k, generator=g).to("cuda", torch.bfloat16)
        assert torch.equal(mma_gemv(x, store, cfg, glu=True), silu_mul_triton(mma_gemv(x, store, cfg))), m
