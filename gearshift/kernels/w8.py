"""W8A16 and W8A8 on the per-row `Int8Weight` store (the GEARBX mid gear and the w8 modes).

Swap-AB like the int4 kernels: the int8 weight tile [BN, BK] is the MMA's A operand.
* W8A16: codes converted to bf16/fp16 in registers (exact), one dot, row scale in the epilogue.
  DPR: P_W=(8) promoted to bf16, P_X=(16).
* W8A8: activations quantized per token to int8, int8 dot with int32 accumulator over all of K
  (|sum| <= 127*127*K fits int32 for K < 133k), epilogue y = acc * wscale[n] * xscale[m].
  DPR: P_W=(8), P_X=(8) on int8 tensor cores.
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, cdiv, tl, triton
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.tiles import tile_buffers
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int8 import Int8Weight

if HAS_TRITON:
    from gearshift.kernels.tiles import k_tile_range, store_tile, tile_offsets

    @triton.jit
    def _w8_kernel(x_ptr, xs_ptr, qw_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                   A8: tl.constexpr):
        offs_n, offs_m, n_mask, m_mask = tile_offsets(N, M, BN, BM)
        t0, t1 = k_tile_range(tl.program_id(2), K, BK, SPLIT_K)
        offs_k = tl.arange(0, BK)
        w_ptrs = qw_ptr + offs_n[:, None] * K + offs_k[None, :]
        x_ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
        if A8:
            acc_i = tl.zeros([BN, BM], dtype=tl.int32)
        else:
            acc = tl.zeros([BN, BM], dtype=tl.float32)
        for t in range(t0, t1):
            k0 = t * BK
            w = tl.load(w_ptrs + k0, mask=n_mask[:, None], other=0)
            x = tl.load(x_ptrs + k0, mask=m_mask[None, :], other=0)
            if A8:
                acc_i = tl.dot(w, x, acc_i, out_dtype=tl.int32)
            else:
                acc = tl.dot(w.to(x.dtype), x, acc)
        sc = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        if A8:
            xs = tl.load(xs_ptr + offs_m, mask=m_mask, other=0.0)
            acc = acc_i.to(tl.float32) * sc[:, None] * xs[None, :]
        else:
            acc = acc * sc[:, None]
        store_tile(y_ptr, acc, offs_n, offs_m, n_mask, m_mask, M, N, stride_ym, ws_ptr, cnt_ptr, SPLIT_K)


def supports(store: Int8Weight, act: ActQuantSpec | None, cfg: TileConfig) -> bool:
    if act is not None and (act.dtype == "fp8" or act.group_size is not None):
        return False
    return store.in_features % cfg.bk == 0 and cfg.bk >= 32


def w8_linear(x2: torch.Tensor, store: Int8Weight, act: ActQuantSpec | None, cfg: TileConfig) -> torch.Tensor:
    """W8A16 when act is None, else W8A8 (int8 or int4 activation codes in int8)."""
    m, k = x2.shape
    n = store.out_features
    if act is not None:
        xin, xs = quantize_act_triton(x2, act)
    else:
        xin, xs = x2, store.scales  # xs unused
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    grid = (cdiv(n, cfg.bn), cdiv(m, cfg.bm), cfg.split_k)
    ws, cnt = tile_buffers(y, cfg.split_k, grid)
    _w8_kernel[grid](xin, xs, store.qweight, store.scales, y, ws, cnt, m, n, k, xin.stride(0), y.stride(0),
                     BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, SPLIT_K=cfg.split_k, A8=act is not None,
                     num_warps=cfg.warps, num_stages=cfg.stages)
    return y


def w8_reference(x2: torch.Tensor, store: Int8Weight, act: ActQuantSpec | None) -> torch.Tensor:
    return linear_reference(x2, store, act)
