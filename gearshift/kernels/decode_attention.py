"""Attention for decode steps and short verify passes (1..64 query tokens per sequence) as one
Triton launch (GPU), with its torch reference.

Why: at a few query tokens torch's SDPA (cuDNN on the H100) runs a prefill-shaped kernel plus a
reduction kernel per layer. Here each program takes one query token, one KV head (its GQA group of
query heads) and one chunk of keys (flash-decoding); its partial softmax state goes to a workspace,
and the chunk that arrives last for a (token, KV head) combines the chunks in chunk order and
stores the heads' outputs. Arrival counters are the split-K reduction's (`splitk.py`), so no
program ever waits for another and the grid needs no residency. Optionally (`qmax`) the KV head
that arrives last for a token reads the token's whole output row back and quantizes it with the
quantizer's helpers (`act_quant.row_codes`): the o projection's W4A8 / W4A4 codes, the same bits as
`quantize_act_triton` on the stored row (measured no cheaper than the quantizer's own launch; off
in the engine by default, `switches.decode_attention_codes_on`).

Numerics are fixed per token: its chunks follow from its own key count (`KV_CHUNK` keys each, or
longer chunks beyond `MAX_SPLITS` of them) and the block size is a constant, so a token's output
depends neither on the batch, nor on the other tokens of the pass, nor on the attention bucket
(QSPEC's verify pass and plain decoding attend a token identically).
Key j is visible to a token whose cache slot is p iff j <= p and j < upto; padding tokens, whose
slot is the cache's scratch slot past every key, see all `upto` keys (their rows are discarded).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gearshift.kernels._triton import HAS_TRITON, cdiv, interpreting, next_pow2, tl, triton
from gearshift.kernels.act_quant import ActCodes, codes_buffers
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled
from gearshift.kernels.splitk import zeroed_words
from gearshift.kernels.switches import attention_launch
from gearshift.kernels.tile_room import empty_rows
from gearshift.kernels.x_tiles import XTiles, x_tile_rows

#: query tokens per sequence up to which the engine runs this kernel (decode, QSPEC draft and verify
#: passes); longer passes (prefill) run SDPA, whose tiles reuse each key over many queries. From how
#: many sequences it runs, and where it lets the o projection in: the switches
#: `decode_attention_min_batch` / `decode_attention_launch` (kernels/switches.py)
MAX_QUERY_TOKENS = 64
#: keys per program and per inner block: constants, so that a token's result never depends on how
#: many keys the launch covers (`upto` is a CUDA-graph bucket)
KV_CHUNK = 256
KV_BLOCK = 64
#: at most this many chunks per token and KV head: longer contexts take longer chunks (the combine
#: reads every chunk's partial one after another)
MAX_SPLITS = 8
WARPS = 4
STAGES = 3


def decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               slots: torch.Tensor, upto: int) -> torch.Tensor:
    """q [B, T, H, D]; k_cache / v_cache [B, KV, S, D] (one layer's cache); slots [B, T], each
    token's own cache slot. Returns [B, T, H * D] in q's dtype (SDPA in fp32)."""
    b, t, h, d = q.shape
    keys, values = k_cache[:, :, :upto].float(), v_cache[:, :, :upto].float()
    visible = torch.arange(upto, device=q.device).view(1, 1, 1, upto) <= slots.view(b, 1, t, 1)
    out = F.scaled_dot_product_attention(q.float().transpose(1, 2), keys, values, attn_mask=visible,
                                         enable_gqa=keys.shape[1] != h)
    return out.transpose(1, 2).reshape(b, t, h * d).to(q.dtype)


if HAS_TRITON:
    from gearshift.kernels.act_quant import row_codes
    from gearshift.kernels.pdl import grid_wait, launch_dependents
    from gearshift.kernels.x_tiles import x_tile_offsets

    @triton.jit
    def _dot(a, b, F32_DOT: tl.constexpr):
        """F32_DOT: the operands' exact fp32 values (Triton 3.9's interpreter gets bf16 dots wrong)."""
        if F32_DOT:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, slot_ptr, out_ptr, ws_ptr, stat_ptr, cnt_ptr,
                                 codes_ptr, scales_ptr, T, upto, n_chunks, sm_scale,
                                 sq_b, sq_t, sq_h, sk_b, sk_h, sk_s, so_row, s_codes,
                                 G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, HD: tl.constexpr,
                                 HDP: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, MAX_SPLITS: tl.constexpr,
                                 SPLIT: tl.constexpr,
                                 CODES: tl.constexpr,
                                 QMAX: tl.constexpr, PDL: tl.constexpr, LAUNCH: tl.constexpr, F32_DOT: tl.constexpr,
                                 YT: tl.constexpr = False, FO: tl.constexpr = False):
        """Program (token row, KV head, key chunk). ws [rows, KV, chunks, G, D] fp32 partial outputs,
        stat [rows, KV, chunks, 2, GP] (running max in log2 units, sum of exponentials);
        cnt: rows * KV chunk arrivals, then rows KV-head arrivals (zero between launches). YT: out in
        `x_tiles`' layout (for an o projection whose kernel reads it; no codes then)."""
        if LAUNCH == 0:
            launch_dependents(PDL)
        grid_wait(PDL)
        row = tl.program_id(0)
        kvh = tl.program_id(1)
        chunk = tl.program_id(2)
        n_kv = tl.num_programs(1)
        b = row // T
        t = row % T
        n_keys = tl.minimum(tl.load(slot_ptr + row).to(tl.int32) + 1, upto)
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b * sq_b + t * sq_t + (kvh * G + g)[:, None] * sq_h + d[None, :],
                    mask=(g < G)[:, None], other=0.0)
        m = tl.full((GP,), float("-inf"), tl.float32)
        l_sum = tl.zeros((GP,), tl.float32)
        acc = tl.zeros((GP, D), tl.float32)
        qk_scale = sm_scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
        kv_base = b * sk_b + kvh * sk_h
        # the token's own chunking, from its own key count only: CHUNK keys per chunk, longer chunks
        # (multiples of BLOCK) where that would make more than MAX_SPLITS; programs past it idle
        clen = tl.maximum(tl.cdiv(tl.cdiv(n_keys, MAX_SPLITS), BLOCK) * BLOCK, CHUNK)
        own = tl.cdiv(n_keys, clen)
        start = chunk * clen
        stop = tl.minimum(start + clen, n_keys)
        for j0 in range(start, stop, BLOCK):
            j = j0 + tl.arange(0, BLOCK)
            jm = j < stop
            k = tl.load(k_ptr + kv_base + j[:, None] * sk_s + d[None, :], mask=jm[:, None], other=0.0)
            s = _dot(q, tl.trans(k), F32_DOT) * qk_scale
            s = tl.where(jm[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.math.exp2(m - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_sum = l_sum * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + kv_base + j[:, None] * sk_s + d[None, :], mask=jm[:, None], other=0.0)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, F32_DOT)
            m = m_new
        if LAUNCH == 1:
            launch_dependents(PDL)
        pair = row * n_kv + kvh
        last = (own == 1) & (chunk == 0)
        if SPLIT:
            if (own > 1) & (chunk < own):  # partials to the workspace; the chunk that arrives last combines
                part = pair * n_chunks + chunk
                tl.store(ws_ptr + (part * G + g)[:, None] * D + d[None, :], acc, mask=(g < G)[:, None])
                tl.store(stat_ptr + part * 2 * GP + g, m)
                tl.store(stat_ptr + part * 2 * GP + GP + g, l_sum)
                tl.debug_barrier()  # every thread's partial is written before the counter moves
                last = tl.atomic_add(cnt_ptr + pair, 1, sem="acq_rel", scope="gpu") == own - 1
                if last:
                    tl.atomic_xchg(cnt_ptr + pair, 0, sem="relaxed", scope="gpu")
                    m = tl.full((GP,), float("-inf"), tl.float32)
                    for c in range(0, own):
                        m = tl.maximum(m, tl.load(stat_ptr + (pair * n_chunks + c) * 2 * GP + g,
                                                  cache_modifier=".cg"))
                    l_sum = tl.zeros((GP,), tl.float32)
                    acc = tl.zeros((GP, D), tl.float32)
                    for c in range(0, own):  # chunk order: the sums do not depend on arrival order
                        pc = pair * n_chunks + c
                        w = tl.math.exp2(tl.load(stat_ptr + pc * 2 * GP + g, cache_modifier=".cg") - m)
                        l_sum += tl.load(stat_ptr + pc * 2 * GP + GP + g, cache_modifier=".cg") * w
                        acc += tl.load(ws_ptr + (pc * G + g)[:, None] * D + d[None, :], mask=(g < G)[:, None],
                                       other=0.0, cache_modifier=".cg") * w[:, None]
        if last:
            o = (acc / l_sum[:, None]).to(out_ptr.dtype.element_ty)
            col = (kvh * G + g)[:, None] * D + d[None, :]
            if YT:
                tl.store(out_ptr + x_tile_offsets(row, col, HD // 128), o, mask=(g < G)[:, None])
            else:
                tl.store(out_ptr + row * so_row + col, o, mask=(g < G)[:, None])
            if CODES:  # the token's last KV head quantizes the whole row, as the quantizer would
                tl.debug_barrier()
                cnt_row = cnt_ptr + tl.num_programs(0) * n_kv + row
                if tl.atomic_add(cnt_row, 1, sem="acq_rel", scope="gpu") == n_kv - 1:
                    tl.atomic_xchg(cnt_row, 0, sem="relaxed", scope="gpu")
                    offs = tl.arange(0, HDP)
                    y = tl.load(out_ptr + row * so_row + offs, mask=offs < HD, other=0.0, cache_modifier=".cg")
                    row_codes(y, codes_ptr + row * s_codes, scales_ptr + row, offs, offs < HD, QMAX, FO)


def decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                            upto: int, qmax: float | None = None, codes_dtype: torch.dtype = torch.int8,
                            chunk: int = KV_CHUNK, block: int = KV_BLOCK, max_splits: int = MAX_SPLITS,
                            warps: int = WARPS, stages: int = STAGES,
                            tiles: bool = False,
                            fragment_order: bool = False) -> tuple[torch.Tensor | XTiles, ActCodes | None]:
    """`decode_attention_reference` as one launch: (out [B, T, H * D], codes or None). qmax: also
    emit out's per-token integer codes in that range and `codes_dtype` (what `quantize_act_triton`
    makes of out, bit for bit) for an o projection that takes them. chunk / block / max_splits /
    warps / stages: for timing (a token's bits depend on the first three). tiles: out as `XTiles`
    (for an o projection whose kernel reads the fragment layout; its padding rows are left unwritten:
    the fragment kernel never reads them). fragment_order: int8 codes in `S8_FRAGMENT_ORDER`
    (`CodesSpec.fragment_order`)."""
    b, t, h, d = q.shape
    n_kv = k_cache.shape[1]
    if h % n_kv or d != next_pow2(d) or d < 16 or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError(f"decode attention needs H % KV == 0, a power-of-two head size >= 16 and unit "
                         f"last strides (got H={h}, KV={n_kv}, D={d})")
    if chunk % block or block < 16 or max_splits < 1:
        raise ValueError(f"chunk ({chunk}) must be a multiple of block ({block}) >= 16, max_splits >= 1")
    if q.dtype not in (torch.bfloat16, torch.float16) or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"decode attention runs bf16 / fp16 q and caches of that dtype, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    if k_cache.stride() != v_cache.stride():
        raise ValueError("the K and V caches must share one layout")
    if not 1 <= upto <= k_cache.shape[2]:
        raise ValueError(f"upto={upto} outside the cache's {k_cache.shape[2]} slots")
    g = h // n_kv
    rows = b * t
    slots = slots.reshape(rows).contiguous()  # the kernel reads token row's slot at offset row
    if tiles and (qmax is not None or (h * d) % 128):
        raise ValueError(f"x-tile outputs are rows of a multiple of 128 columns, without codes; got H * D = {h * d}")
    out = (torch.empty((x_tile_rows(rows), h * d), device=q.device, dtype=q.dtype) if tiles
           else empty_rows(rows, h * d, q.dtype, q.device))
    n_chunks = min(cdiv(upto, chunk), max_splits)  # the most any token of the launch splits into
    gp = max(16, next_pow2(g))  # tl.dot wants 16 rows
    ws = torch.empty((rows * n_kv * n_chunks * g * d,) if n_chunks > 1 else (1,), device=q.device,
                     dtype=torch.float32)
    stat = torch.empty((rows * n_kv * n_chunks * 2 * gp,) if n_chunks > 1 else (1,), device=q.device,
                       dtype=torch.float32)
    cnt = zeroed_words("decode_attention", q.device, rows * (n_kv + 1))
    codes, scales, s_codes = codes_buffers(rows, h * d, qmax, out, codes_dtype, fragment_order)
    launch = attention_launch(rows)
    pdl = pdl_enabled(out) and launch != "off"
    _decode_attention_kernel[(rows, n_kv, n_chunks)](
        q, k_cache, v_cache, slots, out, ws, stat, cnt, codes, scales, t, upto, n_chunks, 1.0 / math.sqrt(d),
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), s_codes, G=g, GP=gp, D=d, HD=h * d, HDP=next_pow2(h * d), CHUNK=chunk, BLOCK=block, MAX_SPLITS=max_splits,
        SPLIT=n_chunks > 1, CODES=qmax is not None, FO=fragment_order,
        QMAX=qmax or 0.0, PDL=pdl, LAUNCH=0 if launch == "start" else 1, F32_DOT=interpreting(), YT=tiles,
        num_warps=warps, num_stages=stages, **launch_kwargs(pdl))
    if tiles:
        return XTiles(out, (b, t, h * d)), None
    return out.view(b, t, h * d), (None if qmax is None else ActCodes(codes, scales, qmax, fragment_order))
