"""KV-cache write as one Triton launch per layer (GPU), with its torch reference.

The torch form (`cache[rows, :, pos] = k.transpose(1, 2)`) is an `index_put_` per tensor plus
the transposes: about 3.7 us x 64 launches per decode step on the H100 (benchmarks/
step_profile.py). This kernel copies k and v of every (sequence, token, head) row to its target
position in one launch; targets come precomputed once per forward (padding tokens -> scratch).
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, tl, triton
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled, small_pdl


def kv_write_reference(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       target: torch.Tensor) -> None:
    """k_cache/v_cache [B, H, C, D] (one layer); k/v [B, T, H, D]; target [B, T] positions."""
    rows = torch.arange(k.shape[0], device=k.device).unsqueeze(1).expand_as(target)
    # advanced indices on dims 0 and 2 come first in the result: value shape [B, T, H, D]
    k_cache[rows, :, target] = k.to(k_cache.dtype)
    v_cache[rows, :, target] = v.to(v_cache.dtype)


if HAS_TRITON:
    from gearshift.kernels.indexing import split_bth
    from gearshift.kernels.pdl import small_prologue

    @triton.jit
    def _kv_write_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, tgt_ptr, T, H, skb, skt, skh, svb, svt, svh,
                         scb, sch, scp, D: tl.constexpr, PDL: tl.constexpr):
        small_prologue(PDL)
        b, t, h, bt = split_bth(tl.program_id(0), T, H)  # one (b, t, h) row of D values
        offs = tl.arange(0, D)
        p = tl.load(tgt_ptr + bt)
        dst = b * scb + h * sch + p * scp + offs
        kv = tl.load(k_ptr + b * skb + t * skt + h * skh + offs)
        vv = tl.load(v_ptr + b * svb + t * svt + h * svh + offs)
        tl.store(kc_ptr + dst, kv.to(kc_ptr.dtype.element_ty))
        tl.store(vc_ptr + dst, vv.to(vc_ptr.dtype.element_ty))


def kv_write_triton(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    target: torch.Tensor) -> None:
    b, t, h, d = k.shape
    if (k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or d & (d - 1)
            or k_cache.stride() != v_cache.stride() or not target.is_contiguous()):
        return kv_write_reference(k_cache, v_cache, k, v, target)
    pdl = small_pdl(pdl_enabled(k_cache))
    _kv_write_kernel[(b * t * h,)](k, v, k_cache, v_cache, target, t, h, k.stride(0), k.stride(1), k.stride(2),
                                   v.stride(0), v.stride(1), v.stride(2), k_cache.stride(0), k_cache.stride(1),
                                   k_cache.stride(2), D=d, PDL=pdl, num_warps=1, **launch_kwargs(pdl))
