"""W4A16 on the group-wise `Int4Weight` store: int4 dequantized in registers, bf16/fp16 MMA.

Layout: the store's own [N, K//2] bytes (column 2j low nibble, 2j+1 high); no second copy.
The kernel runs swap-AB (y^T = W x^T): the weight tile [BN, BK/2] per nibble half is the
MMA's A operand, the activations' even / odd columns [BK/2, BM] are B, so one dot per half
covers both nibbles with no register shuffle. Two inner schemes (a config flag):

* scale_after (small M): dot the raw codes q (exact in bf16) with x, then per K-tile
  acc += part * scale + min * sum(x over the tile). Per-weight work is mask/shift/OR only;
  the scale costs BN x BM per tile instead of BN x BK. Needs BK | group_size.
* dequant-first (large M): w = q*scale + min per weight, then the dot (cheaper when BM > BK).

Codes become floats through mantissa bits (`int4_unpack.byte_nibbles`), not `I2F`, which runs at
16 per clock per SM and took as long as the MMA itself at BM = 128. Tiles are launched grouped
along M (`tiles.tile_offsets`) and each row's scale / min is loaded one K tile ahead.

Small M uses split-K (the deterministic one-launch reduction, `tiles.store_tile`) to fill the SMs.
The dequant-first loop runs `int4_unpack.dequant_tile` (packed inline PTX on the GPU). DPR: P_W=(4),
P_X=(16) on bf16 tensor cores (Padding of the weight to the activation type).
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, cdiv, interpreting, tl, triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.tiles import blocks_fit, rows_only, tile_buffers
from gearshift.quant.int4 import BLOCKS16, Int4Weight

if HAS_TRITON:
    from gearshift.kernels.int4_unpack import byte_nibbles, dequant_tile, offset_min
    from gearshift.kernels.tiles import (group_scales, int4_tile_pointers, k_tile_range, scales_ahead, store_tile,
                                         tile_offsets, w_tile_offset)

    @triton.jit
    def _w4a16_kernel(x_ptr, qw_ptr, s_ptr, mn_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym,
                      G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      SPLIT_K: tl.constexpr, SCALE_AFTER: tl.constexpr, JOIN: tl.constexpr, ASM: tl.constexpr,
                      BLOCKS: tl.constexpr):
        offs_n, offs_m, n_mask, m_mask = tile_offsets(N, M, BN, BM)
        t0, t1 = k_tile_range(tl.program_id(2), K, BK, SPLIT_K)
        w_ptrs, x_ptrs, xk_ptrs, sc_ptrs, mn_ptrs = int4_tile_pointers(x_ptr, qw_ptr, s_ptr, mn_ptr, offs_n, offs_m,
                                                                       K, stride_xm, G, BK, BLOCKS)
        DT: tl.constexpr = x_ptr.dtype.element_ty
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        sc_n, mn_n = group_scales(sc_ptrs, mn_ptrs, tl.minimum(t0, K // BK - 1) * BK, n_mask, G)
        for t in range(t0, t1):
            k0 = t * BK
            qw = tl.load(w_ptrs + w_tile_offset(k0, BK, BLOCKS), mask=n_mask[:, None], other=0)
            sc, mn, sc_n, mn_n = scales_ahead(sc_ptrs, mn_ptrs, sc_n, mn_n, k0, K, n_mask, G, BK)
            # codes: exact q (scale-after dots them raw) or OFFSET + q (dequant-first folds OFFSET
            # into the min), both from mantissa bits: no int->float conversion per weight
            if JOIN:  # [BN, BK] codes in column order; x tile loaded contiguous along K
                xk = tl.load(xk_ptrs + k0, mask=m_mask[None, :], other=0.0)
                if SCALE_AFTER:
                    lo, hi = byte_nibbles(qw, DT, True)
                    part = tl.dot(tl.reshape(tl.join(lo, hi), (BN, BK)), xk)
                    xsum = tl.sum(xk.to(tl.float32), 0)
                    acc += part * sc[:, None] + mn[:, None] * xsum[None, :]
                else:
                    w = dequant_tile(qw, sc, mn - 128.0 * sc, BN, BK, DT, ASM)
                    acc = tl.dot(w, xk, acc)
            else:  # even / odd columns of x against the low / high nibbles: two dots, no shuffle
                lo, hi = byte_nibbles(qw, DT, SCALE_AFTER)
                xe = tl.load(x_ptrs + k0, mask=m_mask[None, :], other=0.0)
                xo = tl.load(x_ptrs + k0 + 1, mask=m_mask[None, :], other=0.0)
                if SCALE_AFTER:
                    part = tl.dot(lo, xe)
                    part = tl.dot(hi, xo, part)
                    xsum = tl.sum(xe.to(tl.float32), 0) + tl.sum(xo.to(tl.float32), 0)
                    acc += part * sc[:, None] + mn[:, None] * xsum[None, :]
                else:
                    c = offset_min(sc, mn, DT)[:, None]
                    acc = tl.dot((lo.to(tl.float32) * sc[:, None] + c).to(DT), xe, acc)
                    acc = tl.dot((hi.to(tl.float32) * sc[:, None] + c).to(DT), xo, acc)
        store_tile(y_ptr, acc, offs_n, offs_m, n_mask, m_mask, M, N, stride_ym, ws_ptr, cnt_ptr, SPLIT_K)


    @triton.jit
    def _w4a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, mn_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                           G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                           SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr):
        """M <= BM <= 4: CUDA-core FMAs, no MMA padding to 16 rows; scale applied per tile."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_h = tl.arange(0, BK // 2)
        n_mask = offs_n < N
        n_groups = K // G
        t0, t1 = k_tile_range(pid_k, K, BK, SPLIT_K)
        w_ptrs = qw_ptr + offs_n[:, None] * (K // 2) + offs_h[None, :]
        for mi in tl.static_range(BM):
            if mi < M:
                acc = tl.zeros([BN], dtype=tl.float32)
                for t in range(t0, t1):
                    k0 = t * BK
                    qw = tl.load(w_ptrs + k0 // 2, mask=n_mask[:, None], other=0)
                    xe = tl.load(x_ptr + mi * stride_xm + k0 + 2 * offs_h).to(tl.float32)
                    xo = tl.load(x_ptr + mi * stride_xm + k0 + 2 * offs_h + 1).to(tl.float32)
                    g = k0 // G
                    sc = tl.load(s_ptr + offs_n * n_groups + g, mask=n_mask, other=0.0).to(tl.float32)
                    mn = tl.load(mn_ptr + offs_n * n_groups + g, mask=n_mask, other=0.0).to(tl.float32)
                    d = tl.sum((qw & 0xF).to(tl.float32) * xe[None, :] + (qw >> 4).to(tl.float32) * xo[None, :], 1)
                    acc += d * sc + mn * (tl.sum(xe, 0) + tl.sum(xo, 0))
                if ATOMIC:
                    tl.atomic_add(y_ptr + mi * stride_ym + offs_n, acc, mask=n_mask)
                else:
                    tl.store(y_ptr + mi * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


def w4a16_gemv(x2: torch.Tensor, store: Int4Weight, cfg: TileConfig) -> torch.Tensor:
    """GEMV-style W4A16 for M <= 4 (cfg.bm is the row cap, cfg.bn/bk/split_k the tiling)."""
    m, k = x2.shape
    if m > cfg.bm:
        raise ValueError(f"gemv config covers M <= {cfg.bm}, got {m}")
    rows_only(store, "w4a16_gemv")
    n = store.out_features
    bk = effective_bk(store, cfg)
    y = _out(x2, n, cfg.split_k)
    grid = (cdiv(n, cfg.bn), cfg.split_k)
    _w4a16_gemv_kernel[grid](x2, store.qweight, store.scales, store.mins, y, m, n, k, x2.stride(0), y.stride(0),
                             G=store.group_size, BM=cfg.bm, BN=cfg.bn, BK=bk, SPLIT_K=cfg.split_k,
                             ATOMIC=cfg.split_k > 1, num_warps=cfg.warps, num_stages=cfg.stages)
    return y if cfg.split_k == 1 else y.to(x2.dtype)


def supports(store: Int4Weight, cfg: TileConfig) -> bool:
    k, g = store.in_features, store.group_size
    bk = effective_bk(store, cfg)
    return k % bk == 0 and g % bk == 0 and bk >= 32 and blocks_fit(store, bk)


def effective_bk(store: Int4Weight, cfg: TileConfig) -> int:
    """BK may not straddle a scale group; a smaller group shrinks the tile."""
    return min(cfg.bk, store.group_size)


def _out(x2: torch.Tensor, n: int, split_k: int) -> torch.Tensor:
    if split_k > 1:
        return torch.zeros((x2.shape[0], n), device=x2.device, dtype=torch.float32)
    return torch.empty((x2.shape[0], n), device=x2.device, dtype=x2.dtype)


def w4a16_linear(x2: torch.Tensor, store: Int4Weight, cfg: TileConfig, asm: bool | None = None) -> torch.Tensor:
    """x2 [M, K] (bf16/fp16, unit stride along K) -> [M, N] in x2's dtype. `asm` picks the packed
    PTX dequant (default: on the GPU; the interpreter cannot run PTX)."""
    if x2.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"w4a16_linear takes bf16/fp16 activations, got {x2.dtype}")
    m, k = x2.shape
    n = store.out_features
    bk = effective_bk(store, cfg)
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    grid = (cdiv(n, cfg.bn), cdiv(m, cfg.bm), cfg.split_k)
    ws, cnt = tile_buffers(y, cfg.split_k, grid)
    _w4a16_kernel[grid](x2, store.qweight, store.scales, store.mins, y, ws, cnt, m, n, k, x2.stride(0), y.stride(0),
                        G=store.group_size, BM=cfg.bm, BN=cfg.bn, BK=bk, SPLIT_K=cfg.split_k,
                        SCALE_AFTER=cfg.scale_after, JOIN=cfg.join, ASM=not interpreting() if asm is None else asm,
                        BLOCKS=store.layout == BLOCKS16, num_warps=cfg.warps, num_stages=cfg.stages)
    return y


def w4a16_reference(x2: torch.Tensor, store: Int4Weight) -> torch.Tensor:
    return linear_reference(x2, store, None)
