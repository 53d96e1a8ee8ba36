"""Int4 store -> dense bf16/fp16 weight in one Triton pass (for the dequant + cuBLAS strategy).

The dense weight is a transient buffer of one layer, written and read once per call: at large
M the GEMM's compute dwarfs that 2.5-bytes-per-weight round trip, and cuBLAS' bf16 GEMM is the
fastest tensor-core path torch has. Reference: `Int4Weight.dequantize`.
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, tl, triton
from gearshift.quant.int4 import BLOCKS16, Int4Weight

if HAS_TRITON:
    from gearshift.kernels.tiles import blocks16_row_offset

    @triton.jit
    def _dequant_int4_kernel(qw_ptr, s_ptr, mn_ptr, w_ptr, N, K, G: tl.constexpr, BN: tl.constexpr,
                             BH: tl.constexpr, BLOCKS: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_h = pid_k * BH + tl.arange(0, BH)
        mask = (offs_n[:, None] < N) & (offs_h[None, :] < K // 2)
        if BLOCKS:  # quant.int4.blocks16_from_rows
            q_off = (blocks16_row_offset(offs_n, K)[:, None]
                     + ((offs_h // 64) * 1024 + offs_h % 64)[None, :])
        else:
            q_off = offs_n[:, None] * (K // 2) + offs_h[None, :]
        qw = tl.load(qw_ptr + q_off, mask=mask, other=0)
        n_groups = K // G
        g = (pid_k * 2 * BH) // G  # a tile never straddles a group (2*BH divides G)
        sc = tl.load(s_ptr + offs_n * n_groups + g, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
        mn = tl.load(mn_ptr + offs_n * n_groups + g, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
        we = (qw & 0xF).to(tl.float32) * sc + mn
        wo = (qw >> 4).to(tl.float32) * sc + mn
        w = tl.reshape(tl.join(we, wo), (BN, 2 * BH))
        offs_k = pid_k * 2 * BH + tl.arange(0, 2 * BH)
        omask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
        tl.store(w_ptr + offs_n[:, None] * K + offs_k[None, :], w.to(w_ptr.dtype.element_ty), mask=omask)


def dequant_int4_triton(store: Int4Weight, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    n, k = store.out_features, store.in_features
    w = out if out is not None else torch.empty((n, k), device=store.qweight.device, dtype=dtype)
    bn, bh = 16, min(256, store.group_size // 2)
    while store.group_size % (2 * bh):
        bh //= 2
    grid = (triton.cdiv(n, bn), triton.cdiv(k // 2, bh))
    _dequant_int4_kernel[grid](store.qweight, store.scales, store.mins, w, n, k, G=store.group_size, BN=bn, BH=bh,
                               BLOCKS=store.layout == BLOCKS16, num_warps=4)
    return w


def dequant_int4_reference(store: Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    return store.dequantize(dtype)
