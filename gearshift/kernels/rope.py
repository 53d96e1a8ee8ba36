"""Rotary embedding of q or k as one Triton kernel (GPU), with its torch reference.

The torch form (negate, concatenate, two multiplies, add) is five launches per tensor; this
kernel reads a [B, T, H, D] view (any row stride, e.g. a slice of the fused qkv output) and
writes the rotated tensor contiguous, computing in fp32 and rounding once.
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, tl, triton
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, D] (rotate-half convention)."""
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * c + rotated * s


if HAS_TRITON:
    from gearshift.kernels.indexing import split_bth
    from gearshift.kernels.pdl import grid_wait, launch_dependents

    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, T, H, sxb, sxt, sxh, scb, sct, HALF: tl.constexpr,
                     PDL: tl.constexpr):
        launch_dependents(PDL)
        grid_wait(PDL)
        pid = tl.program_id(0)  # one (b, t, h) row of D values
        b, t, h, _ = split_bth(pid, T, H)
        offs = tl.arange(0, HALF)
        xb = x_ptr + b * sxb + t * sxt + h * sxh
        x1 = tl.load(xb + offs).to(tl.float32)
        x2 = tl.load(xb + HALF + offs).to(tl.float32)
        cb = b * scb + t * sct
        c1 = tl.load(cos_ptr + cb + offs).to(tl.float32)
        c2 = tl.load(cos_ptr + cb + HALF + offs).to(tl.float32)
        s1 = tl.load(sin_ptr + cb + offs).to(tl.float32)
        s2 = tl.load(sin_ptr + cb + HALF + offs).to(tl.float32)
        yb = y_ptr + pid * (2 * HALF)
        tl.store(yb + offs, (x1 * c1 - x2 * s1).to(y_ptr.dtype.element_ty))
        tl.store(yb + HALF + offs, (x2 * c2 + x1 * s2).to(y_ptr.dtype.element_ty))


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] (last dim contiguous); returns a contiguous [B, T, H, D]."""
    b, t, h, d = x.shape
    if x.stride(-1) != 1 or d % 2 or (d // 2) & (d // 2 - 1):
        return rope_reference(x, cos, sin)
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty((b, t, h, d), device=x.device, dtype=x.dtype)
    pdl = pdl_enabled(y)
    _rope_kernel[(b * t * h,)](x, cos, sin, y, t, h, x.stride(0), x.stride(1), x.stride(2), cos.stride(0),
                               cos.stride(1), HALF=d // 2, PDL=pdl, num_warps=1, **launch_kwargs(pdl))
    return y
