"""Activations with zero rows appended up to a whole token tile, as one PDL launch (GPU), with its torch reference.

Why: a TMA box of which many rows lie past the activations reads slowly, so `w4a16_wgmma.tma_rows` pads x to
whole token tiles where that pays (stop 71). torch's pad is a plain launch between two PDL launches: the
linear after it cannot start its weight loads until the pad has finished, and on the H200 the pair cost about
5 us more than the linear alone. This kernel enters like the small kernels between the linears
(`pdl.small_prologue`), so the linear's prologue runs beside it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gearshift.kernels._triton import HAS_TRITON, cdiv, tl, triton, triton_usable
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled, small_pdl


def pad_rows_reference(x2: torch.Tensor, rows: int) -> torch.Tensor:
    """x2 [M, K] -> [rows, K]: x2, then rows - M zero rows."""
    return F.pad(x2, (0, 0, 0, rows - x2.shape[0]))


if HAS_TRITON:
    from gearshift.kernels.pdl import small_prologue

    @triton.jit
    def _pad_rows_kernel(x_ptr, y_ptr, M, K, stride_xm, BLOCK: tl.constexpr, PDL: tl.constexpr):
        small_prologue(PDL)
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < K
        v = tl.zeros([BLOCK], dtype=y_ptr.dtype.element_ty)
        if row < M:
            v = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0)
        tl.store(y_ptr + row * K + offs, v, mask=mask)


def pad_rows(x2: torch.Tensor, rows: int) -> torch.Tensor:
    """`pad_rows_reference` (the same values), in one Triton launch where Triton runs; x2's rows may be strided."""
    m, k = x2.shape
    if rows < m:
        raise ValueError(f"pad_rows: {rows} rows cannot hold x's {m}")
    if not triton_usable(x2) or x2.stride(1) != 1:
        return pad_rows_reference(x2, rows)
    y = torch.empty((rows, k), device=x2.device, dtype=x2.dtype)
    block = 1024
    pdl = small_pdl(pdl_enabled(y))
    _pad_rows_kernel[(rows, cdiv(k, block))](x2, y, m, k, x2.stride(0), BLOCK=block, PDL=pdl, num_warps=4,
                                             **launch_kwargs(pdl))
    return y
