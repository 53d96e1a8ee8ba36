"""W4A16 GEMV for one token: int32 words, magic-number unpack, deterministic split-K.

The int4 floor at M = 1 is set by bytes, so the kernel's job is to keep ~2 MB of weight reads
in flight while spending at most ~3 instructions per weight. Per word (8 weights) it issues one
16-byte-vector share of a load, 8 LOP3 + 8 FMA to unpack (`int4_unpack.nibble_f32`, no slow
I2F), 8 FMA against the token's inputs, and 2 FMA to apply the group's scale and min to the
word's partial dot: acc[n, w] += s[n] * sum_i q_i x_i + m[n] * sum_i x_i. Rows share the
unpacked inputs, so x costs ~1/R instructions per weight for R rows per thread. A tile never
straddles a scale group (BK divides the group). Small matrices split K over programs to fill
the GPU; the last program of each row block sums the partials in a fixed order
(`splitk.splitk_finish`), so the result is the same on every run and there is one launch.
DPR: P_W = (4), P_X = (16) on FP32 FMA.
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, cdiv, tl, triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.splitk import splitk_buffers
from gearshift.kernels.tiles import rows_only
from gearshift.quant.int4 import ROWS, Int4Weight

if HAS_TRITON:
    from gearshift.kernels.int4_unpack import ONE_BITS, nibble_f32, split8, word_bases
    from gearshift.kernels.splitk import splitk_finish

    @triton.jit
    def _int4_gemv_kernel(x_ptr, qw_ptr, s_ptr, mn_ptr, y_ptr, ws_ptr, cnt_ptr, N, K, one_bits,
                          G: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, SPLIT_K: tl.constexpr,
                          PREFETCH: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BN + tl.arange(0, BN)
        n_mask = offs_n < N
        offs_w = tl.arange(0, BW)
        KW = tl.multiple_of(K // 8, BW * SPLIT_K)  # int4_gemv_supports guarantees it
        kws = tl.multiple_of(KW // SPLIT_K, BW)
        n_groups = K // G
        qw32 = qw_ptr.to(tl.pointer_type(tl.int32))
        w_ptrs = qw32 + offs_n[:, None] * KW + offs_w[None, :]
        x_ptrs = x_ptr + offs_w[:, None] * 8 + tl.arange(0, 8)[None, :]
        acc = tl.zeros([BN, BW], dtype=tl.float32)
        k_lo = pid_k * kws
        k_hi = k_lo + kws
        if PREFETCH:
            w_nxt = tl.load(w_ptrs + k_lo, mask=n_mask[:, None], other=0)
        else:  # unused: each step loads its own tile
            w_nxt = tl.zeros([BN, BW], dtype=tl.int32)
        for kw0 in range(k_lo, k_hi, BW):
            kw0 = tl.multiple_of(kw0, BW)
            w = w_nxt
            if PREFETCH:  # issue the next tile's load before this tile's math: 2 tiles in flight
                w_nxt = tl.load(w_ptrs + kw0 + BW, mask=n_mask[:, None] & (kw0 + BW < k_hi), other=0)
            else:
                w = tl.load(w_ptrs + kw0, mask=n_mask[:, None], other=0)
            g = (kw0 * 8) // G
            sc = tl.load(s_ptr + offs_n * n_groups + g, mask=n_mask, other=0.0).to(tl.float32)
            mn = tl.load(mn_ptr + offs_n * n_groups + g, mask=n_mask, other=0.0).to(tl.float32)
            xv = tl.load(x_ptrs + kw0 * 8).to(tl.float32)
            x0, x1, x2, x3, x4, x5, x6, x7 = split8(tl.reshape(xv, (1, BW * 8)), 1, BW)
            lo, hi = word_bases(w, one_bits)
            d = nibble_f32(lo, hi, 0) * x0
            d += nibble_f32(lo, hi, 1) * x1
            d += nibble_f32(lo, hi, 2) * x2
            d += nibble_f32(lo, hi, 3) * x3
            d += nibble_f32(lo, hi, 4) * x4
            d += nibble_f32(lo, hi, 5) * x5
            d += nibble_f32(lo, hi, 6) * x6
            d += nibble_f32(lo, hi, 7) * x7
            xs = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
            acc += d * sc[:, None] + mn[:, None] * xs
        y = tl.sum(acc, 1)
        splitk_finish(y, y_ptr + offs_n, ws_ptr, cnt_ptr, offs_n, n_mask, pid_n, pid_k, N, SPLIT_K)


def int4_gemv_supports(store: Int4Weight, cfg: TileConfig) -> bool:
    """BK = 8*BW columns per step must tile each K slice and sit inside one scale group."""
    k, g = store.in_features, store.group_size
    bk = cfg.bk
    return (bk % 8 == 0 and g % bk == 0 and k % (bk * cfg.split_k) == 0 and store.qweight.is_contiguous()
            and store.layout == ROWS)


def int4_gemv(x: torch.Tensor, store: Int4Weight, cfg: TileConfig) -> torch.Tensor:
    """y [1, N] = x [1, K] @ dequant(W).T for a single token (cfg: bn, bk, split_k, warps, stages)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] != 1:
        raise ValueError(f"int4_gemv serves exactly one token, got {x2.shape[0]}")
    rows_only(store, "int4_gemv")
    if not int4_gemv_supports(store, cfg):
        raise ValueError(f"tile {cfg.key()} does not fit K={store.in_features}, group {store.group_size}")
    x2 = x2.contiguous()
    n, k = store.out_features, store.in_features
    y = torch.empty((1, n), device=x2.device, dtype=x2.dtype)
    grid = (cdiv(n, cfg.bn), cfg.split_k)
    ws, cnt = splitk_buffers(y, cfg.split_k, n, grid[0])
    _int4_gemv_kernel[grid](x2, store.qweight, store.scales, store.mins, y, ws, cnt, n, k, ONE_BITS, G=store.group_size,
                            BN=cfg.bn, BW=cfg.bk // 8, SPLIT_K=cfg.split_k, PREFETCH=cfg.prefetch, num_warps=cfg.warps,
                            num_stages=cfg.stages)
    return y.reshape(*x.shape[:-1], n)


def int4_gemv_reference(x: torch.Tensor, store: Int4Weight) -> torch.Tensor:
    return linear_reference(x, store, None)
