"""RMSNorm as one Triton kernel (GPU), with its torch reference.

The torch form launches about eight kernels (upcast, square, mean, rsqrt, scale, downcast,
weight multiply); in a CUDA-graphed decode step of an 8B model the 65 norms alone cost over a
millisecond of launches. This kernel does the same arithmetic in one pass: fp32 statistics,
the normalized row rounded to the input dtype, then the weight multiply rounded again (the
order HF Llama uses).
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, next_pow2, tl, triton
from gearshift.kernels.act_quant import ActCodes, codes_buffers
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled, small_pdl
from gearshift.kernels.switches import norm_warps
from gearshift.kernels.tile_room import empty_rows
from gearshift.kernels.x_tiles import XTiles, x_tile_rows


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual update and the norm of its result: (x + delta, rms_norm(x + delta))."""
    s = x + delta
    return s, rms_norm_reference(s, weight, eps)


if HAS_TRITON:
    from gearshift.kernels.act_quant import row_codes
    from gearshift.kernels.pdl import small_prologue
    from gearshift.kernels.x_tiles import x_tile_offsets

    @triton.jit
    def _y_ptrs(y_ptr, r, stride_y, offs, D, YT: tl.constexpr):
        """Where program r stores its normed row: row r, or (YT) its place in `x_tiles`' layout."""
        if YT:
            return y_ptr + x_tile_offsets(r, offs, D // 128)
        return y_ptr + r * stride_y + offs

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, q_ptr, qs_ptr, M, D, stride_x, stride_y, stride_q, eps,
                         BD: tl.constexpr, PDL: tl.constexpr, QMAX: tl.constexpr, STORE_Y: tl.constexpr = True,
                         YT: tl.constexpr = False, FO: tl.constexpr = False):
        # YT: the normed rows in `x_tiles`' layout (the real tokens' rows: a fragment kernel never reads the others)
        small_prologue(PDL)
        row = tl.program_id(0)
        offs = tl.arange(0, BD)
        mask = offs < D
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
        y = _norm_row(x, w_ptr, _y_ptrs(y_ptr, row, stride_y, offs, D, YT), offs, mask, D, eps, STORE_Y)
        if QMAX > 0:  # (FO: the codes in `S8_FRAGMENT_ORDER`)
            row_codes(y, q_ptr + row * stride_q, qs_ptr + row, offs, mask, QMAX, FO)

    @triton.jit
    def _norm_row(x, w_ptr, y_ptrs, offs, mask, D, eps, STORE_Y: tl.constexpr = True):
        """One row's RMSNorm: fp32 statistics, the normalized row rounded to x's dtype, then the
        weight multiply rounded to y's (both kernels share it: the same arithmetic). Returns the
        row, stored unless STORE_Y is off (the next linear takes only its codes)."""
        xf = x.to(tl.float32)
        var = tl.sum(xf * xf, 0) / D
        h = (xf * (1.0 / tl.sqrt(var + eps))).to(x.dtype)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        y = (w.to(tl.float32) * h.to(tl.float32)).to(y_ptrs.dtype.element_ty)
        if STORE_Y:
            tl.store(y_ptrs, y, mask=mask)
        return y

    @triton.jit
    def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, s_ptr, y_ptr, q_ptr, qs_ptr, M, D, stride_x, stride_d, stride_s,
                             stride_y, stride_q, eps, BD: tl.constexpr, PDL: tl.constexpr, QMAX: tl.constexpr,
                             STORE_Y: tl.constexpr = True, YT: tl.constexpr = False, FO: tl.constexpr = False):
        small_prologue(PDL)
        row = tl.program_id(0)
        offs = tl.arange(0, BD)
        mask = offs < D
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
        d = tl.load(d_ptr + row * stride_d + offs, mask=mask, other=0.0)
        s = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)  # torch's x + delta: one rounding
        tl.store(s_ptr + row * stride_s + offs, s, mask=mask)
        y = _norm_row(s, w_ptr, _y_ptrs(y_ptr, row, stride_y, offs, D, YT), offs, mask, D, eps, STORE_Y)
        if QMAX > 0:
            row_codes(y, q_ptr + row * stride_q, qs_ptr + row, offs, mask, QMAX, FO)


def _warps(bd: int, codes: bool) -> int:
    """8 warps from 4096 columns, 4 below, unless the switches say otherwise (stop 50, H100: 4096-wide rows with
    8 warps against 4 gave decode steps 0.991-1.000 at batch 1-16 and 256-token passes 0.993-1.000, W4A16 and
    W4A8; results/step_ab_*_stop50_norm_warps*; narrower rows were not timed)."""
    return norm_warps(codes) or (8 if bd >= 4096 else 4)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, D] with unit stride along D (what the kernels index)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _normed_buffer(rows: int, d: int, x: torch.Tensor, weight: torch.Tensor, normed: bool,
                   tiles: bool = False) -> torch.Tensor:
    """The normed rows' output (rows in a buffer of whole token tiles, `tile_room.empty_rows`), or (normed=False,
    codes only) a one-element stand-in of its dtype that the kernel never writes."""
    dtype = torch.promote_types(weight.dtype, x.dtype)
    if normed and not tiles:
        return empty_rows(rows, d, dtype, x.device)
    return torch.empty((rows, d) if normed else (1, 1), device=x.device, dtype=dtype)


def _launch_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, qmax: float | None,
                 codes_dtype: torch.dtype = torch.int8, normed: bool = True, tiles: bool = False,
                 fragment_order: bool = False):
    d = x.shape[-1]
    x2 = _rows(x)
    m = x2.shape[0]
    rows = _out_rows(m, d, tiles, qmax)
    y = _normed_buffer(rows, d, x, weight, normed, tiles)
    q, qs, sq = codes_buffers(m, d, qmax, y, codes_dtype, fragment_order)
    bd = next_pow2(d)
    pdl = small_pdl(pdl_enabled(y))
    _rms_norm_kernel[(m,)](x2, weight, y, q, qs, m, d, x2.stride(0), y.stride(0), sq, eps, BD=bd, PDL=pdl,
                              QMAX=qmax or 0.0, STORE_Y=normed, YT=tiles, FO=fragment_order,
                              num_warps=_warps(bd, qmax is not None), **launch_kwargs(pdl))
    if tiles:
        return XTiles(y, tuple(x.shape)), None
    return ((y.reshape(*x.shape[:-1], d) if normed else None),
            None if qmax is None else ActCodes(q, qs, qmax, fragment_order))


def _out_rows(m: int, d: int, tiles: bool, qmax: float | None) -> int:
    """Rows of the normed output: m, or with tiles `x_tile_rows(m)` (of which the m programs write the real
    tokens')."""
    if not tiles:
        return m
    if qmax is not None or d % 128:
        raise ValueError(f"x-tile outputs are 16-bit rows of a multiple of 128 columns, without codes; got D={d}")
    return x_tile_rows(m)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, tiles: bool = False) -> torch.Tensor | XTiles:
    """tiles: the normed rows as `XTiles` (the next linear's kernel takes `x_tiles`' layout)."""
    return _launch_norm(x, weight, eps, None, tiles=tiles)[0]


def rms_norm_codes_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, qmax: float,
                          codes_dtype: torch.dtype = torch.int8, normed: bool = True,
                          fragment_order: bool = False) -> tuple[torch.Tensor | None, ActCodes]:
    """The norm and, from the same pass, its per-token integer codes for the next linear (W4A8 /
    W4A4): what `quantize_act_triton` would make of the result, without its launch and re-read.
    codes_dtype: int8, or the 16-bit float the next kernel multiplies in (exact integers).
    normed=False: the codes only (None for the normed rows, which are not stored).
    fragment_order: int8 codes in `S8_FRAGMENT_ORDER` (`CodesSpec.fragment_order`)."""
    return _launch_norm(x, weight, eps, qmax, codes_dtype, normed, fragment_order=fragment_order)


def _launch_add_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, qmax: float | None,
                     codes_dtype: torch.dtype = torch.int8, normed: bool = True, tiles: bool = False,
                     fragment_order: bool = False):
    if x.shape != delta.shape or x.dtype != delta.dtype:
        raise ValueError(f"residual {tuple(x.shape)} {x.dtype} and update {tuple(delta.shape)} {delta.dtype} differ")
    d = x.shape[-1]
    x2, d2 = _rows(x), _rows(delta)
    m = x2.shape[0]
    rows = _out_rows(m, d, tiles, qmax)
    s = torch.empty((m, d), device=x.device, dtype=x.dtype)
    y = _normed_buffer(rows, d, x, weight, normed, tiles)
    q, qs, sq = codes_buffers(m, d, qmax, y, codes_dtype, fragment_order)
    bd = next_pow2(d)
    pdl = small_pdl(pdl_enabled(y))
    _add_rms_norm_kernel[(m,)](x2, d2, weight, s, y, q, qs, m, d, x2.stride(0), d2.stride(0), s.stride(0),
                                  y.stride(0), sq, eps, BD=bd, PDL=pdl, QMAX=qmax or 0.0, STORE_Y=normed, YT=tiles,
                                  FO=fragment_order, num_warps=_warps(bd, qmax is not None), **launch_kwargs(pdl))
    if tiles:
        return s.reshape(x.shape), XTiles(y, tuple(x.shape)), None
    return (s.reshape(x.shape), y.reshape(*x.shape[:-1], d) if normed else None,
            None if qmax is None else ActCodes(q, qs, qmax, fragment_order))


def add_rms_norm_triton(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                        eps: float, tiles: bool = False) -> tuple[torch.Tensor, torch.Tensor | XTiles]:
    """(x + delta, rms_norm(x + delta)) in one pass: the residual update of a decoder layer and the
    next norm, which torch runs as an add kernel and a norm reading its result back. tiles: the normed
    rows as `XTiles`."""
    return _launch_add_norm(x, delta, weight, eps, None, tiles=tiles)[:2]


def add_rms_norm_codes_triton(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, qmax: float,
                              codes_dtype: torch.dtype = torch.int8, normed: bool = True,
                              fragment_order: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, ActCodes]:
    """`add_rms_norm_triton` plus the normed rows' integer codes (see `rms_norm_codes_triton`)."""
    return _launch_add_norm(x, delta, weight, eps, qmax, codes_dtype, normed, fragment_order=fragment_order)
