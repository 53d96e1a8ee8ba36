import pytest
import torch

from gearshift.quant.activations import ActQuantSpec, dequantize_activations, fake_quantize, quantize_activations


@pytest.mark.parametrize("dtype,qmax", [("int8", 127), ("int4", 7)])
def test_per_token_integer(dtype, qmax):
    x = torch.randn(3, 5, 64)
    spec = ActQuantSpec(dtype)
    q, s = quantize_activations(x, spec)
    assert q.dtype == torch.int8 and q.abs().max() <= qmax and s.shape == (3, 5, 1)
    assert torch.allclose(s.squeeze(-1), x.abs().amax(-1) / qmax)
    err = (dequantize_activations(q, s, spec) - x).abs()
    assert (err <= s / 2 + 1e-6).all()


def test_group_scales():
    x = torch.randn(4, 128)
    x[:, 5] = 100.0  # an outlier only spoils its own group
    spec = ActQuantSpec("int4", group_size=32)
    q, s = quantize_activations(x, spec)
    assert s.shape == (4, 4)
    err = (fake_quantize(x, spec) - x).abs()
    assert err[:, 32:].max() < err[:, :32].max()


def test_fp8():
    x = torch.randn(2, 64) * 10
    q, s = quantize_activations(x, ActQuantSpec("fp8"))
    assert q.dtype == torch.float8_e4m3fn
    rel = (fake_quantize(x, ActQuantSpec("fp8")) - x).norm() / x.norm()
    assert rel < 0.05


def test_unknown_dtype():
    with pytest.raises(ValueError):
        ActQuantSpec("int3")
