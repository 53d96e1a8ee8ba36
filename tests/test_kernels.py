"""Triton kernels vs their torch references on CPU (TRITON_INTERPRET=1), small random shapes.

Bounds are ||out - ref|| / ||ref||. The interpreter runs fp16 (its bf16 dot is broken on CPU in
triton 3.9; bf16 and fp8 are checked on the GPU by benchmarks/kernel_bench.py --stages check):
  fp16 activations (W4A16, W8A16): 2e-3 (fp16 output rounding is ~3e-4)
  int8 activations (W4A8, W8A8): 2e-3 vs the fake-quantized reference (round ties may differ)
  int4 activations (W4A4): 3e-2 (a tie moves a code by 1/7 of the scale)
The DPR partitions (Split, bit-planes) are exact in int32, so they must equal Padding bit for bit.
"""

from __future__ import annotations

import os

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from gearshift.kernels.config import TileConfig  # noqa: E402
from gearshift.quant.activations import ActQuantSpec, quantize_activations  # noqa: E402
from gearshift.quant.int4 import quantize_int4  # noqa: E402
from gearshift.quant.int8 import quantize_int8  # noqa: E402

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

DEV = "cpu" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else "cuda"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _store(n, k, g, sym=False, seed=0):
    torch.manual_seed(seed)
    return quantize_int4(torch.randn(n, k), g, symmetric=sym).to(DEV)


CFGS16 = [TileConfig(16, 32, 128, 1, 4, 2, True, True), TileConfig(16, 32, 64, 2, 4, 2, True, False),
          TileConfig(32, 64, 128, 1, 4, 2, False, True), TileConfig(16, 32, 128, 3, 4, 2, False, False),
          TileConfig(16, 16, 64, 1, 4, 2, False, True),  # 16 x 64 tiles: 3 token tiles at M=33, grouped order
          TileConfig(16, 32, 64, 2, 4, 2, False, True)]  # dequant-first + split-K reduction


@pytest.mark.parametrize("cfg", CFGS16, ids=lambda c: c.key())
@pytest.mark.parametrize("g", [64, 128, 512])
def test_w4a16_matches_reference(cfg, g):
    from gearshift.kernels.w4a16 import supports, w4a16_linear, w4a16_reference

    st = _store(80, 512, g, seed=g)
    if not supports(st, cfg):
        pytest.skip("tile straddles a group")
    for m in (1, 7, 33):
        x = torch.randn(m, 512, device=DEV).half()
        y = w4a16_linear(x, st, cfg)
        assert y.shape == (m, 80) and y.dtype == torch.float16 and not torch.isnan(y).any()
        assert rel(y, w4a16_reference(x.float(), st)) < 2e-3


def test_w4a16_per_row_store():
    """GEARBX low gear: G = K, symmetric (mins = -8*scale)."""
    from gearshift.kernels.w4a16 import w4a16_linear, w4a16_reference

    st = _store(48, 256, 256, sym=True)
    x = torch.randn(3, 256, device=DEV).half()
    assert rel(w4a16_linear(x, st, TileConfig(16, 16, 128, 2, 4, 2)), w4a16_reference(x.float(), st)) < 2e-3


@pytest.mark.parametrize("parts", [(1, 1), (1, 2), (2, 1), (4, 1)], ids=["pad", "split", "bit2", "bitwise"])
@pytest.mark.parametrize("join", [True, False])
def test_w4a8_partitions(parts, join):
    from gearshift.kernels.w4a8 import w4a8_linear, w4a8_reference

    st = _store(64, 512, 128, seed=3)
    act = ActQuantSpec("int8")
    x = torch.randn(9, 512, device=DEV).half()
    cfg = TileConfig(16, 32, 128, 2, 4, 2, True, join)
    y = w4a8_linear(x, st, act, cfg, *parts)
    assert rel(y, w4a8_reference(x.float(), st, act)) < 2e-3
    y_pad = w4a8_linear(x, st, act, cfg, 1, 1)
    assert torch.equal(y, y_pad), "DPR partitions are exact in int32: must equal Padding"


@pytest.mark.parametrize("act", [ActQuantSpec("int8"), ActQuantSpec("int4")], ids=["w4a8", "w4a4"])
@pytest.mark.parametrize("split", [1, 3])
def test_w4a8_on_group_32_weights(act, split):
    """GGUF Q4_0 / Q4_1 hold groups of 32: the joined-nibble tile runs them with K-tiles of 32 (int8 MMAs of
    k = 32), at SmolLM2's K = 576; the strided form (two dots of k = 16) cannot, and says so."""
    from gearshift.kernels.w4a8 import supports, w4a8_linear, w4a8_reference

    st = _store(64, 576, 32, seed=5)
    x = torch.randn(7, 576, device=DEV).half()
    cfg = TileConfig(16, 32, 128, split, 4, 2, True, True)
    assert supports(st, act, cfg) and not supports(st, act, TileConfig(16, 32, 128, split, 4, 2, True, False))
    assert rel(w4a8_linear(x, st, act, cfg), w4a8_reference(x.float(), st, act)) < 2e-3


@pytest.mark.parametrize("split", [1, 4])
def test_w4a8_long_k_keeps_fp32_precision(split):
    """32 K tiles in one program: the int32 -> fp32 trick (1.5 * 2^23 + pi read as fp32) must not
    leave 1.5 * 2^23 * scale in the fp32 accumulator, where it swamped the partial sums' low bits
    (5e-3 relative error at split 1 on the H100 before stop 13; fp16 output rounding is 3e-4)."""
    from gearshift.kernels.w4a8 import w4a8_linear, w4a8_reference

    st = _store(32, 4096, 128, seed=7)
    act = ActQuantSpec("int8")
    x = torch.randn(4, 4096, device=DEV).half()
    assert rel(w4a8_linear(x, st, act, TileConfig(16, 32, 128, split, 4, 2)), w4a8_reference(x.float(), st, act)) < 1e-3


@pytest.mark.parametrize("join", [True, False])
def test_w4a8_fp8(join):
    """fp8 weights are the code bytes read as e4m3 (b * 2^-9), the 2^9 folded into the scale.
    Checked against the GEMM of the kernel's own fp8 codes (the interpreter's e4m3 rounding of
    x differs from torch's; the quantizer is tested on its own)."""
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.w4a8 import w4a8_from_codes

    st = _store(64, 512, 128, seed=6)
    x = torch.randn(20, 512, device=DEV).half()
    codes, scales = quantize_act_triton(x, ActQuantSpec("fp8"))
    y = w4a8_from_codes(codes, scales, st, TileConfig(16, 32, 128, 2, 4, 2, True, join), torch.float16, fp8=True)
    ref = (codes.float() * scales[:, None]) @ st.dequantize(torch.float32).T
    assert rel(y, ref) < 2e-3


def test_w4a4_int4_activations():
    from gearshift.kernels.w4a8 import w4a8_linear, w4a8_reference

    st = _store(32, 256, 128, seed=4)
    act = ActQuantSpec("int4")
    x = torch.randn(5, 256, device=DEV).half()
    assert rel(w4a8_linear(x, st, act, TileConfig(16, 32, 128, 1, 4, 2)), w4a8_reference(x.float(), st, act)) < 3e-2


@pytest.mark.parametrize("act", [None, ActQuantSpec("int8")], ids=["w8a16", "w8a8"])
def test_w8(act):
    from gearshift.kernels.w8 import w8_linear, w8_reference

    torch.manual_seed(5)
    st = quantize_int8(torch.randn(72, 256)).to(DEV)
    for cfg in (TileConfig(16, 32, 64, 1, 4, 2), TileConfig(32, 64, 128, 2, 4, 2)):
        x = torch.randn(6, 256, device=DEV).half()
        assert rel(w8_linear(x, st, act, cfg), w8_reference(x.float(), st, act)) < 2e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_act_quant_matches_reference(dtype):
    """Bit for bit the torch quantizer's codes and scales (correctly rounded divisions, ties to
    even), also on rows built to land on ties: a power-of-two maximum and values on its grid."""
    from gearshift.kernels.act_quant import quantize_act_triton

    torch.manual_seed(0)
    x = torch.randn(7, 4096, device=DEV)
    ties = torch.randint(-254, 255, (3, 4096), device=DEV) / 254.0 * 2.0  # (2k + 1) / 254 * amax: ties
    ties[:, 0] = 2.0  # amax a power of two
    x = torch.cat([x, ties, ties * 0.75]).to(dtype)
    for spec in (ActQuantSpec("int8"), ActQuantSpec("int4")):
        q, s = quantize_act_triton(x, spec)
        q2, s2 = quantize_activations(x, spec)
        assert torch.equal(q, q2), (spec, (q != q2).sum().item())
        assert torch.equal(s, s2.reshape(-1))


@pytest.mark.parametrize("one_pass", [16384, 0], ids=["one-pass", "two-pass"])
def test_act_quant_stores_fragment_order_codes(one_pass, monkeypatch):
    """fragment_order: the int8 codes with each 8 columns in `S8_FRAGMENT_ORDER` (the int8 fragment block reads
    them without input PRMTs), the same codes and scales otherwise; only int8 rows of a multiple of 8 columns."""
    from gearshift.kernels import act_quant
    from gearshift.kernels.x_tiles import to_fragment_order

    monkeypatch.setattr(act_quant, "ONE_PASS_COLUMNS", one_pass)
    x = torch.randn(3, 4096, device=DEV).to(torch.float16)
    for spec in (ActQuantSpec("int8"), ActQuantSpec("int4")):
        q, s = act_quant.quantize_act_triton(x, spec)
        qf, sf = act_quant.quantize_act_triton(x, spec, fragment_order=True)
        assert torch.equal(qf, to_fragment_order(q)) and not torch.equal(qf, q) and torch.equal(sf, s)
    for bad, kw in ((x, {"codes_dtype": torch.float16}), (x[:, :1004], {})):
        with pytest.raises(ValueError, match="fragment-order"):
            act_quant.quantize_act_triton(bad, ActQuantSpec("int8"), fragment_order=True, **kw)


@pytest.mark.parametrize("k,one_pass,rows", [(1000, 16384, 256), (14336, 16384, 256), (14336, 0, 256),
                                             (20000, 16384, 256), (14336, 16384, 2)],
                         ids=["one-pass", "one-pass-wide", "two-pass", "two-pass-wider-than-one-pass",
                              "two-pass-many-rows"])
def test_act_quant_one_and_two_pass(k, one_pass, rows, monkeypatch):
    """Rows up to ONE_PASS_COLUMNS take one read from registers (at most ONE_PASS_ROWS of them),
    wider rows, more rows or the switch at 0 the two-pass loop: both give the torch quantizer's
    integer codes and scales bit for bit, and the same fp8 codes as each other (Triton's e4m3
    conversion is not torch's bit for bit)."""
    from gearshift.kernels import act_quant

    torch.manual_seed(1)
    x = (torch.randn(3, k, device=DEV) * torch.tensor([[0.1], [1.0], [30.0]], device=DEV)).to(torch.bfloat16)
    fp8 = ActQuantSpec("fp8")
    monkeypatch.setattr(act_quant, "ONE_PASS_COLUMNS", 0)
    q8_two, s8_two = act_quant.quantize_act_triton(x, fp8)
    monkeypatch.setattr(act_quant, "ONE_PASS_COLUMNS", one_pass)
    monkeypatch.setattr(act_quant, "ONE_PASS_ROWS", rows)
    assert (act_quant.act_block(k, rows=3) >= k) == (k <= one_pass and rows >= 3)
    for spec in (ActQuantSpec("int8"), ActQuantSpec("int4")):
        q, s = act_quant.quantize_act_triton(x, spec)
        q2, s2 = quantize_activations(x, spec)
        assert torch.equal(s, s2.reshape(-1)), spec
        assert torch.equal(q, q2), (spec, (q != q2).sum().item())
    q8, s8 = act_quant.quantize_act_triton(x, fp8)
    assert torch.equal(s8, s8_two) and torch.equal(q8.view(torch.int8), q8_two.view(torch.int8))


@pytest.mark.parametrize("spec", [ActQuantSpec("int8"), ActQuantSpec("fp8")], ids=["int8", "fp8"])
def test_act_quant_group_sums(spec):
    """The sums the W4A8 GEMM takes for the weight mins are the sums of the codes it multiplies."""
    from gearshift.kernels.act_quant import quantize_act_triton

    x = torch.randn(5, 384, device=DEV).half()
    q, s, sums = quantize_act_triton(x, spec, group_sums=128)
    assert sums.shape == (5, 3)
    assert torch.allclose(sums, q.float().view(5, 3, 128).sum(-1), rtol=1e-6, atol=1e-3)
    with pytest.raises(ValueError, match="multiples"):
        quantize_act_triton(x, spec, group_sums=256)
    # group-major for the wgmma kernels' TMA: [K / G, M], rows padded to 16 bytes
    q2, _, sums_t = quantize_act_triton(x, spec, group_sums=128, sums_by_group=True)
    assert torch.equal(q2, q) and sums_t.shape == (3, 5) and sums_t.stride() == (8, 1)
    assert torch.equal(sums_t, sums.t())


def test_w4a8_per_row_store_of_wide_k():
    """G = K wider than the quantizer's block: the group sums come from torch instead."""
    from gearshift.kernels.w4a8 import w4a8_linear, w4a8_reference

    st = _store(16, 8192, 8192, sym=True)
    act = ActQuantSpec("int8")
    x = torch.randn(2, 8192, device=DEV).half()
    assert rel(w4a8_linear(x, st, act, TileConfig(16, 16, 128, 2, 4, 2)), w4a8_reference(x.float(), st, act)) < 1e-3


def test_dequant_kernel():
    from gearshift.kernels.dequant import dequant_int4_reference, dequant_int4_triton

    for g in (32, 64, 256):  # 32: GGUF Q4_0 / Q4_1, which W4A16 runs as dequantize + cuBLAS above 16 tokens
        st = _store(40, 512, g, seed=g)
        assert torch.equal(dequant_int4_triton(st, torch.float16), dequant_int4_reference(st, torch.float16))


def test_dequant_kernel_tiles():
    """Every (rows, groups, warps) block computes the same bits, ragged rows and groups included."""
    from gearshift.kernels.dequant import dequant_int4_reference, dequant_int4_triton

    for n, k, g in ((40, 512, 64), (48, 640, 128), (16, 1024, 256)):
        st = _store(n, k, g, seed=n)
        ref = dequant_int4_reference(st, torch.float16)
        for tile in ((16, 1, 4), (32, 4, 4), (8, 2, 1), (64, 8, 8)):
            assert torch.equal(dequant_int4_triton(st, torch.float16, tile=tile), ref), (n, k, g, tile)


def test_host_grid_helpers_match_triton():
    import triton

    from gearshift.kernels._triton import cdiv, next_pow2

    assert all(next_pow2(n) == triton.next_power_of_2(n) for n in range(1, 5000))
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(300) for b in range(1, 40))


def test_tinygemm_conversion_formula():
    """z = min + 8*scale makes tinygemm's (q-8)*s+z equal our q*s+min (checked without the kernel)."""
    st = _store(16, 256, 128)
    q = st.unpacked().float().reshape(16, 2, 128)
    s, mn = st.scales.float()[..., None], st.mins.float()[..., None]
    z = mn + 8 * s
    assert torch.allclose(((q - 8) * s + z).reshape(16, 256), st.dequantize(torch.float32), atol=1e-5)


def test_dpr_partition_metadata():
    from gearshift.kernels.dpr import DPRPartition, shifts

    assert shifts((4, 4)) == (0, 4) and shifts((1, 1, 1, 1)) == (0, 1, 2, 3)
    p = DPRPartition((4,), (4, 4), "int8", "split")
    assert p.partial_products == 2 and "P_X=(4,4)" in p.describe()


def test_w4a16_gemv():
    from gearshift.kernels.w4a16 import w4a16_gemv, w4a16_reference

    st = _store(40, 512, 128, seed=7)
    for m, cfg in ((1, TileConfig(1, 16, 256, 1, 4, 2)), (3, TileConfig(4, 32, 128, 2, 4, 2))):
        x = torch.randn(m, 512, device=DEV).half()
        assert rel(w4a16_gemv(x, st, cfg), w4a16_reference(x.float(), st)) < 2e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_split_k_is_bit_reproducible_on_gpu():
    """Split-K partials meet in a fixed order (tiles.store_tile): the same bits on every run, and
    the same as the unsplit kernel up to fp32 summation order."""
    from gearshift.dispatch.profiler import random_store
    from gearshift.kernels.w4a16 import w4a16_linear, w4a16_reference
    from gearshift.kernels.w4a8 import w4a8_linear

    st = random_store("int4", 4096, 4096, 128, torch.device("cuda"))
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    cfg = TileConfig(64, 64, 128, 4, 4, 3, False, True)
    ys = [w4a16_linear(x, st, cfg) for _ in range(5)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    assert rel(ys[0], w4a16_reference(x.float(), st)) < 1e-2
    act = ActQuantSpec("int8")
    zs = [w4a8_linear(x, st, act, TileConfig(64, 64, 128, 4, 4, 3)) for _ in range(5)]
    assert all(torch.equal(zs[0], z) for z in zs[1:])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_shapes_the_rule_tiles_cannot_run_still_run_kernels_on_gpu():
    """SmolLM2's K = 576 under W8A16 / W8A8 (the rules' K-tile is 256), W4A8 / W4A4 on group-32 int4 (GGUF Q4_1)
    and on group 16: the dispatcher runs another tile or kernel there (dequantize + cuBLAS on group 16), which
    computes the reference's function."""
    import warnings

    from gearshift.dispatch import AdaptiveDispatcher
    from gearshift.kernels.reference import linear_reference

    d = AdaptiveDispatcher(None, autoload=False)
    torch.manual_seed(0)
    w = torch.randn(1536, 576, device="cuda")
    cases = [(quantize_int8(w), None), (quantize_int8(w), ActQuantSpec("int8")),
             (quantize_int4(w, 32), ActQuantSpec("int8")), (quantize_int4(w, 32), ActQuantSpec("int4")),
             (quantize_int4(w, 16), ActQuantSpec("int8"))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for st, act in cases:
            for m in (1, 3, 16, 40, 300):
                x = torch.randn(m, 576, device="cuda", dtype=torch.bfloat16)
                assert d.kernel_for(st, act, m) is not None
                ref = linear_reference(x.float(), st, act)
                assert rel(d.linear(x, st, act).float(), ref) < 2e-2, (st, act, m)
