"""The one-kernel RMSNorm vs its torch reference (TRITON_INTERPRET=1 on CPU, or the GPU)."""

import os

import pytest
import torch

from gearshift.kernels._triton import HAS_TRITON

if not HAS_TRITON or (os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available()):
    pytest.skip("needs triton with TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

from gearshift.kernels.rmsnorm import rms_norm_reference, rms_norm_triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("shape,dtype", [((3, 5, 64), torch.float32), ((7, 576), torch.float32),
                                         ((2, 96), torch.float16), ((4, 3, 32), torch.float16)])
def test_rms_norm_matches_reference(shape, dtype):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=g) * 3).to(DEV, dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEV, dtype)
    y = rms_norm_triton(x, w, 1e-5)
    ref = rms_norm_reference(x, w, 1e-5)
    assert y.dtype == ref.dtype and y.shape == ref.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert torch.allclose(y.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("shape,dtype", [((3, 5, 64), torch.float32), ((7, 576), torch.float16),
                                         ((2, 3, 96), torch.float16)])
def test_add_rms_norm_matches_reference(shape, dtype):
    """The residual add inside the norm: the sum exactly as torch's (one rounding), the norm as
    rms_norm_triton's."""
    from gearshift.kernels.rmsnorm import add_rms_norm_reference, add_rms_norm_triton

    g = torch.Generator().manual_seed(shape[-1] + 1)
    x = (torch.randn(shape, generator=g) * 3).to(DEV, dtype)
    d = torch.randn(shape, generator=g).to(DEV, dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEV, dtype)
    s, y = add_rms_norm_triton(x, d, w, 1e-5)
    s_ref, y_ref = add_rms_norm_reference(x, d, w, 1e-5)
    assert torch.equal(s, s_ref) and y.shape == y_ref.shape and y.dtype == y_ref.dtype
    assert torch.equal(y, rms_norm_triton(s_ref, w, 1e-5))
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert torch.allclose(y.float(), y_ref.float(), rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="differ"):
        add_rms_norm_triton(x, d.float() if dtype != torch.float32 else d.half(), w, 1e-5)


_HALF = [torch.bfloat16] if DEV == "cuda" else []  # the interpreter truncates to bf16


@pytest.mark.parametrize("qmax,act", [(127.0, "int8"), (7.0, "int4")])
@pytest.mark.parametrize("shape,dtype", [((3, 5, 64), torch.float32), ((7, 576), torch.float16),
                                         ((2, 3, 96), torch.float16)] + [((4, 2, 4096), d) for d in _HALF])
@pytest.mark.parametrize("with_add", [False, True])
def test_norm_emits_the_quantizers_codes(shape, dtype, qmax, act, with_add):
    """The codes an RMSNorm emits for the next linear are, bit for bit, what the activation
    quantizer makes of the rows the norm stored; the stored rows do not change."""
    from gearshift.kernels.act_quant import natural_codes, quantize_act_triton
    from gearshift.kernels.rmsnorm import (add_rms_norm_codes_triton, add_rms_norm_triton, rms_norm_codes_triton)
    from gearshift.kernels.x_tiles import to_fragment_order
    from gearshift.quant.activations import ActQuantSpec

    g = torch.Generator().manual_seed(shape[-1] + int(qmax))
    x = (torch.randn(shape, generator=g) * 3).to(DEV, dtype)
    d = torch.randn(shape, generator=g).to(DEV, dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEV, dtype)
    x[0, ..., 5] = 40.0  # an outlier column sets the scale of the first rows
    if with_add:
        s, y, codes = add_rms_norm_codes_triton(x, d, w, 1e-5, qmax)
        s0, y0 = add_rms_norm_triton(x, d, w, 1e-5)
        assert torch.equal(s, s0)
    else:
        y, codes = rms_norm_codes_triton(x, w, 1e-5, qmax)
        y0 = rms_norm_triton(x, w, 1e-5)
    assert torch.equal(y, y0)
    q, sc = quantize_act_triton(y.reshape(-1, shape[-1]), ActQuantSpec(act))
    assert codes.qmax == qmax and codes.codes.dtype == torch.int8
    assert torch.equal(codes.codes, q) and torch.equal(codes.scales, sc)
    assert codes.codes.abs().max().item() == int(qmax)
    # the codes alone (the next linear takes them): the normed rows are not stored, the rest the same
    if with_add:
        s1, none, alone = add_rms_norm_codes_triton(x, d, w, 1e-5, qmax, normed=False)
        assert torch.equal(s1, s0)
    else:
        none, alone = rms_norm_codes_triton(x, w, 1e-5, qmax, normed=False)
    assert none is None and torch.equal(alone.codes, q) and torch.equal(alone.scales, sc)
    # in the int8 fragment block's column order (`CodesSpec.fragment_order`): the same codes, each 8 permuted
    fo = (add_rms_norm_codes_triton(x, d, w, 1e-5, qmax, fragment_order=True)[2] if with_add
          else rms_norm_codes_triton(x, w, 1e-5, qmax, fragment_order=True)[1])
    assert fo.fragment_order and torch.equal(fo.codes, to_fragment_order(q)) and torch.equal(natural_codes(fo), q)
    assert torch.equal(fo.scales, sc)


def test_norm_codes_need_an_integer_range():
    from gearshift.kernels.rmsnorm import rms_norm_codes_triton

    x = torch.randn(2, 64, device=DEV)
    with pytest.raises(ValueError, match="qmax"):
        rms_norm_codes_triton(x, torch.ones(64, device=DEV), 1e-5, 448.0)


@pytest.mark.parametrize("m,add", [(9, False), (13, True), (16, True), (3, False), (5, True)])
def test_norm_x_tile_outputs_are_the_row_outputs_in_the_fragment_layout(m, add):
    """tiles=True: the same normed bits in `x_tiles`' layout (`to_x_tiles` of the row-order output, whose
    padding rows the norm leaves unwritten: the fragment kernel never reads them), and the residual sum
    unchanged."""
    from gearshift.kernels.rmsnorm import add_rms_norm_triton
    from gearshift.kernels.x_tiles import XTiles, to_x_tiles

    g = torch.Generator().manual_seed(m)
    x = (torch.randn(m, 256, generator=g) * 3).to(DEV, torch.float16)
    d = torch.randn(m, 256, generator=g).to(DEV, torch.float16)
    w = (1 + 0.1 * torch.randn(256, generator=g)).to(DEV, torch.float16)
    if add:
        s, y = add_rms_norm_triton(x, d, w, 1e-5)
        s_t, y_t = add_rms_norm_triton(x, d, w, 1e-5, tiles=True)
        assert torch.equal(s_t, s)
    else:
        y, y_t = rms_norm_triton(x, w, 1e-5), rms_norm_triton(x, w, 1e-5, tiles=True)
    assert isinstance(y_t, XTiles) and y_t.shape == (m, 256) and y_t.tokens == m
    assert y_t.data.shape == to_x_tiles(y).shape and torch.equal(y_t.rows(), y)
    with pytest.raises(ValueError, match="x-tile"):
        rms_norm_triton(torch.zeros(2, 96, device=DEV, dtype=torch.float16), w[:96], 1e-5, tiles=True)
