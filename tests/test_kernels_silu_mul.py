"""The one-kernel SwiGLU product vs its torch reference (TRITON_INTERPRET=1 on CPU, or the GPU)."""

import os

import pytest
import torch

from gearshift.kernels._triton import HAS_TRITON

if not HAS_TRITON or (os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available()):
    pytest.skip("needs triton with TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

from gearshift.kernels.silu_mul import silu_mul_reference, silu_mul_triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


# bf16 on the GPU only: Triton's interpreter truncates fp32 -> bf16 instead of rounding
_HALF = torch.bfloat16 if DEV == "cuda" else torch.float16


@pytest.mark.parametrize("shape,dtype", [((3, 5, 2 * 64), torch.float32), ((7, 2 * 1536), _HALF),
                                         ((2, 2 * 96), torch.float16), ((1, 2 * 2500), _HALF)])
def test_silu_mul_matches_reference(shape, dtype):
    g = torch.Generator().manual_seed(shape[-1])
    gu = (torch.randn(shape, generator=g) * 4).to(DEV, dtype)
    y = silu_mul_triton(gu)
    ref = silu_mul_reference(gu)
    assert y.dtype == ref.dtype and y.shape == ref.shape
    # silu rounded to the dtype, then the product rounded: at most one rounding step apart
    tol = 1e-6 if dtype == torch.float32 else (2 ** -7 if dtype == torch.bfloat16 else 2 ** -10)
    assert torch.allclose(y.float(), ref.float(), rtol=tol, atol=1e-6)


def test_silu_mul_reads_strided_rows():
    gu = torch.randn(4, 2 * 80, device=DEV)[:, :].t().contiguous().t()  # column-major: stride(-1) != 1
    assert gu.stride(-1) != 1
    assert torch.allclose(silu_mul_triton(gu), silu_mul_reference(gu), rtol=1e-6, atol=1e-6)


def test_odd_width_is_an_error():
    with pytest.raises(ValueError, match="even"):
        silu_mul_triton(torch.zeros(2, 7, device=DEV))


@pytest.mark.parametrize("qmax,act", [(127.0, "int8"), (7.0, "int4")])
@pytest.mark.parametrize("shape,dtype", [((3, 5, 2 * 64), torch.float32), ((7, 2 * 1536), _HALF),
                                         ((1, 2 * 2500), _HALF), ((2, 2 * 96), torch.float16)])
def test_silu_mul_emits_the_quantizers_codes(shape, dtype, qmax, act):
    """The codes the SwiGLU kernel emits for the down projection are, bit for bit, what the
    activation quantizer makes of the product it stored; the stored product does not change."""
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.silu_mul import silu_mul_codes_triton
    from gearshift.kernels.x_tiles import to_fragment_order
    from gearshift.quant.activations import ActQuantSpec

    g = torch.Generator().manual_seed(shape[-1] + int(qmax))
    gu = (torch.randn(shape, generator=g) * 4).to(DEV, dtype)
    gu[0, ..., 3] = 30.0  # an outlier sets the first row's scale
    y, codes = silu_mul_codes_triton(gu, qmax)
    assert torch.equal(y, silu_mul_triton(gu))
    q, sc = quantize_act_triton(y.reshape(-1, y.shape[-1]), ActQuantSpec(act))
    assert codes.qmax == qmax and codes.codes.dtype == torch.int8
    assert torch.equal(codes.codes, q) and torch.equal(codes.scales, sc)
    assert codes.codes.abs().max().item() == int(qmax)
    _, as_float = silu_mul_codes_triton(gu, qmax, codes_dtype=dtype if dtype != torch.float32 else torch.float16)
    assert torch.equal(as_float.codes.to(torch.int8), q)  # the 16-bit float codes hold the same integers
    none, alone = silu_mul_codes_triton(gu, qmax, product=False)  # the codes without storing the product
    assert none is None and torch.equal(alone.codes, q) and torch.equal(alone.scales, sc)
    if y.shape[-1] % 8:  # fragment order permutes each 8 columns in place
        with pytest.raises(ValueError, match="multiple of 8"):
            silu_mul_codes_triton(gu, qmax, fragment_order=True)
    else:
        _, fo = silu_mul_codes_triton(gu, qmax, fragment_order=True)
        assert fo.fragment_order and torch.equal(fo.codes, to_fragment_order(q)) and torch.equal(fo.scales, sc)


def test_silu_mul_codes_width_limit():
    """One program holds the row: wider rows are refused (the model then leaves down to the quantizer);
    the split kernel has no such limit."""
    from gearshift.kernels.silu_mul import CODES_MAX_WIDTH, codes_supported, silu_mul_codes_triton

    assert codes_supported(14336) and codes_supported(28672) and not codes_supported(CODES_MAX_WIDTH + 1)
    with pytest.raises(ValueError, match="width"):
        silu_mul_codes_triton(torch.zeros(1, 2 * (CODES_MAX_WIDTH + 1), device=DEV), 127.0, split=False)


@pytest.mark.parametrize("qmax,act", [(127.0, "int8"), (7.0, "int4")])
@pytest.mark.parametrize("rows,width", [(1, 2500), (3, 1536), (7, 64)])
def test_split_rows_give_the_one_program_kernels_codes(rows, width, qmax, act):
    """Few rows: each row split over programs that meet at a barrier (on the GPU, several programs
    per row; under the interpreter, which runs programs one after another, one) gives the codes,
    scales and product of one program per row, launch after launch: the barrier's counters are never
    reset, and launches of other program counts (other block sizes) in between keep counters of their own."""
    from gearshift.kernels.silu_mul import _barrier_words, silu_mul_codes_triton
    from gearshift.kernels.x_tiles import to_fragment_order

    g = torch.Generator().manual_seed(rows * width + int(qmax))
    gu = (torch.randn(rows, 2 * width, generator=g) * 4).to(DEV, _HALF)
    gu[-1, 5] = 25.0
    blocks = (256, 512) if DEV == "cuda" else (4096,)  # > 1 program per row only where programs run at once
    programs = sorted({-(-width // block) for block in blocks})  # (narrow rows: one count for both blocks)
    launches = {p: sum(-(-width // block) == p for block in blocks) for p in programs}
    before = [_barrier_words(gu.device, rows, p)[0][:rows].clone() for p in programs]
    for product in (True, False):
        y1, one = silu_mul_codes_triton(gu, qmax, split=False, product=product)
        for _ in range(3):  # later launches find the counters where the earlier ones left them
            for block in blocks:
                ys, split = silu_mul_codes_triton(gu, qmax, split=True, split_block=block, product=product)
                assert torch.equal(split.codes, one.codes) and torch.equal(split.scales, one.scales)
                assert (ys is None) == (not product) and (ys is None or torch.equal(ys, y1))
                if width % 8 == 0:  # the int8 fragment block's column order: the same codes, each 8 permuted
                    _, fo = silu_mul_codes_triton(gu, qmax, split=True, split_block=block, product=product,
                                                  fragment_order=True)
                    assert torch.equal(fo.codes, to_fragment_order(one.codes)) and torch.equal(fo.scales, one.scales)
    per_trip = 6 if width % 8 else 12  # (with the fragment-order launches)
    for p, b in zip(programs, before):  # each launch added its program count to each of its rows' counters
        assert (_barrier_words(gu.device, rows, p)[0][:rows] - b).tolist() == [per_trip * launches[p] * p] * rows
