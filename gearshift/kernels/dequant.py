"""Int4 store -> dense bf16/fp16 weight in one Triton pass (for the dequant + cuBLAS strategy).

The dense weight is a transient buffer of one layer, written and read once per call: at large
M the GEMM's compute dwarfs that 2.5-bytes-per-weight round trip, and cuBLAS' bf16 GEMM is the
fastest tensor-core path torch has. Each program takes a [BN rows, GPP groups] block, loads the
scales and mins once per (row, group), and turns nibbles into floats with the exponent trick (bits
of 2^23 | q, minus 2^23; exact) instead of I2F. Measured on the H100 (benchmarks/dequant.py): the
pass runs at 0.86-0.92 of the copy bandwidth with the default tile, and no tile of the sweep beats
it by more than 6% on any shape, so at M >= 1024 this path trails cuBLAS on a dense copy by the
dequantization's memory time (~7 ms per 32-layer step), not by a slow kernel.
Reference: `Int4Weight.dequantize`.
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, cdiv, next_pow2, tl, triton
from gearshift.quant.int4 import BLOCKS16, Int4Weight

#: (rows, groups per program, warps): the best single tile over the four Llama-3-8B shapes in
#: benchmarks/dequant.py's sweep (results/dequant_*.json)
DEFAULT_TILE = (16, 1, 4)

if HAS_TRITON:
    from gearshift.kernels.tiles import blocks16_row_offset

    @triton.jit
    def _dequant_int4_kernel(qw_ptr, s_ptr, mn_ptr, w_ptr, N, K, G: tl.constexpr, BN: tl.constexpr,
                             GPP: tl.constexpr, BLOCKS: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_g = tl.program_id(1)
        HG: tl.constexpr = G // 2  # bytes of one row's group
        n_groups = K // G
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_g = pid_g * GPP + tl.arange(0, GPP)
        offs_b = tl.arange(0, HG)
        rmask = offs_n < N
        gmask = rmask[:, None] & (offs_g[None, :] < n_groups)  # [BN, GPP]
        j = offs_g[None, :, None] * HG + offs_b[None, None, :]  # byte column within the row
        if BLOCKS:  # quant.int4.blocks16_from_rows
            q_off = blocks16_row_offset(offs_n, K)[:, None, None] + (j // 64) * 1024 + j % 64
        else:
            q_off = offs_n[:, None, None] * (K // 2) + j
        qw = tl.load(qw_ptr + q_off, mask=gmask[:, :, None], other=0).to(tl.int32)
        sg = offs_n[:, None] * n_groups + offs_g[None, :]
        sc = tl.load(s_ptr + sg, mask=gmask, other=0.0).to(tl.float32)[:, :, None]
        mn = tl.load(mn_ptr + sg, mask=gmask, other=0.0).to(tl.float32)[:, :, None]
        # 0x4B000000 is 2^23: its low mantissa bits take the nibble exactly.
        qe = ((qw & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        qo = ((qw >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        w = tl.reshape(tl.join(qe * sc + mn, qo * sc + mn), (BN, GPP * G))
        offs_k = pid_g * GPP * G + tl.arange(0, GPP * G)
        omask = rmask[:, None] & (offs_k[None, :] < K)
        tl.store(w_ptr + offs_n[:, None] * K + offs_k[None, :], w.to(w_ptr.dtype.element_ty), mask=omask)


def dequant_int4_triton(store: Int4Weight, dtype: torch.dtype, out: torch.Tensor | None = None,
                        tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """Dense [N, K] weight of `dtype`; `tile` = (rows, groups, warps) per program."""
    n, k, g = store.out_features, store.in_features, store.group_size
    if g % 2 or (g // 2) & (g // 2 - 1):
        raise ValueError(f"the dequant kernel needs a power-of-two group size, got {g}")
    w = out if out is not None else torch.empty((n, k), device=store.qweight.device, dtype=dtype)
    bn, gpp, warps = tile or DEFAULT_TILE
    gpp = max(1, min(gpp, next_pow2(k // g)))
    grid = (cdiv(n, bn), cdiv(k // g, gpp))
    _dequant_int4_kernel[grid](store.qweight, store.scales, store.mins, w, n, k, G=g, BN=bn, GPP=gpp,
                               BLOCKS=store.layout == BLOCKS16, num_warps=warps)
    return w


def dequant_int4_reference(store: Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    return store.dequantize(dtype)
