"""Ablation kernel: W4A16 with the dequantized weight as the wgmma B operand (not swap-AB).

x [BM, BK] is A (loaded to shared memory), W^T [BK, BN] is B: dequantized in registers
(`int4_unpack.dequant_tile`) and stored to shared memory, which wgmma reads directly, instead of
the swap-AB kernel's trip through shared memory back into the A-operand registers (STS + LDSM).
"""
import triton
import triton.language as tl

from gearshift.kernels.int4_unpack import dequant_tile
from gearshift.kernels.tiles import (group_scales, int4_tile_pointers, k_tile_range, scales_ahead, store_tile,
                                     tile_offsets)


@triton.jit
def w4a16_plain_b(x_ptr, qw_ptr, s_ptr, mn_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym,
                  G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr):
    offs_n, offs_m, n_mask, m_mask = tile_offsets(N, M, BN, BM)
    t0, t1 = k_tile_range(tl.program_id(2), K, BK, SPLIT_K)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    w_ptrs, _, _, sc_ptrs, mn_ptrs = int4_tile_pointers(x_ptr, qw_ptr, s_ptr, mn_ptr, offs_n, offs_m, K, stride_xm,
                                                        G, BK)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + tl.arange(0, BK)[None, :]  # x as A: [BM, BK]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    sc_n, mn_n = group_scales(sc_ptrs, mn_ptrs, tl.minimum(t0, K // BK - 1) * BK, n_mask, G)
    for t in range(t0, t1):
        k0 = t * BK
        qw = tl.load(w_ptrs + k0 // 2, mask=n_mask[:, None], other=0)
        sc, mn, sc_n, mn_n = scales_ahead(sc_ptrs, mn_ptrs, sc_n, mn_n, k0, K, n_mask, G, BK)
        w = dequant_tile(qw, sc, mn - 128.0 * sc, BN, BK, DT, True)
        xk = tl.load(x_ptrs + k0, mask=m_mask[:, None], other=0.0)
        acc = tl.dot(xk, tl.trans(w), acc)
    store_tile(y_ptr, tl.trans(acc), offs_n, offs_m, n_mask, m_mask, M, N, stride_ym, ws_ptr, cnt_ptr, SPLIT_K)
