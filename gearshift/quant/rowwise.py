"""GEARBX per-row symmetric quantization (paper section 5) and its packed layouts.

For a weight ``W`` of shape [out, in] and a bit width b with ``qmax`` = 127 / 31 / 7 / 1 for
b = 8 / 6 / 4 / 2 (paper table 4)::

    s_i  = max(max_j |W_ij| / qmax, s_floor)        s_floor: 1e-4 fp16 source, 1e-8 fp32 source
    q_ij = clamp(round(W_ij / s_i), -qmax, qmax)
    W~_ij = q_ij * s_i                              |W_ij - W~_ij| <= s_i / 2

Packing (paper 5.2 and table 10 offsets), always row by row so every row starts on a byte:

* int8: one signed byte per value (``torch.int8``).
* int4: two values per byte, stored nibble ``u = q + 8``; element 2j in the low nibble, 2j+1 in
  the high nibble.  This is bit-for-bit the layout of :class:`~gearshift.quant.int4.Int4Weight`
  (its ``q`` is our ``u``), which is why 4-bit GEARBX weights are returned as an ``Int4Weight``
  with one group per row, ``scale = s`` and ``min = -8 s``: the existing int4 GPU kernels serve
  the GEARBX low gear without a new format.
* int6: four values in three bytes, ``u = q + 32``; the 24-bit little-endian word
  ``u0 | u1 << 6 | u2 << 12 | u3 << 18`` is stored as bytes ``[w & 0xFF, w >> 8 & 0xFF, w >> 16]``.
* int2: four values per byte, ``u = q + 2`` (so -1/0/1 -> 1/2/3), element 4j in bits 0-1,
  4j+1 in bits 2-3, 4j+2 in bits 4-5, 4j+3 in bits 6-7.

Rows whose length is not a multiple of the values-per-group (2 for int4, 4 for int6/int2) are
**padded** with q = 0 (stored as the offset) at the end of each row; ``unpack_rowwise`` takes
``in_features`` and drops the padding.  Padding per row (not across rows) keeps every row
byte-aligned so a kernel can address row i at ``i * row_bytes``.  ``quantize_rowwise(w, 4)``
refuses an odd ``in_features`` instead, because the ``Int4Weight`` store and its kernels need
an even K (no real model has an odd projection width).
"""

from __future__ import annotations

import math

import torch

from gearshift.errors import GearshiftError
from gearshift.quant.base import WeightFormat, register_format
from gearshift.quant.int4 import SCALE_DTYPE as INT4_SCALE_DTYPE
from gearshift.quant.int4 import Int4Weight, pack_int4
from gearshift.quant.int8 import Int8Weight

#: paper table 4: the largest magnitude of the signed integer for each bit width
QMAX: dict[int, int] = {8: 127, 6: 31, 4: 7, 2: 1}
#: paper table 10 "Integer offsets": stored unsigned field = q + offset (int8 is stored signed)
OFFSET: dict[int, int] = {4: 8, 6: 32, 2: 2}
#: (values, bytes) of one packing group per bit width
_GROUP: dict[int, tuple[int, int]] = {8: (1, 1), 4: (2, 1), 6: (4, 3), 2: (4, 1)}

#: paper 5.1 / table 10 "Scale floors": 1e-4 for an fp16 source, 1e-8 for an fp32 source.
#: bf16 (not in the paper) takes 1e-8: the floor only has to keep s_i a usable divisor and
#: q*s_i representable in the source dtype.  fp16 needs 1e-4 because below ~6e-5 it is
#: subnormal (few mantissa bits) and reconstructed values q*s_i underflow; bf16 has fp32's
#: 8-bit exponent (normal down to ~1.2e-38), and the scale is computed and applied in fp32, so
#: fp32's floor is the right one.  Any other dtype (fp64) also takes 1e-8.
SCALE_FLOORS: dict[torch.dtype, float] = {
    torch.float16: 1e-4,
    torch.float32: 1e-8,
    torch.bfloat16: 1e-8,
    torch.float64: 1e-8,
}


def _check_bits(bits: int) -> int:
    bits = int(bits)
    if bits not in QMAX:
        raise GearshiftError(f"GEARBX row-wise quantization supports 8, 6, 4 or 2 bits, not {bits}")
    return bits


def scale_floor_for(dtype: torch.dtype) -> float:
    """The scale floor for a weight of this source dtype (see ``SCALE_FLOORS``)."""
    return SCALE_FLOORS.get(dtype, 1e-8)


def packed_row_bytes(bits: int, in_features: int) -> int:
    """Bytes one packed row of ``in_features`` values occupies (including the row's padding)."""
    values, nbytes = _GROUP[_check_bits(bits)]
    return math.ceil(int(in_features) / values) * nbytes


def rowwise_scales(weight: torch.Tensor, bits: int, scale_floor: float | None = None) -> torch.Tensor:
    """fp32 per-row scales ``s_i = max(max_j |W_ij| / qmax, floor)`` of a [..., K] weight."""
    bits = _check_bits(bits)
    floor = scale_floor_for(weight.dtype) if scale_floor is None else float(scale_floor)
    return (weight.detach().float().abs().amax(-1) / QMAX[bits]).clamp_min(floor)


def quantize_rowwise_q(weight: torch.Tensor, bits: int, scale_floor: float | None = None,
                       scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Signed integers ``q`` (int8, [..., K]) and fp32 scales ([...]) of paper eq. 5.1.

    ``scales`` overrides the computed scales (the int4 path passes its fp16-rounded ones so that
    ``q`` is rounded against the scale that is actually stored)."""
    bits = _check_bits(bits)
    s = rowwise_scales(weight, bits, scale_floor) if scales is None else scales.float()
    qmax = QMAX[bits]
    q = torch.clamp(torch.round(weight.detach().float() / s.unsqueeze(-1)), -qmax, qmax)
    return q.to(torch.int8), s


def pack_rowwise(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack signed integers [..., K] (|q| <= qmax) into the GEARBX layout of ``bits``.

    Returns int8 [..., K] for 8 bits (one signed byte each) and uint8
    [..., packed_row_bytes(bits, K)] otherwise.  Out-of-range values raise."""
    bits = _check_bits(bits)
    qmax = QMAX[bits]
    if q.dtype.is_floating_point:
        if not torch.equal(q, torch.round(q)):
            raise GearshiftError("pack_rowwise needs integer values")
    qi = q.to(torch.int32)
    if qi.numel() and (int(qi.min()) < -qmax or int(qi.max()) > qmax):
        raise GearshiftError(f"int{bits} values must lie in [-{qmax}, {qmax}], got "
                             f"[{int(qi.min())}, {int(qi.max())}]")
    if bits == 8:
        return qi.to(torch.int8)
    values, _ = _GROUP[bits]
    k = qi.shape[-1]
    pad = (-k) % values
    if pad:
        qi = torch.nn.functional.pad(qi, (0, pad))  # q = 0 in the padding
    u = qi + OFFSET[bits]  # 0 <= u < 2**bits
    if bits == 4:
        return pack_int4(u)
    u = u.reshape(*u.shape[:-1], u.shape[-1] // 4, 4)
    if bits == 2:
        byte = u[..., 0] | (u[..., 1] << 2) | (u[..., 2] << 4) | (u[..., 3] << 6)
        return byte.to(torch.uint8)
    # bits == 6: 24-bit little-endian word of four 6-bit fields -> three bytes
    word = u[..., 0] | (u[..., 1] << 6) | (u[..., 2] << 12) | (u[..., 3] << 18)
    out = torch.stack((word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF), dim=-1)
    return out.reshape(*out.shape[:-2], -1).to(torch.uint8)


def unpack_rowwise(packed: torch.Tensor, bits: int, in_features: int) -> torch.Tensor:
    """Inverse of :func:`pack_rowwise`: signed int8 [..., in_features] (padding dropped)."""
    bits = _check_bits(bits)
    k = int(in_features)
    expected = packed_row_bytes(bits, k)
    if packed.shape[-1] != expected:
        raise GearshiftError(f"packed int{bits} rows of {k} values need {expected} bytes, "
                             f"got {packed.shape[-1]}")
    if bits == 8:
        return packed.view(torch.int8) if packed.dtype == torch.uint8 else packed.to(torch.int8)
    if packed.dtype != torch.uint8:
        raise GearshiftError(f"packed int{bits} weights must be uint8, got {packed.dtype}")
    p = packed.to(torch.int32)
    if bits == 4:
        u = torch.stack((p & 0x0F, p >> 4), dim=-1)
    elif bits == 2:
        u = torch.stack((p & 3, (p >> 2) & 3, (p >> 4) & 3, (p >> 6) & 3), dim=-1)
    else:  # 6
        p = p.reshape(*p.shape[:-1], p.shape[-1] // 3, 3)
        word = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
        u = torch.stack((word & 63, (word >> 6) & 63, (word >> 12) & 63, (word >> 18) & 63), dim=-1)
    u = u.reshape(*u.shape[:-2], -1)[..., :k]
    return (u - OFFSET[bits]).to(torch.int8)


@register_format
class RowwiseWeight(WeightFormat):
    """GEARBX per-row symmetric int6 / int2 store: ``w = q * scales[row]``.

    Buffers: ``packed`` uint8 [out, packed_row_bytes(bits, in)] in the layout of
    :func:`pack_rowwise` and ``scales`` fp32 [out].  (int4 and int8 are served by
    ``Int4Weight`` / ``Int8Weight``; this class accepts them too, for the format's own tests and
    for checkpoints, but :func:`quantize_rowwise` never builds one for 4 or 8 bits.)"""

    format_name = "rowwise"

    def __init__(self, bits: int, packed: torch.Tensor, scales: torch.Tensor, in_features: int):
        bits = _check_bits(bits)
        out_features = packed.shape[0]
        super().__init__(out_features, in_features)
        if packed.dim() != 2 or packed.shape[1] != packed_row_bytes(bits, in_features):
            raise GearshiftError(f"row-wise int{bits} store: packed {tuple(packed.shape)} does not hold "
                                 f"{out_features} rows of {in_features} values")
        if scales.shape != (out_features,):
            raise GearshiftError(f"row-wise store needs scales [{out_features}], got {tuple(scales.shape)}")
        #: instance attribute shadows the ClassVar: one class serves every row-wise bit width
        self.weight_bits = bits
        self.bits = bits
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales.float())

    def unpacked(self) -> torch.Tensor:
        """The signed integers q, int8 [out, in]."""
        return unpack_rowwise(self.packed, self.bits, self.in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.unpacked().float() * self.scales.unsqueeze(1)).to(dtype)

    def meta(self) -> dict:
        return {"bits": self.bits, "in_features": self.in_features}

    @classmethod
    def from_state(cls, tensors, meta):
        return cls(int(meta["bits"]), tensors["packed"], tensors["scales"], int(meta["in_features"]))

    def extra_repr(self) -> str:
        return f"{self.out_features}x{self.in_features}, int{self.bits} per-row symmetric"


def _round_up_fp16(s: torch.Tensor) -> torch.Tensor:
    """fp32 scales -> fp16, rounded toward +inf so that no |W| <= qmax*s clips after rounding."""
    h = s.to(torch.float16)
    if torch.isinf(h).any():
        raise GearshiftError("a row's int4 scale exceeds the fp16 range (|W| > 4.5e5)")
    low = h.float() < s
    if low.any():
        h = torch.where(low, torch.nextafter(h, torch.full_like(h, math.inf)), h)
    return h


def quantize_rowwise(weight: torch.Tensor, bits: int, scale_floor: float | None = None) -> WeightFormat:
    """GEARBX per-row symmetric quantization of a dense [out, in] weight.

    * 8 bits -> :class:`Int8Weight` (int8 q, fp32 scales): the mid gear.
    * 4 bits -> :class:`Int4Weight` with ``group_size = in_features``, ``symmetric=True``,
      ``scales = s`` and ``mins = -8 s`` (fp16): the low gear, read by the existing int4
      kernels.  The stored nibble is ``q + 8``, exactly GEARBX's int4 layout.  Because the
      store keeps fp16 scales, ``s`` is rounded *up* to fp16 before ``q`` is computed, so the
      bound ``|W - deq| <= s/2`` holds for the stored ``s`` and nothing clips; ``-8 s`` is exact
      in fp16 and ``q*s - 8s`` is exact in fp32, so dequantization equals ``(u - 8) * s``.
    * 6 / 2 bits -> :class:`RowwiseWeight` (fp32 scales).

    ``scale_floor`` defaults to the floor of the weight's dtype (``SCALE_FLOORS``)."""
    bits = _check_bits(bits)
    if weight.dim() != 2:
        raise GearshiftError(f"quantize_rowwise needs a 2-D [out, in] weight, got shape {tuple(weight.shape)}")
    if not weight.dtype.is_floating_point:
        raise GearshiftError(f"quantize_rowwise needs a floating-point weight, got {weight.dtype}")
    n, k = weight.shape
    s = rowwise_scales(weight, bits, scale_floor)
    if bits == 4:
        if k % 2:
            raise GearshiftError(f"int4 row-wise weights need an even in_features (Int4Weight), got {k}")
        s16 = _round_up_fp16(s)
        assert s16.dtype == INT4_SCALE_DTYPE
        q, _ = quantize_rowwise_q(weight, 4, scales=s16.float())
        qweight = pack_rowwise(q, 4)
        scales = s16.unsqueeze(1)
        return Int4Weight(qweight, scales, (-8.0 * scales.float()).to(INT4_SCALE_DTYPE), group_size=k,
                          symmetric=True)
    q, s = quantize_rowwise_q(weight, bits, scales=s)
    if bits == 8:
        return Int8Weight(q, s)
    return RowwiseWeight(bits, pack_rowwise(q, bits), s, k)


def rowwise_scales_of(store: WeightFormat) -> torch.Tensor:
    """fp32 per-row scales [out] of any store :func:`quantize_rowwise` returns (for error bounds)."""
    if isinstance(store, Int4Weight):
        if store.group_size != store.in_features:
            raise GearshiftError("this int4 store is group-wise, not per-row")
        return store.scales.float().squeeze(1)
    if isinstance(store, (Int8Weight, RowwiseWeight)):
        return store.scales.float()
    raise GearshiftError(f"{type(store).__name__} is not a row-wise store")
