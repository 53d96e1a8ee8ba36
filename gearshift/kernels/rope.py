"""Rotary embedding of q or k as one Triton kernel (GPU), with its torch reference.

The torch form (negate, concatenate, two multiplies, add) is five launches per tensor; this
kernel reads a [B, T, H, D] view (any row stride, e.g. a slice of the fused qkv output) and
writes the rotated tensor contiguous, computing in fp32 and rounding once.
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, tl, triton
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled, small_pdl


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, D] (rotate-half convention)."""
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * c + rotated * s


if HAS_TRITON:
    from gearshift.kernels.indexing import split_bth
    from gearshift.kernels.pdl import small_prologue

    @triton.jit
    def rotate_row(xb, cos_row, sin_row, HALF: tl.constexpr, out_dtype: tl.constexpr):
        """The two rotated halves of one head row at xb, in fp32 and rounded once to out_dtype
        (shared with the kernel that also writes the KV cache)."""
        offs = tl.arange(0, HALF)
        x1 = tl.load(xb + offs).to(tl.float32)
        x2 = tl.load(xb + HALF + offs).to(tl.float32)
        c1 = tl.load(cos_row + offs).to(tl.float32)
        c2 = tl.load(cos_row + HALF + offs).to(tl.float32)
        s1 = tl.load(sin_row + offs).to(tl.float32)
        s2 = tl.load(sin_row + HALF + offs).to(tl.float32)
        return (x1 * c1 - x2 * s1).to(out_dtype), (x2 * c2 + x1 * s2).to(out_dtype)

    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, T, H, sxb, sxt, sxh, scb, sct, HALF: tl.constexpr,
                     PDL: tl.constexpr):
        small_prologue(PDL)
        pid = tl.program_id(0)  # one (b, t, h) row of D values
        b, t, h, _ = split_bth(pid, T, H)
        cb = b * scb + t * sct
        y1, y2 = rotate_row(x_ptr + b * sxb + t * sxt + h * sxh, cos_ptr + cb, sin_ptr + cb, HALF,
                            y_ptr.dtype.element_ty)
        offs = tl.arange(0, HALF)
        yb = y_ptr + pid * (2 * HALF)
        tl.store(yb + offs, y1)
        tl.store(yb + HALF + offs, y2)


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] (last dim contiguous); returns a contiguous [B, T, H, D]."""
    b, t, h, d = x.shape
    if x.stride(-1) != 1 or d % 2 or (d // 2) & (d // 2 - 1):
        return rope_reference(x, cos, sin)
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty((b, t, h, d), device=x.device, dtype=x.dtype)
    pdl = small_pdl(pdl_enabled(y))
    _rope_kernel[(b * t * h,)](x, cos, sin, y, t, h, x.stride(0), x.stride(1), x.stride(2), cos.stride(0),
                               cos.stride(1), HALF=d // 2, PDL=pdl, num_warps=1, **launch_kwargs(pdl))
    return y
