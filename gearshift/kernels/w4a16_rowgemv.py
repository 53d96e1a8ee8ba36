"""W4A16 GEMV for one token (M = 1): one launch, no split-K, wide loads along K.

Each program owns BN output rows and walks K in chunks of BK (several int4 groups at once):
it loads BN x BK/2 packed bytes, multiplies the low / high nibbles by the even / odd inputs on
CUDA cores in fp32, reduces each group, and applies the group's scale and min once per group:
y[n] = sum_g s[n,g] * sum_{k in g} q[n,k] x[k] + m[n,g] * sum_{k in g} x[k]. No partial
results go through memory, so the output is deterministic and there is nothing to zero or
cast afterwards. DPR: P_W = (4), P_X = (16) on FP32 FMA (no tensor-core padding of M to 16).
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, cdiv, tl, triton
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.tiles import rows_only
from gearshift.quant.int4 import ROWS, Int4Weight

if HAS_TRITON:

    @triton.jit
    def _rowgemv_kernel(x_ptr, qw_ptr, s_ptr, mn_ptr, y_ptr, N, K, G: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr, NGB: tl.constexpr):
        pid = tl.program_id(0)
        offs_n = pid * BN + tl.arange(0, BN)
        n_mask = offs_n < N
        offs_h = tl.arange(0, BK // 2)
        n_groups = K // G
        w_ptrs = qw_ptr + offs_n[:, None] * (K // 2) + offs_h[None, :]
        acc = tl.zeros([BN], dtype=tl.float32)
        for k0 in range(0, K, BK):
            qw = tl.load(w_ptrs + k0 // 2, mask=n_mask[:, None], other=0)
            xe = tl.load(x_ptr + k0 + 2 * offs_h).to(tl.float32)
            xo = tl.load(x_ptr + k0 + 2 * offs_h + 1).to(tl.float32)
            p = (qw & 0xF).to(tl.float32) * xe[None, :] + (qw >> 4).to(tl.float32) * xo[None, :]
            ps = tl.sum(tl.reshape(p, (BN, NGB, BK // 2 // NGB)), 2)  # [BN, NGB] per-group dot
            xs = tl.sum(tl.reshape(xe + xo, (NGB, BK // 2 // NGB)), 1)  # [NGB] per-group input sum
            g = k0 // G + tl.arange(0, NGB)
            sc = tl.load(s_ptr + offs_n[:, None] * n_groups + g[None, :], mask=n_mask[:, None], other=0.0)
            mn = tl.load(mn_ptr + offs_n[:, None] * n_groups + g[None, :], mask=n_mask[:, None], other=0.0)
            acc += tl.sum(ps * sc.to(tl.float32) + mn.to(tl.float32) * xs[None, :], 1)
        tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


    @triton.jit
    def _smallm_kernel(x_ptr, qw_ptr, s_ptr, mn_ptr, y_ptr, M, N, K, stride_xm, stride_ym, G: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NGB: tl.constexpr):
        """2 <= M <= BM (16): dequantize a [BN, BK] tile (per-group scales broadcast along K), one
        bf16/fp16 tensor-core dot with x^T [BK, BM]; no split-K, one launch, deterministic.

        Measured SLOWER than the split-K `w4a16_tc` on the H100 (5.4 vs 4.0 ms per 32-layer step at
        M = 2..16, benchmarks/results/smallm_*.json): too few programs without split-K and a costly
        per-weight dequantization. Kept as a recorded negative result; the dispatcher never picks it."""
        pid = tl.program_id(0)
        offs_n = pid * BN + tl.arange(0, BN)
        offs_m = tl.arange(0, BM)
        n_mask = offs_n < N
        m_mask = offs_m < M
        offs_h = tl.arange(0, BK // 2)
        offs_k = tl.arange(0, BK)
        n_groups = K // G
        w_ptrs = qw_ptr + offs_n[:, None] * (K // 2) + offs_h[None, :]
        x_ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            qw = tl.load(w_ptrs + k0 // 2, mask=n_mask[:, None], other=0)
            q = tl.reshape(tl.join(qw & 0xF, qw >> 4), (BN, BK)).to(tl.float32)
            g = k0 // G + tl.arange(0, NGB)
            sc = tl.load(s_ptr + offs_n[:, None] * n_groups + g[None, :], mask=n_mask[:, None], other=0.0)
            mn = tl.load(mn_ptr + offs_n[:, None] * n_groups + g[None, :], mask=n_mask[:, None], other=0.0)
            sce = tl.reshape(tl.broadcast_to(sc.to(tl.float32)[:, :, None], (BN, NGB, BK // NGB)), (BN, BK))
            mne = tl.reshape(tl.broadcast_to(mn.to(tl.float32)[:, :, None], (BN, NGB, BK // NGB)), (BN, BK))
            xt = tl.load(x_ptrs + k0, mask=m_mask[None, :], other=0.0)
            w = (q * sce + mne).to(xt.dtype)
            acc = tl.dot(w, xt, acc)
        y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


def w4a16_smallm(x: torch.Tensor, store: Int4Weight, bn: int = 32, bk: int = 512, warps: int = 4,
                 stages: int = 3) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(W).T for 2 <= M <= 16 tokens, one launch."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    m = x2.shape[0]
    if not 1 <= m <= 16:
        raise ValueError(f"w4a16_smallm serves 1..16 tokens, got {m}")
    rows_only(store, "w4a16_smallm")
    if not rowgemv_supports(store, bk):
        raise ValueError(f"BK {bk} does not tile K={store.in_features} with group {store.group_size}")
    n, k = store.out_features, store.in_features
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    ngb = max(bk // store.group_size, 1)
    _smallm_kernel[(cdiv(n, bn),)](x2, store.qweight, store.scales, store.mins, y, m, n, k, x2.stride(0),
                                          y.stride(0), G=store.group_size, BM=16, BN=bn, BK=bk, NGB=ngb,
                                          num_warps=warps, num_stages=stages)
    return y.reshape(*x.shape[:-1], n)


def rowgemv_supports(store: Int4Weight, bk: int) -> bool:
    k, g = store.in_features, store.group_size
    return k % bk == 0 and (bk % g == 0 or g % bk == 0) and store.layout == ROWS


def w4a16_rowgemv(x: torch.Tensor, store: Int4Weight, bn: int = 16, bk: int = 512, warps: int = 4,
                  stages: int = 3) -> torch.Tensor:
    """y [1, N] = x [1, K] @ dequant(W).T for a single token."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] != 1:
        raise ValueError("w4a16_rowgemv serves exactly one token")
    rows_only(store, "w4a16_rowgemv")
    if not rowgemv_supports(store, bk):
        raise ValueError(f"BK {bk} does not tile K={store.in_features} with group {store.group_size}")
    x2 = x2.contiguous()
    n, k = store.out_features, store.in_features
    y = torch.empty((1, n), device=x2.device, dtype=x2.dtype)
    ngb = max(bk // store.group_size, 1)
    _rowgemv_kernel[(cdiv(n, bn),)](x2, store.qweight, store.scales, store.mins, y, n, k,
                                           G=store.group_size, BN=bn, BK=bk, NGB=ngb,
                                           num_warps=warps, num_stages=stages)
    return y.reshape(*x.shape[:-1], n)


def w4a16_rowgemv_reference(x: torch.Tensor, store: Int4Weight) -> torch.Tensor:
    return linear_reference(x, store, None)
