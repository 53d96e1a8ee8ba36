import pytest
import torch

from gearshift.model.quant_linear import concat_rows
from gearshift.quant import DenseWeight, Int4Weight, Int8Weight, quantize_int4, quantize_int8
from gearshift.quant.base import build_format
from gearshift.quant.int4 import pack_int4, unpack_int4


def test_int4_pack_layout_and_round_trip():
    q = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.tolist() == [[0x21, 0x0F]]  # column 2j low nibble, 2j+1 high nibble
    r = torch.randint(0, 16, (7, 64), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(r)), r)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group", [32, 128])
def test_int4_quantize_error_bound(symmetric, group):
    torch.manual_seed(0)
    w = torch.randn(48, 256)
    q = quantize_int4(w, group, symmetric=symmetric)
    assert q.qweight.shape == (48, 128) and q.scales.shape == (48, 256 // group)
    err = (q.dequantize() - w).abs().reshape(48, -1, group)
    # half a step, plus fp16 rounding of the stored min
    bound = q.scales.float().unsqueeze(-1) * 0.5 + 1e-3 * q.scales.float().unsqueeze(-1) * 16
    assert (err <= bound).all()
    codes = unpack_int4(q.qweight)
    if symmetric:
        assert torch.allclose(q.mins.float(), -8 * q.scales.float())
    assert codes.max() <= 15


def test_int4_zero_point_is_integer_and_exact_grid():
    w = torch.randn(4, 32) + 0.3
    q = quantize_int4(w, 32)
    z = -q.mins.float() / q.scales.float()
    assert torch.allclose(z, z.round(), atol=2e-2)  # fp16 storage of min = -z*s
    # dequantized values lie on the q*s + m grid
    deq = q.dequantize()
    steps = (deq - q.mins.float().repeat_interleave(32, 1)) / q.scales.float().repeat_interleave(32, 1)
    assert torch.allclose(steps, steps.round(), atol=1e-3)


@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_bf16_values_make_packed_dequantization_exact(symmetric):
    """The loader's int4 scales and mins are bf16 values (`values=torch.bfloat16`), the codes are chosen
    for them, the error stays that of plain RTN, and the large-M kernel's packed dequantization is exact
    on the store under bf16 and fp16 activations."""
    from gearshift.kernels.w4a16_wgmma import packed_exact
    from gearshift.model.loader import quantize_store

    torch.manual_seed(0)
    w = torch.randn(64, 512) * 0.02
    plain = quantize_int4(w, 128, symmetric=symmetric)
    q = quantize_int4(w, 128, symmetric=symmetric, values=torch.bfloat16)
    for t in (q.scales, q.mins):
        assert torch.equal(t.to(torch.bfloat16).float(), t.float())
    assert packed_exact(q.scales, q.mins, torch.bfloat16) and packed_exact(q.scales, q.mins, torch.float16)
    err = (q.dequantize() - w).abs().reshape(64, -1, 128)
    assert (err <= q.scales.float().unsqueeze(-1) * (0.5 + 2.0 ** -8 * 16)).all()
    rel = lambda st: ((st.dequantize() - w).norm() / w.norm()).item()  # noqa: E731
    assert rel(q) <= 1.01 * rel(plain)
    by_loader = quantize_store(w, "int4-sym" if symmetric else "int4", 128)
    assert torch.equal(by_loader.qweight, q.qweight) and torch.equal(by_loader.scales, q.scales)


@pytest.mark.parametrize("values", [None, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_groups_of_zeros_stay_finite(symmetric, values):
    """A group of zeros, or of values below the scales' fp16 range, quantizes to (near) zero: its scale
    used to round to 0, which made the min and every output of the layer NaN."""
    w = torch.randn(4, 256) * 0.02
    w[0, :128] = 0.0
    w[1, 128:] = 1e-9
    q = quantize_int4(w, 128, symmetric=symmetric, values=values)
    d = q.dequantize().float()
    assert torch.isfinite(d).all() and torch.isfinite(q.mins.float()).all() and (q.scales > 0).all()
    assert d[0, :128].abs().max() == 0 and d[1, 128:].abs().max() < 1e-4


def test_int4_rejects_bad_group():
    with pytest.raises(ValueError):
        quantize_int4(torch.randn(4, 96), 64)


def test_int8_round_trip():
    w = torch.randn(16, 64)
    q = quantize_int8(w)
    assert q.qweight.dtype == torch.int8
    assert ((q.dequantize() - w).abs() <= q.scales.unsqueeze(1) * 0.5 + 1e-6).all()


@pytest.mark.parametrize("make", [lambda w: quantize_int4(w, 32), lambda w: quantize_int8(w), lambda w: DenseWeight(w)])
def test_state_round_trip_and_concat(make):
    a, b = make(torch.randn(8, 64)), make(torch.randn(4, 64))
    rebuilt = build_format(a.format_name, dict(a.named_buffers()), a.meta())
    assert torch.equal(rebuilt.dequantize(), a.dequantize())
    both = concat_rows([a, b])
    assert both.out_features == 12
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


def test_nbytes_measured_from_tensors():
    q = quantize_int4(torch.randn(64, 256), 128)
    assert q.nbytes() == 64 * 128 + 2 * (64 * 2 * 2)
    assert isinstance(q, Int4Weight) and isinstance(quantize_int8(torch.randn(2, 8)), Int8Weight)


def test_requantizing_a_dequantized_model_warns(model_dir, capsys):
    from gearshift.model.loader import load_model, quantize_linears

    lm = load_model(model_dir("tiny", hidden_size=1024, intermediate_size=1024), progress=False)
    quantize_linears(lm, "int4", 32, progress=False)
    assert "look already quantized" not in capsys.readouterr().err
    for _, lin in lm.model.linear_layers():  # expand int4 back to dense, as a dequantized export would
        if lin.store.format_name != "dense":
            lin.set_store(DenseWeight(lin.store.dequantize()))
    quantize_linears(lm, "int4", 32, progress=False)
    assert "look already quantized" in capsys.readouterr().err
    assert lm.info["prequantized_linears"]


def test_quantizing_a_dequantized_checkpoint_at_load_warns(model_dir, tmp_path, capsys):
    """The same warning where the linears are quantized as they are built (an unquantized checkpoint)."""
    from gearshift.model.checkpoint import save_checkpoint
    from gearshift.model.loader import load_model, quantize_linears

    lm = load_model(model_dir("tiny", hidden_size=1024, intermediate_size=1024), progress=False)
    quantize_linears(lm, "int4", 32, progress=False)
    for _, lin in lm.model.linear_layers():
        if lin.store.format_name != "dense":
            lin.set_store(DenseWeight(lin.store.dequantize()))
    save_checkpoint(lm, tmp_path / "dequantized")
    capsys.readouterr()
    again = load_model(tmp_path / "dequantized", quantize="int4", group_size=32, progress=False)
    assert "look already quantized" in capsys.readouterr().err
    assert again.info["prequantized_linears"] and again.weight_summary().get("dense") == 1
