"""RoPE of q and k plus the KV-cache write of k and v as one Triton launch per layer (GPU).

Why: at decode batch sizes each launch costs a few microseconds whatever it does; the separate
kernels (RoPE of q, RoPE of k, then the cache write) were three launches per layer, and rotated k
went to memory once only to be copied into the cache. Here each program reads one head row of the
fused qkv projection output: a q head is rotated into a contiguous q; a k head is rotated and
stored, with its v row, straight at its cache position. The rounding is that of the three-kernel
path: rotated values are rounded to the activation dtype, then converted to the cache dtype.
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, tl, triton
from gearshift.kernels.kv_write import kv_write_reference
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled, small_pdl
from gearshift.kernels.rope import rope_reference


def split_qkv(qkv: torch.Tensor, n_q: int, n_kv: int, head_dim: int):
    """Views q [B, T, n_q, D], k and v [B, T, n_kv, D] of a fused projection output [B, T, W]."""
    b, t, _ = qkv.shape
    q_end = n_q * head_dim
    kv_end = q_end + n_kv * head_dim
    return (qkv[..., :q_end].view(b, t, n_q, head_dim), qkv[..., q_end:kv_end].view(b, t, n_kv, head_dim),
            qkv[..., kv_end:].view(b, t, n_kv, head_dim))


def rope_kv_write_reference(qkv: torch.Tensor, n_q: int, n_kv: int, cos: torch.Tensor, sin: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """qkv [B, T, (n_q + 2 n_kv) D]; cos/sin [B, T, D]; caches [B, n_kv, C, D] (one layer);
    target [B, T]. Writes rotated k and v to the caches; returns rotated q [B, T, n_q, D]."""
    d = cos.shape[-1]
    q, k, v = split_qkv(qkv, n_q, n_kv, d)
    kv_write_reference(k_cache, v_cache, rope_reference(k, cos, sin).to(qkv.dtype), v, target)
    return rope_reference(q, cos, sin).to(qkv.dtype)


if HAS_TRITON:
    from gearshift.kernels.indexing import split_bth
    from gearshift.kernels.pdl import small_prologue
    from gearshift.kernels.rope import rotate_row

    @triton.jit
    def _rope_kv_write_kernel(x_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, tgt_ptr, T, HQ, HKV, sxb, sxt,
                              scb, sct, skb, skh, skp, HALF: tl.constexpr, PDL: tl.constexpr):
        small_prologue(PDL)
        # one (b, t, head) row of D values; heads 0..HQ-1 are q, HQ..HQ+HKV-1 are k (v follows k)
        b, t, h, bt = split_bth(tl.program_id(0), T, HQ + HKV)
        offs = tl.arange(0, HALF)
        xb = x_ptr + b * sxb + t * sxt + h * (2 * HALF)
        cb = b * scb + t * sct
        y1, y2 = rotate_row(xb, cos_ptr + cb, sin_ptr + cb, HALF, x_ptr.dtype.element_ty)
        if h < HQ:
            qb = q_ptr + (bt * HQ + h) * (2 * HALF)
            tl.store(qb + offs, y1)
            tl.store(qb + HALF + offs, y2)
        else:
            kh = h - HQ
            dst = b * skb + kh * skh + tl.load(tgt_ptr + bt) * skp
            tl.store(kc_ptr + dst + offs, y1.to(kc_ptr.dtype.element_ty))
            tl.store(kc_ptr + dst + HALF + offs, y2.to(kc_ptr.dtype.element_ty))
            vb = xb + HKV * (2 * HALF)  # v head kh sits HKV heads after k head kh
            tl.store(vc_ptr + dst + offs, tl.load(vb + offs).to(vc_ptr.dtype.element_ty))
            tl.store(vc_ptr + dst + HALF + offs, tl.load(vb + HALF + offs).to(vc_ptr.dtype.element_ty))


def rope_kv_write_triton(qkv: torch.Tensor, n_q: int, n_kv: int, cos: torch.Tensor, sin: torch.Tensor,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Same contract as `rope_kv_write_reference`, one launch."""
    b, t, w = qkv.shape
    d = cos.shape[-1]
    half = d // 2
    if (qkv.stride(-1) != 1 or w != (n_q + 2 * n_kv) * d or d % 2 or half & (half - 1)
            or k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or not target.is_contiguous()):
        return rope_kv_write_reference(qkv, n_q, n_kv, cos, sin, k_cache, v_cache, target)
    cos, sin = cos.contiguous(), sin.contiguous()
    q = torch.empty((b, t, n_q, d), device=qkv.device, dtype=qkv.dtype)
    pdl = small_pdl(pdl_enabled(q))
    _rope_kv_write_kernel[(b * t * (n_q + n_kv),)](
        qkv, cos, sin, q, k_cache, v_cache, target, t, n_q, n_kv, qkv.stride(0), qkv.stride(1), cos.stride(0),
        cos.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), HALF=half, PDL=pdl, num_warps=1,
        **launch_kwargs(pdl))
    return q
