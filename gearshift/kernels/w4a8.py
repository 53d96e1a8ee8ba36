"""W4A8 on the int4 store: activations quantized per token, int4 widened in registers,
int8 (or fp8) tensor-core dots with int32 accumulators, dequant fused in the epilogue.

Per K-tile (never straddling a scale group) and output element:
    part = sum_k q[n,k] * xq[m,k]                    (int32, exact; fp32 for fp8)
    acc += part * scale[n,g] + min[n,g] * sum_k xq[m,k]
and y = acc * xscale[m]; sum_k xq over each scale group comes from the activation quantizer
(`quantize_act_triton(group_sums=G)`), so the min term is one FMA per group, not a reduction of
every x tile. The int32 partial never reaches memory, and becomes fp32 through a
magic-number add and an exact subtract per tile rather than I2F (16 per clock per SM on Hopper:
as slow as the int8 MMA itself).

The DPR partition is a pair of compile-time constants (ADAngel sections 4.2-4.3):
* W_PARTS=1, A_PARTS=1: Padding, P_W=(4) promoted to int8, P_X=(8): one int8 MMA.
* A_PARTS=2: Split, P_X=(4,4): x = 16*hi + lo, both halves promoted to int8 (Hopper has no
  int4 MMA), two int8 MMAs, reconstructed with a shift. Exact, but twice the MMA work here.
* W_PARTS=2 / 4: Bitwise-style, P_W=(2,2) or (1,1,1,1): weight bit-planes, each an int8 MMA,
  reconstructed with shifts (the paper's BMMA has no Hopper equivalent).
* FP8: P_W=(4) read as fp8 e4m3 bits (byte b is b * 2^-9, exact), P_X=(8) as fp8: one fp8 MMA.
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, cdiv, interpreting, tl, triton
from gearshift.kernels.act_quant import fused_group_sums, quantize_act_triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.tiles import blocks_fit, tile_buffers
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int4 import BLOCKS16, Int4Weight

if HAS_TRITON:
    from gearshift.kernels.int4_unpack import code_bytes
    from gearshift.kernels.tiles import (group_scales, int4_tile_pointers, k_tile_range, scales_ahead, store_tile,
                                         tile_offsets, w_tile_offset)

    @triton.jit
    def _dpr_int8(q, x, BN: tl.constexpr, BM: tl.constexpr, W_PARTS: tl.constexpr, WB: tl.constexpr,
                  A_PARTS: tl.constexpr):
        """Decompose codes q (0..15) into W_PARTS planes of WB bits and int8 x into A_PARTS parts,
        one int8 MMA per pair, reconstructed with shifts (DPR equation 7). Exact in int32."""
        pi = tl.zeros([BN, BM], dtype=tl.int32)
        for wp in tl.static_range(W_PARTS):
            if W_PARTS == 1:
                wq = q  # codes are 0..15 already
            else:
                wq = ((q >> (wp * WB)) & ((1 << WB) - 1)).to(tl.int8)
            for ap in tl.static_range(A_PARTS):
                if A_PARTS == 1:
                    pi += tl.dot(wq, x, out_dtype=tl.int32) << (wp * WB)
                elif ap == 0:  # low nibble of x, 0..15
                    pi += tl.dot(wq, x & 15, out_dtype=tl.int32) << (wp * WB)
                else:  # signed high nibble of x, -8..7
                    pi += tl.dot(wq, x >> 4, out_dtype=tl.int32) << (wp * WB + 4)
        return pi

    @triton.jit
    def _w4a8_kernel(xq_ptr, xs_ptr, xsum_ptr, qw_ptr, s_ptr, mn_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm,
                     stride_ym,
                     G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     SPLIT_K: tl.constexpr, FP8: tl.constexpr, W_PARTS: tl.constexpr, WB: tl.constexpr,
                     A_PARTS: tl.constexpr, JOIN: tl.constexpr, ASM: tl.constexpr,
                     BLOCKS: tl.constexpr):
        offs_n, offs_m, n_mask, m_mask = tile_offsets(N, M, BN, BM)
        t0, t1 = k_tile_range(tl.program_id(2), K, BK, SPLIT_K)
        w_ptrs, x_ptrs, xk_ptrs, sc_ptrs, mn_ptrs = int4_tile_pointers(xq_ptr, qw_ptr, s_ptr, mn_ptr, offs_n, offs_m,
                                                                       K, stride_xm, G, BK, BLOCKS)
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        sc_n, mn_n = group_scales(sc_ptrs, mn_ptrs, tl.minimum(t0, K // BK - 1) * BK, n_mask, G)
        xsum_ptrs = xsum_ptr + offs_m * (K // G)
        xsum_n = tl.load(xsum_ptrs + tl.minimum(t0, K // BK - 1) * BK // G, mask=m_mask, other=0.0)
        for t in range(t0, t1):
            k0 = t * BK
            qw = tl.load(w_ptrs + w_tile_offset(k0, BK, BLOCKS), mask=n_mask[:, None], other=0)
            sc, mn, sc_n, mn_n = scales_ahead(sc_ptrs, mn_ptrs, sc_n, mn_n, k0, K, n_mask, G, BK)
            xsum = xsum_n  # this tile's group sums, loaded an iteration ahead like the scales
            xsum_n = tl.load(xsum_ptrs + tl.minimum(k0 + BK, K - BK) // G, mask=m_mask, other=0.0)
            if JOIN:  # one [BN, BK] code tile against x [BK, BM] loaded contiguous along K
                qa = code_bytes(qw, BN, BK, ASM)
                xa = tl.load(xk_ptrs + k0, mask=m_mask[None, :], other=0)
                qb = qa
                xb = xa
            else:  # low nibbles x even columns + high nibbles x odd columns
                qa = qw & 0xF
                qb = qw >> 4
                xa = tl.load(x_ptrs + k0, mask=m_mask[None, :], other=0)
                xb = tl.load(x_ptrs + k0 + 1, mask=m_mask[None, :], other=0)
            if FP8:  # a byte 0..15 read as e4m3 is b * 2^-9 exactly: no conversion, 2^9 folded into the scale
                part = tl.dot(qa.to(tl.float8e4nv, bitcast=True), xa.to(tl.float8e4nv, bitcast=True))
                if not JOIN:
                    part = tl.dot(qb.to(tl.float8e4nv, bitcast=True), xb.to(tl.float8e4nv, bitcast=True), part)
                sc = sc * 512.0
            else:
                pi = _dpr_int8(qa.to(tl.int8, bitcast=True), xa, BN, BM, W_PARTS, WB, A_PARTS)
                if not JOIN:
                    pi += _dpr_int8(qb.to(tl.int8, bitcast=True), xb, BN, BM, W_PARTS, WB, A_PARTS)
                # 1.5 * 2^23 + pi read as fp32 is exact for |pi| < 2^22 (BK <= 2048): int32 -> fp32
                # with an integer add instead of I2F, and subtracting 1.5 * 2^23 again is exact too.
                # (Taking it back once per row at the end instead left ~1.3e7 * scale per tile in
                # the fp32 accumulator: 5e-3 relative error over 32 tiles.)
                part = (pi + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
            acc = acc + part * sc[:, None]
            if k0 % G == 0:  # the min term once per scale group, from the quantizer's group sums
                acc = acc + mn[:, None] * xsum[None, :]
        xs = tl.load(xs_ptr + offs_m, mask=m_mask, other=0.0)
        acc = acc * xs[None, :]
        store_tile(y_ptr, acc, offs_n, offs_m, n_mask, m_mask, M, N, stride_ym, ws_ptr, cnt_ptr, SPLIT_K)


def supports(store: Int4Weight, act: ActQuantSpec, cfg: TileConfig) -> bool:
    bk = min(cfg.bk, store.group_size)
    return (act.group_size is None and bk <= 2048 and store.in_features % bk == 0 and store.group_size % bk == 0
            and bk >= (32 if cfg.join else 64) and blocks_fit(store, bk))


def w4a8_linear(x2: torch.Tensor, store: Int4Weight, act: ActQuantSpec, cfg: TileConfig,
                w_parts: int = 1, a_parts: int = 1) -> torch.Tensor:
    """Quantize x2 [M, K] per token (Triton, with per-group code sums), then the fused int8/fp8
    GEMM. -> [M, N] in x2's dtype."""
    if fused_group_sums(x2.shape[1], store.group_size):
        xq, xs, xsum = quantize_act_triton(x2, act, group_sums=store.group_size)
    else:  # e.g. a per-row store of a wide K: the sums in torch
        (xq, xs), xsum = quantize_act_triton(x2, act), None
    return w4a8_from_codes(xq, xs, store, cfg, x2.dtype, fp8=act.dtype == "fp8", w_parts=w_parts, a_parts=a_parts,
                           xsum=xsum)


def w4a8_from_codes(xq: torch.Tensor, xs: torch.Tensor, store: Int4Weight, cfg: TileConfig, out_dtype: torch.dtype,
                    fp8: bool = False, w_parts: int = 1, a_parts: int = 1,
                    xsum: torch.Tensor | None = None) -> torch.Tensor:
    """The GEMM on given codes / scales; xsum [M, K // group] are the codes' group sums (computed
    here with torch when not given)."""
    m, k = xq.shape
    if xsum is None:
        xsum = xq.float().view(m, k // store.group_size, store.group_size).sum(-1)
    n = store.out_features
    bk = min(cfg.bk, store.group_size)
    if fp8 and (w_parts != 1 or a_parts != 1):
        raise ValueError("the fp8 path has only the trivial partition")
    if w_parts not in (1, 2, 4) or a_parts not in (1, 2):
        raise ValueError(f"unsupported partition W_PARTS={w_parts} A_PARTS={a_parts}")
    y = torch.empty((m, n), device=xq.device, dtype=out_dtype)
    grid = (cdiv(n, cfg.bn), cdiv(m, cfg.bm), cfg.split_k)
    ws, cnt = tile_buffers(y, cfg.split_k, grid)
    if fp8:
        xq = xq.view(torch.uint8)
    _w4a8_kernel[grid](xq, xs, xsum, store.qweight, store.scales, store.mins, y, ws, cnt, m, n, k, xq.stride(0),
                       y.stride(0), G=store.group_size, BM=cfg.bm, BN=cfg.bn, BK=bk, SPLIT_K=cfg.split_k, FP8=fp8,
                       W_PARTS=w_parts, WB=4 // w_parts, A_PARTS=a_parts, JOIN=cfg.join, ASM=not interpreting(),
                       BLOCKS=store.layout == BLOCKS16, num_warps=cfg.warps, num_stages=cfg.stages)
    return y


def w4a8_reference(x2: torch.Tensor, store: Int4Weight, act: ActQuantSpec) -> torch.Tensor:
    return linear_reference(x2, store, act)
