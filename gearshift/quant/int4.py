"""Group-wise int4 weights: the store that W4A16, W4A8 and W4A4 all read.

Every value is `w = q * scale + min` with `q` in 0..15 and one fp16 (scale, min) pair per
`group_size` consecutive input channels of a row. One formula holds all three sources exactly:
asymmetric round-to-nearest with an integer zero point z (min = -z*scale), symmetric
(min = -8*scale) and llama.cpp's Q4_1 blocks (scale d, min m), which load without
re-quantizing. Two values share a byte: column 2j in the low nibble, 2j+1 in the high one.

Optional `row_units` (one power of two per row, from `quantize_int4_progressive`): every scale
is t * unit and every min is -tz * unit with small integers t, tz chosen so that each weight is
an int8 value t * q - tz times its row's unit. The fp16 scales and mins hold these exactly, so
every kernel reads the same weights; the int8 wgmma kernel (`kernels/w4a8_progressive.py`) uses
the integer form and needs no per-group rescaling (QServe's progressive group quantization).
"""

from __future__ import annotations

import torch

from gearshift.quant.base import WeightFormat, register_format

SCALE_DTYPE = torch.float16


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] integers in 0..15 -> [N, K//2] uint8 (even column low nibble)."""
    if q.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even number of columns, got {q.shape[-1]}")
    q = q.to(torch.uint8)
    return (q[..., 0::2] & 0x0F) | ((q[..., 1::2] & 0x0F) << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[N, K//2] uint8 -> [N, K] uint8 in 0..15."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


ROWS = "rows"  # [N, K/2]: row n's bytes contiguous
BLOCKS16 = "blocks16"  # the same bytes as 1 KB chunks per (16 rows, 128 columns)
LAYOUTS = (ROWS, BLOCKS16)


def blocks16_from_rows(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] rows -> blocks16: chunk (r, b) = rows 16r..16r+15, columns 128b..128b+127, i.e. their
    64-byte row pieces one after another (byte (n, j) at (n // 16 * K/128 + j // 64) * 1024 +
    n % 16 * 64 + j % 64). Why: a warp of the small-M fragment kernel loads 16 bytes per lane from
    8 rows at once; in this layout those 512 bytes are contiguous (fewer L1/L2 requests), and the
    tl.dot kernels still read whole 64-byte pieces."""
    n, hk = packed.shape
    if n % 16 or hk % 64:
        raise ValueError(f"the blocks16 layout needs N % 16 == 0 and K % 128 == 0, got {n}x{hk * 2}")
    return packed.reshape(n // 16, 16, hk // 64, 64).transpose(1, 2).contiguous().reshape(n, hk)


def rows_from_blocks16(packed: torch.Tensor) -> torch.Tensor:
    n, hk = packed.shape
    return packed.reshape(n // 16, hk // 64, 16, 64).transpose(1, 2).contiguous().reshape(n, hk)


def blocks16_fits(n: int, k: int) -> bool:
    return n % 16 == 0 and k % 128 == 0


@register_format
class Int4Weight(WeightFormat):
    format_name = "int4g"
    weight_bits = 4

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int,
                 symmetric: bool = False, layout: str = ROWS, row_units: torch.Tensor | None = None):
        out_features, half_k = qweight.shape
        super().__init__(out_features, half_k * 2)
        if qweight.dtype != torch.uint8:
            raise TypeError("int4 qweight must be uint8")
        n_groups = self.in_features // group_size
        if self.in_features % group_size or scales.shape != (out_features, n_groups) or mins.shape != scales.shape:
            raise ValueError(
                f"int4 store shapes disagree: qweight {tuple(qweight.shape)}, scales {tuple(scales.shape)}, "
                f"mins {tuple(mins.shape)}, group {group_size}")
        if layout not in LAYOUTS:
            raise ValueError(f"unknown int4 layout {layout!r}; known: {', '.join(LAYOUTS)}")
        if layout == BLOCKS16 and not blocks16_fits(out_features, self.in_features):
            raise ValueError(f"the blocks16 layout needs N % 16 == 0 and K % 128 == 0, got "
                             f"{out_features}x{self.in_features}")
        self.group_size = int(group_size)
        self.symmetric = bool(symmetric)
        self.layout = layout
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("mins", mins)
        if row_units is not None:
            check_row_units(scales, mins, row_units)
        self.register_buffer("row_units", row_units)

    def rows_qweight(self) -> torch.Tensor:
        """qweight in the row layout, whatever this store's layout."""
        return self.qweight if self.layout == ROWS else rows_from_blocks16(self.qweight)

    def to_layout(self, layout: str) -> "Int4Weight":
        """The same weights in `layout` (a new store sharing scales and mins; self if already so).
        The layout changes which kernels can run and how fast, never a result."""
        if layout == self.layout:
            return self
        q = blocks16_from_rows(self.qweight) if layout == BLOCKS16 else self.rows_qweight()
        return Int4Weight(q, self.scales, self.mins, self.group_size, self.symmetric, layout, self.row_units)

    def unpacked(self) -> torch.Tensor:
        return unpack_int4(self.rows_qweight())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        q = self.unpacked().reshape(n, k // self.group_size, self.group_size).float()
        w = q * self.scales.float().unsqueeze(-1) + self.mins.float().unsqueeze(-1)
        return w.reshape(n, k).to(dtype)

    def int8_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(t, tz) [N, K / G] int32 of a store with row units: scale = t * unit, min = -tz * unit."""
        if self.row_units is None:
            raise ValueError("this int4 store has no row units (quantize it with quantize_int4_progressive)")
        u = self.row_units.float()[:, None]
        return (self.scales.float() / u).to(torch.int32), (-self.mins.float() / u).to(torch.int32)

    def int8_weights(self) -> torch.Tensor:
        """[N, K] int8 t * q - tz of a store with row units: the weights are these times the row's unit."""
        t, tz = self.int8_factors()
        g = self.group_size
        q = self.unpacked().to(torch.int32)
        w8 = q * t.repeat_interleave(g, 1) - tz.repeat_interleave(g, 1)
        return w8.to(torch.int8)

    def meta(self) -> dict:
        m = {"group_size": self.group_size, "symmetric": self.symmetric}
        if self.layout != ROWS:
            m["layout"] = self.layout
        if self.row_units is not None:
            m["row_units"] = True
        return m

    @classmethod
    def from_state(cls, tensors, meta):
        return cls(tensors["qweight"], tensors["scales"], tensors["mins"], int(meta["group_size"]),
                   bool(meta.get("symmetric", False)), meta.get("layout", ROWS), tensors.get("row_units"))

    def extra_repr(self) -> str:
        kind = "sym" if self.symmetric else "asym"
        lay = "" if self.layout == ROWS else f", {self.layout}"
        prog = ", int8 row units" if self.row_units is not None else ""
        return f"{self.out_features}x{self.in_features}, int4 g{self.group_size} {kind}{lay}{prog}"


#: the int8 weights t * q - tz stay within +-INT8_LIMIT for every code q in 0..15
INT8_LIMIT = 127
#: t <= 15: with t = 16 no zero point keeps 16 * (0..15) - tz inside +-127
MAX_T = 15


def check_row_units(scales: torch.Tensor, mins: torch.Tensor, row_units: torch.Tensor) -> None:
    """Raise unless every scale is t * unit and every min -tz * unit exactly, with integers
    0 <= t <= 15 and tz such that t * q - tz is an int8 value for every q in 0..15."""
    if row_units.shape != (scales.shape[0],) or row_units.dtype != torch.float32:
        raise ValueError(f"row_units must be fp32 [{scales.shape[0]}], got {row_units.dtype} {tuple(row_units.shape)}")
    u = row_units
    mant, _ = torch.frexp(u)
    if not bool(((mant == 0.5) & (u > 0)).all()):
        raise ValueError("row_units must be positive powers of two")
    t = scales.float() / u[:, None]
    tz = -mins.float() / u[:, None]
    exact = (t == t.round()) & (tz == tz.round()) & (t.round() * u[:, None] == scales.float())
    ok = exact & (t >= 0) & (t <= MAX_T) & (tz <= INT8_LIMIT) & (15 * t - tz <= INT8_LIMIT)
    if not bool(ok.all()):
        bad = int((~ok).sum())
        raise ValueError(f"{bad} int4 groups are not exact int8 multiples of their row unit "
                         "(scale = t * unit with t in 0..15, min = -tz * unit, |t * q - tz| <= 127)")


def quantize_int4(weight: torch.Tensor, group_size: int = 128, symmetric: bool = False,
                  values: torch.dtype | None = None) -> Int4Weight:
    """Round-to-nearest group-wise int4 of a dense [out, in] weight.

    values: round the scales and mins to that dtype's values (the loader asks for torch.bfloat16) and
    choose the codes for the rounded pair. The large-M W4A16 kernel then dequantizes the store in packed
    bf16 math, which is exact only on such stores (`w4a16_wgmma.packed_exact`): 3-7% of a 64-2048-token
    step on the H100 (docs/kernels_history.md, stop 46). The weight error does not move (0.1006 / 0.1650
    relative on Gaussian / t(3) weights with and without)."""
    n, k = weight.shape
    if k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of the int4 group size {group_size}")
    w = weight.detach().float().reshape(n, k // group_size, group_size)

    def rounded(t: torch.Tensor) -> torch.Tensor:
        return (t if values is None else t.to(values)).to(SCALE_DTYPE)

    def positive(scale: torch.Tensor) -> torch.Tensor:
        # a group of zeros (or of values below SCALE_DTYPE's range) gets the smallest normal scale, not 0:
        # a zero scale made the codes and the min NaN, and the layer's outputs with them
        return torch.where(scale > 0, scale, torch.finfo(SCALE_DTYPE).tiny)

    if symmetric:
        scale = positive(rounded(w.abs().amax(-1) / 7.0))
        zero = torch.full_like(scale, 8.0, dtype=torch.float32)
    else:
        wmax = w.amax(-1).clamp_min(0.0)
        wmin = w.amin(-1).clamp_max(0.0)
        scale = positive(rounded((wmax - wmin) / 15.0))
        zero = torch.round(-wmin / scale.float()).clamp(0, 15)
    s = scale.float().unsqueeze(-1)
    mins = rounded(-zero * scale.float())
    if values is None:
        q = torch.round(w / s) + zero.unsqueeze(-1)
    else:  # the codes for the min as stored (-zero * scale rounded to `values`)
        q = torch.round((w - mins.float().unsqueeze(-1)) / s)
    q = torch.clamp(q, 0, 15).to(torch.uint8).reshape(n, k)
    return Int4Weight(pack_int4(q), scale, mins, group_size, symmetric=symmetric)


def quantize_int4_progressive(weight: torch.Tensor, group_size: int = 128) -> Int4Weight:
    """Group-wise asymmetric int4 whose groups are exact int8 multiples of a per-row power of two
    (QServe's progressive group quantization, with the int8 level kept implicit).

    Per row, unit = the power of two at or above max|w| / 112. Per group, the step t (1..15 units)
    and zero point z (kept where t * (0..15 - z) stays in int8) are the pair of least squared
    error among round((max - min) / 15) +- 1 and round(-min / t) +- 1; codes round to nearest.
    The weights are then (t * q - t * z) * unit: a W4A16 kernel reads them through the fp16 scale
    t * unit and min -t * z * unit (both exact), the int8 kernel as t * q - tz. Relative weight
    error against `quantize_int4` (plain round-to-nearest, no search; docs/kernels_history.md, stop 19):
    0.091 vs 0.094 on SmolLM2-135M's linears (group 64), 0.098 vs 0.101 on Gaussian weights, 0.174
    vs 0.165 on heavy-tailed t(3) ones (an outlier sets its whole row's unit)."""
    n, k = weight.shape
    if k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of the int4 group size {group_size}")
    w = weight.detach().float()
    amax = w.abs().amax(1).clamp_min(1e-30)
    unit = torch.exp2(torch.ceil(torch.log2(amax / 112.0))).clamp_min(2.0 ** -24)
    wu = (w / unit[:, None]).reshape(n, k // group_size, group_size)
    wmax = wu.amax(-1).clamp_min(0.0)
    wmin = wu.amin(-1).clamp_max(0.0)
    t0 = torch.round((wmax - wmin) / 15.0)
    best = None
    for dt in (0, -1, 1):
        t = torch.clamp(t0 + dt, 1, MAX_T)
        z0 = torch.round(-wmin / t)
        for dz in (0, -1, 1):
            z = torch.minimum(torch.maximum(z0 + dz, torch.ceil(15 - INT8_LIMIT / t)), torch.floor(INT8_LIMIT / t))
            z = z.clamp(0, 15)
            q = torch.clamp(torch.round(wu / t.unsqueeze(-1)) + z.unsqueeze(-1), 0, 15)
            err = ((t.unsqueeze(-1) * (q - z.unsqueeze(-1)) - wu) ** 2).sum(-1)
            if best is None:
                best = (err, t, z, q)
            else:
                better = err < best[0]
                best = (torch.where(better, err, best[0]), torch.where(better, t, best[1]),
                        torch.where(better, z, best[2]), torch.where(better.unsqueeze(-1), q, best[3]))
    _, t, z, q = best
    scale = (t * unit[:, None]).to(SCALE_DTYPE)
    mins = (-(t * z) * unit[:, None]).to(SCALE_DTYPE)
    return Int4Weight(pack_int4(q.to(torch.uint8).reshape(n, k)), scale, mins, group_size, row_units=unit.float())
