"""SwiGLU's `silu(gate) * up` as one Triton kernel (GPU), with its torch reference.

The torch form is two elementwise kernels and a full-size temporary: at prefill sizes (M = 4096,
an 8B model's 14336-wide MLP) that is about 0.6 GB of memory traffic per layer where one pass
needs 0.35 GB, and two launches per layer in every decode step. The kernel keeps torch's rounding:
silu in fp32 rounded to the input dtype, then the product in fp32 rounded again.

Where the down projection's kernel takes its activations already quantized per token (W4A8 /
W4A4), `silu_mul_codes_triton` also emits their codes from the same pass, as the RMSNorm does for
qkv and gate_up: one program per row (the codes need the row's max), the quantizer's launch and its
re-read of the product gone.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from gearshift.kernels._triton import HAS_TRITON, interpreting, next_pow2, tl, triton
from gearshift.kernels.act_quant import ActCodes, codes_buffers
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled, small_pdl
from gearshift.kernels.splitk import zeroed_words
from gearshift.kernels.switches import swiglu_codes_for
from gearshift.kernels.tile_room import empty_rows


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] (gate first, as the fused gate_up projection writes it) -> [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


if HAS_TRITON:
    from gearshift.kernels.act_quant import row_codes, token_codes, token_scale
    from gearshift.kernels.pdl import small_prologue
    from gearshift.kernels.x_tiles import s8_fragment_permute

    @triton.jit
    def _silu_mul_kernel(gu_ptr, y_ptr, I, stride_gu, stride_y, BLOCK: tl.constexpr, PDL: tl.constexpr):
        small_prologue(PDL)
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < I
        g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0)
        u = tl.load(gu_ptr + row * stride_gu + I + offs, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride_y + offs, _silu_mul(g, u).to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul(g, u):
        """silu(g) in fp32 rounded to g's dtype, times u in fp32 (the caller rounds the product: torch's
        two roundings)."""
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
        return s.to(tl.float32) * u.to(tl.float32)

    @triton.jit
    def _silu_mul_codes_kernel(gu_ptr, y_ptr, q_ptr, qs_ptr, I, stride_gu, stride_y, stride_q, BLOCK: tl.constexpr,
                               PDL: tl.constexpr, QMAX: tl.constexpr, STORE_Y: tl.constexpr = True,
                               FO: tl.constexpr = False):
        """STORE_Y=False: the codes only (the product is rounded to y's dtype all the same). FO: the codes in
        `S8_FRAGMENT_ORDER`."""
        small_prologue(PDL)
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)  # the whole row: its codes need its max
        mask = offs < I
        y = _product(gu_ptr, y_ptr, row, offs, mask, I, stride_gu, stride_y, STORE_Y)
        row_codes(y, q_ptr + row * stride_q, qs_ptr + row, offs, mask, QMAX, FO)

    @triton.jit
    def _product(gu_ptr, y_ptr, row, offs, mask, I, stride_gu, stride_y, STORE_Y: tl.constexpr):
        """The row's product at columns offs, rounded to y's dtype (and stored there if STORE_Y)."""
        g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0)
        u = tl.load(gu_ptr + row * stride_gu + I + offs, mask=mask, other=0.0)
        y = _silu_mul(g, u).to(y_ptr.dtype.element_ty)
        if STORE_Y:
            tl.store(y_ptr + row * stride_y + offs, y, mask=mask)
        return y


    @triton.jit
    def _silu_mul_codes_split_kernel(gu_ptr, y_ptr, q_ptr, qs_ptr, cnt_ptr, part_ptr, I, stride_gu, stride_y,
                                     stride_q, BLOCK: tl.constexpr, PDL: tl.constexpr, QMAX: tl.constexpr,
                                     STORE_Y: tl.constexpr, PP: tl.constexpr, FO: tl.constexpr = False):
        """The codes kernel for few rows: each row split over P = cdiv(I, BLOCK) programs that meet at a
        barrier of their own (every program of this small grid is resident: the launch's dependents start
        only once all of them have begun). Each program stores its chunk's max |y| in its own slot, arrives
        on the row's counter and waits for the row's P arrivals, then takes the max over the P slots (order
        free: the one-program kernel's scale, bit for bit) and quantizes its chunk at it.
        The counter (int64) is never reset: each launch adds exactly P per row, so the arrivals of this
        launch end at the next multiple of P above the value a program's own arrival returned (the caller
        keeps one counter set per P). Nothing runs after the codes are stored: no reset on the way out."""
        small_prologue(PDL)
        row = tl.program_id(0)
        n_prog = tl.num_programs(1)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < I
        yf = _product(gu_ptr, y_ptr, row, offs, mask, I, stride_gu, stride_y, STORE_Y).to(tl.float32)
        tl.store(part_ptr + row * PP + tl.program_id(1), tl.max(tl.abs(yf), 0))
        tl.debug_barrier()  # the slot is written before the arrival releases it
        old = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel", scope="gpu")
        target = (old // n_prog + 1) * n_prog
        seen = old + 1
        while seen < target:
            seen = tl.atomic_add(cnt_ptr + row, 0, sem="acquire", scope="gpu")
        slots = tl.arange(0, PP)
        amax = tl.max(tl.load(part_ptr + row * PP + slots, mask=slots < n_prog, other=0.0, cache_modifier=".cg"), 0)
        scale = token_scale(amax, QMAX)
        tl.store(q_ptr + row * stride_q + offs,
                 s8_fragment_permute(token_codes(yf, scale, QMAX, False).to(q_ptr.dtype.element_ty), FO), mask=mask)
        if tl.program_id(1) == 0:
            tl.store(qs_ptr + row, scale)


CODES_MAX_WIDTH = 32768  # one program holds the row: Llama-3-70B's 28672 fits, wider MLPs use the quantizer
#: launches of at most this many rows split each row over programs of SPLIT_BLOCK columns that meet at
#: a barrier (`_silu_mul_codes_split_kernel`); 0: always one program per row
SPLIT_ROWS = 64
SPLIT_BLOCK = 1024


def _barrier_words(device: torch.device, rows: int, programs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split kernel's per-row arrival counters (int64, zeroed once, only ever added to) and its
    per-row slots for the programs' partial maxima, for launches of `programs` programs per row: one
    set per program count, so that every launch finds each row's counter at a multiple of its own count.
    One split launch at a time per device: the engine's one stream, or a graph replaying in order."""
    n = max(rows, SPLIT_ROWS)
    words = zeroed_words(f"swiglu_split_{programs}", device, 2 * n + n * next_pow2(programs))
    return words[: 2 * n].view(torch.int64), words[2 * n:].view(torch.float32)


def max_split_programs(device: torch.device) -> int:
    """How many split programs (4 warps each) a launch may have: few enough that all are resident at
    once on this GPU even beside other work (8 per SM; the barrier needs every one of them running)."""
    return _max_split_programs(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _max_split_programs(index: int) -> int:
    return 8 * torch.cuda.get_device_properties(index).multi_processor_count


def splits_rows(rows: int, width: int, device: torch.device) -> bool:
    """Whether `silu_mul_codes_triton` splits each row over programs: few rows on a GPU (the
    interpreter runs programs one after another, so a barrier between them would never open)."""
    return (device.type == "cuda" and not interpreting() and rows <= SPLIT_ROWS
            and width > SPLIT_BLOCK and rows * triton.cdiv(width, SPLIT_BLOCK) <= max_split_programs(device))


def codes_supported(width: int) -> bool:
    """Whether `silu_mul_codes_triton` takes rows of this width (the MLP's intermediate size)."""
    return next_pow2(width) <= CODES_MAX_WIDTH


def emits_codes(rows: int, width: int) -> bool:
    """Whether SwiGLU should write the down projection's codes for `rows` tokens of this width
    (if down's kernel takes codes): switched on, enough rows to pay (`swiglu_codes_for`), and a
    row one program holds."""
    return swiglu_codes_for(rows) and codes_supported(width)


def _rows(gate_up: torch.Tensor, product: bool = True):
    """gate_up as [rows, 2I] with unit stride along the row, I, and the output [rows, I] in a buffer of whole token
    tiles (`tile_room.empty_rows`; without `product`, a one-element stand-in of its dtype that the kernel never
    writes)."""
    two_i = gate_up.shape[-1]
    if two_i % 2:
        raise ValueError(f"gate_up's last dimension must be even (gate then up), got {two_i}")
    gu = gate_up.reshape(-1, two_i)
    if gu.stride(-1) != 1:
        gu = gu.contiguous()
    if not product:
        return gu, two_i // 2, torch.empty((1, 1), device=gate_up.device, dtype=gate_up.dtype)
    return gu, two_i // 2, empty_rows(gu.shape[0], two_i // 2, gate_up.dtype, gate_up.device)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    gu, i, y = _rows(gate_up)
    block = 1024
    pdl = small_pdl(pdl_enabled(y))
    _silu_mul_kernel[(gu.shape[0], triton.cdiv(i, block))](gu, y, i, gu.stride(0), y.stride(0), BLOCK=block, PDL=pdl,
                                                           num_warps=4, **launch_kwargs(pdl))
    return y.reshape(*gate_up.shape[:-1], i)


def silu_mul_codes_triton(gate_up: torch.Tensor, qmax: float, codes_dtype: torch.dtype = torch.int8,
                          warps: int | None = None, product: bool = True,
                          split: bool | None = None, split_block: int = SPLIT_BLOCK,
                          fragment_order: bool = False) -> tuple[torch.Tensor | None, ActCodes]:
    """`silu_mul_triton` and, from the same pass, the product's per-token integer codes for the down
    projection (W4A8 / W4A4): what `quantize_act_triton` makes of the stored product, bit for bit.
    codes_dtype: int8, or the 16-bit float the next kernel multiplies in (exact integers). warps:
    the program's warps (default by row width; benchmarks/swiglu_codes.py times others).
    product=False: the codes only, the product is not stored (None is returned for it): where the
    down projection's kernel takes the codes, the product's 2 bytes per element are never read.
    split (default: `splits_rows`): each row over programs of split_block columns that meet at a
    barrier, the same bits (few rows: one program per row is slower than SwiGLU plus the quantizer).
    fragment_order: int8 codes in `S8_FRAGMENT_ORDER` (`CodesSpec.fragment_order`)."""
    gu, i, y = _rows(gate_up, product)
    q, qs, sq = codes_buffers(gu.shape[0], i, qmax, y, codes_dtype, fragment_order)
    if fragment_order and split_block % 8:
        raise ValueError(f"fragment-order codes need split blocks of a multiple of 8 columns; got {split_block}")
    if split if split is not None else splits_rows(gu.shape[0], i, gu.device):
        grid = (gu.shape[0], triton.cdiv(i, split_block))
        if gu.is_cuda and grid[0] * grid[1] > max_split_programs(gu.device):
            raise ValueError(f"{grid[0]} rows of {grid[1]} split programs could not all be resident at once "
                             f"(at most {max_split_programs(gu.device)} on this GPU): use split=False")
        pdl = small_pdl(pdl_enabled(y))
        cnt, part = _barrier_words(gu.device, gu.shape[0], grid[1])
        _silu_mul_codes_split_kernel[grid](gu, y, q, qs, cnt, part, i, gu.stride(0), y.stride(0), sq,
                                           BLOCK=split_block, PDL=pdl, QMAX=qmax, STORE_Y=product,
                                           PP=next_pow2(grid[1]), FO=fragment_order, num_warps=4, **launch_kwargs(pdl))
        return (y.reshape(*gate_up.shape[:-1], i) if product else None), ActCodes(q, qs, qmax, fragment_order)
    block = next_pow2(i)
    if block > CODES_MAX_WIDTH:
        raise ValueError(f"SwiGLU codes need the whole row in one program: width {i} > {CODES_MAX_WIDTH}")
    warps = warps or (4 if block <= 4096 else 8 if block <= 8192 else 32)  # swiglu_codes.py: 32 best at 14336
    pdl = small_pdl(pdl_enabled(y))
    _silu_mul_codes_kernel[(gu.shape[0],)](gu, y, q, qs, i, gu.stride(0), y.stride(0), sq, BLOCK=block, PDL=pdl,
                                           QMAX=qmax, STORE_Y=product, FO=fragment_order, num_warps=warps,
                                           **launch_kwargs(pdl))
    return (y.reshape(*gate_up.shape[:-1], i) if product else None), ActCodes(q, qs, qmax, fragment_order)
