"""GEARBX per-row symmetric quantization (paper section 5): layouts, round trips, bounds, floors."""

import pytest
import torch

from gearshift.errors import GearshiftError
from gearshift.quant.base import build_format
from gearshift.quant.int4 import Int4Weight, unpack_int4
from gearshift.quant.int8 import Int8Weight
from gearshift.quant.rowwise import (QMAX, RowwiseWeight, pack_rowwise, packed_row_bytes, quantize_rowwise,
                                     quantize_rowwise_q, rowwise_scales_of, unpack_rowwise)

BITS = (8, 6, 4, 2)


def _bytes(t):
    return t.view(torch.uint8).tolist() if t.dtype == torch.int8 else t.tolist()


# ---- exact layouts on hand-written examples ------------------------------------------------

def test_int2_layout():
    # u = q + 2 = [1, 2, 3, 3]; element 0 in bits 0-1: 0b11_11_10_01 = 0xF9
    assert pack_rowwise(torch.tensor([[-1, 0, 1, 1]]), 2).tolist() == [[0xF9]]
    assert pack_rowwise(torch.tensor([[0, 0, 0, 0]]), 2).tolist() == [[0xAA]]  # u = 2 everywhere


def test_int4_layout():
    # offset +8, first element in the low nibble
    assert pack_rowwise(torch.tensor([[-7, 7]]), 4).tolist() == [[0xF1]]
    assert pack_rowwise(torch.tensor([[0, -1, 3, -2]]), 4).tolist() == [[0x78, 0x6B]]


def test_int6_layout():
    # u = q + 32 = [1, 63, 32, 33]; word = u0 | u1<<6 | u2<<12 | u3<<18 = 0x860FC1, little-endian bytes
    assert pack_rowwise(torch.tensor([[-31, 31, 0, 1]]), 6).tolist() == [[0xC1, 0x0F, 0x86]]
    assert pack_rowwise(torch.tensor([[0, 0, 0, 0]]), 6).tolist() == [[0x20, 0x08, 0x82]]


def test_int8_layout():
    p = pack_rowwise(torch.tensor([[-127, 5, 0, 127]]), 8)
    assert p.dtype == torch.int8
    assert _bytes(p) == [[129, 5, 0, 127]]  # one signed (two's complement) byte per value


def test_padding_layout_k_not_multiple_of_4():
    # K = 5, int2: second byte holds [1, pad, pad, pad] with pad q = 0 (u = 2)
    p = pack_rowwise(torch.tensor([[1, -1, 0, 1, 1]]), 2)
    assert p.tolist() == [[0xE7, 0xAB]]
    # K = 1, int6: [5, pad, pad, pad] -> u = [37, 32, 32, 32]
    assert pack_rowwise(torch.tensor([[5]]), 6).tolist() == [[0x25, 0x08, 0x82]]
    assert unpack_rowwise(torch.tensor([[0x25, 0x08, 0x82]], dtype=torch.uint8), 6, 1).tolist() == [[5]]
    # odd K, int4: the last high nibble is padding q = 0 (stored 8)
    assert pack_rowwise(torch.tensor([[1, 2, 3]]), 4).tolist() == [[0xA9, 0x8B]]


@pytest.mark.parametrize("bits", BITS)
def test_packed_row_bytes(bits):
    per = {8: (1, 1), 4: (2, 1), 6: (4, 3), 2: (4, 1)}[bits]
    for k in (1, 2, 3, 4, 5, 7, 8, 13, 4096):
        assert packed_row_bytes(bits, k) == -(-k // per[0]) * per[1]


# ---- round trips --------------------------------------------------------------------------

@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7, 8, 13, 64, 130])
def test_pack_unpack_round_trip(bits, k):
    g = torch.Generator().manual_seed(bits * 1000 + k)
    qmax = QMAX[bits]
    q = torch.randint(-qmax, qmax + 1, (7, k), generator=g).to(torch.int8)
    q[0, 0], q[-1, -1] = -qmax, qmax  # the extremes are always present
    p = pack_rowwise(q, bits)
    assert p.shape == (7, packed_row_bytes(bits, k))
    back = unpack_rowwise(p, bits, k)
    assert back.dtype == torch.int8
    assert torch.equal(back, q)


def test_round_trip_leading_dims():
    q = torch.randint(-31, 32, (2, 3, 9), generator=torch.Generator().manual_seed(1)).to(torch.int8)
    assert torch.equal(unpack_rowwise(pack_rowwise(q, 6), 6, 9), q)


def test_pack_refuses_bad_input():
    with pytest.raises(GearshiftError):
        pack_rowwise(torch.tensor([[2]]), 2)  # int2 is ternary
    with pytest.raises(GearshiftError):
        pack_rowwise(torch.tensor([[-8]]), 4)  # symmetric: -7..7 only
    with pytest.raises(GearshiftError):
        pack_rowwise(torch.tensor([[0.5]]), 8)
    with pytest.raises(GearshiftError):
        pack_rowwise(torch.tensor([[0]]), 3)
    with pytest.raises(GearshiftError):
        unpack_rowwise(torch.zeros(1, 2, dtype=torch.uint8), 6, 4)  # 4 int6 values need 3 bytes


# ---- quantization -------------------------------------------------------------------------

def _weight(dtype, n=16, k=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[3] *= 20.0  # rows of very different ranges
    w[5, 7] = 0.9  # an outlier
    return w.to(dtype)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_error_bound_half_scale(bits, dtype):
    w = _weight(dtype)
    store = quantize_rowwise(w, bits)
    s = rowwise_scales_of(store)
    err = (w.float() - store.dequantize(torch.float32)).abs()
    # |W - q s| <= s/2 (tiny slack for the fp32 rounding of W/s and q*s)
    assert (err <= s.unsqueeze(1) * (0.5 + 1e-5)).all()


@pytest.mark.parametrize("bits", [8, 6, 2])
def test_scale_is_row_max_over_qmax(bits):
    w = _weight(torch.float32)
    store = quantize_rowwise(w, bits)
    torch.testing.assert_close(store.scales, w.abs().amax(1) / QMAX[bits], rtol=0, atol=0)
    q = store.qweight if bits == 8 else store.unpacked()
    # the row maximum maps to +-qmax exactly
    assert torch.equal(q.abs().amax(1).long(), torch.full((w.shape[0],), QMAX[bits]))


def test_store_types():
    w = _weight(torch.float16)
    assert isinstance(quantize_rowwise(w, 8), Int8Weight)
    assert isinstance(quantize_rowwise(w, 4), Int4Weight)
    for bits in (6, 2):
        st = quantize_rowwise(w, bits)
        assert isinstance(st, RowwiseWeight) and st.bits == bits and st.weight_bits == bits


def test_int4_is_the_gearbx_nibble_layout():
    w = _weight(torch.float16)
    st = quantize_rowwise(w, 4)
    k = w.shape[1]
    assert st.group_size == k and st.symmetric and st.scales.shape == (w.shape[0], 1)
    assert st.scales.dtype == torch.float16
    # min = -8 * scale exactly, and the stored nibble is q + 8 (GEARBX int4 offset)
    assert torch.equal(st.mins, -8 * st.scales)
    q, _ = quantize_rowwise_q(w, 4, scales=st.scales.float().squeeze(1))
    assert torch.equal(unpack_int4(st.qweight).to(torch.int16), q.to(torch.int16) + 8)
    assert torch.equal(unpack_rowwise(st.qweight, 4, k), q)
    # dequantization is exactly q * s (no fp error from the min term)
    assert torch.equal(st.dequantize(), q.float() * st.scales.float())
    # the fp16 scale is the row max / 7 rounded up (never below it, at most one fp16 ulp above)
    s = w.float().abs().amax(1) / 7
    s16 = st.scales.float().squeeze(1)
    assert (s16 >= s).all() and (s16 <= s * (1 + 2 ** -10)).all()


def test_int4_refuses_odd_k():
    with pytest.raises(GearshiftError):
        quantize_rowwise(torch.randn(4, 7), 4)


@pytest.mark.parametrize("bits", [6, 2])
@pytest.mark.parametrize("k", [5, 13, 99])
def test_int6_int2_pad_k_not_multiple_of_4(bits, k):
    w = torch.randn(3, k, generator=torch.Generator().manual_seed(k))
    st = quantize_rowwise(w, bits)
    assert st.packed.shape == (3, packed_row_bytes(bits, k))
    deq = st.dequantize()
    assert deq.shape == (3, k)
    assert ((w - deq).abs() <= st.scales.unsqueeze(1) * (0.5 + 1e-6)).all()


@pytest.mark.parametrize("bits", BITS)
def test_scale_floors(bits):
    z16 = torch.zeros(2, 8, dtype=torch.float16)
    z32 = torch.zeros(2, 8, dtype=torch.float32)
    zbf = torch.zeros(2, 8, dtype=torch.bfloat16)
    s16 = rowwise_scales_of(quantize_rowwise(z16, bits))
    s32 = rowwise_scales_of(quantize_rowwise(z32, bits))
    sbf = rowwise_scales_of(quantize_rowwise(zbf, bits))
    if bits == 4:  # stored as fp16, rounded up
        assert torch.all(s16 >= 1e-4) and torch.all(s16 <= 1e-4 * (1 + 2 ** -10))
        assert torch.all(s32 > 0) and torch.all(s32 <= 1e-7)  # 1e-8 rounds up to the smallest fp16 subnormal
    else:
        assert torch.allclose(s16, torch.full_like(s16, 1e-4), rtol=1e-6, atol=0)
        assert torch.allclose(s32, torch.full_like(s32, 1e-8), rtol=1e-6, atol=0)
        assert torch.allclose(sbf, torch.full_like(sbf, 1e-8), rtol=1e-6, atol=0)
    for z in (z16, z32, zbf):
        assert torch.equal(quantize_rowwise(z, bits).dequantize(), torch.zeros(2, 8))


def test_scale_floor_binds_small_rows_and_override():
    w = torch.full((1, 8), 1e-5, dtype=torch.float16)  # max/qmax = 7.9e-8 < 1e-4
    st = quantize_rowwise(w, 8)
    assert float(st.scales[0]) == pytest.approx(1e-4)
    assert torch.equal(st.qweight, torch.zeros(1, 8, dtype=torch.int8))  # |W| < s/2 -> 0
    st = quantize_rowwise(w.float(), 8)  # fp32 floor is 1e-8: max/qmax wins
    assert float(st.scales[0]) == pytest.approx(float(w[0, 0]) / 127, rel=1e-6)
    st = quantize_rowwise(w.float(), 8, scale_floor=1e-3)
    assert float(st.scales[0]) == pytest.approx(1e-3)


@pytest.mark.parametrize("bits", [6, 2])
def test_rowwise_state_round_trip(bits):
    st = quantize_rowwise(torch.randn(5, 13, generator=torch.Generator().manual_seed(3)), bits)
    tensors = {k: v.clone() for k, v in st.state_dict().items()}
    back = build_format(st.format_name, tensors, st.meta())
    assert isinstance(back, RowwiseWeight) and back.bits == bits and back.in_features == 13
    assert torch.equal(back.dequantize(), st.dequantize())
    assert st.nbytes() == 5 * packed_row_bytes(bits, 13) + 5 * 4


def test_bytes_per_param_table5():
    w = torch.randn(256, 1024)
    for bits, per_param in ((8, 1.0), (6, 0.75), (4, 0.5), (2, 0.25)):
        st = quantize_rowwise(w, bits)
        weight_bytes = st.qweight.numel() if bits in (8, 4) else st.packed.numel()
        assert weight_bytes == per_param * w.numel()


def test_rejects_bad_weights():
    with pytest.raises(GearshiftError):
        quantize_rowwise(torch.randn(8), 8)
    with pytest.raises(GearshiftError):
        quantize_rowwise(torch.ones(2, 4, dtype=torch.int32), 8)
    with pytest.raises(GearshiftError):
        quantize_rowwise(torch.randn(2, 4), 5)
