"""Per-token activation quantizer (int8 / int4-in-int8 / fp8) as one Triton pass per row.

The torch reference is `gearshift.quant.activations.quantize_activations` (group_size None):
scale = max(|x|)/qmax (floored at 1e-8), q = round(x/scale), and this kernel gives its codes and
scales bit for bit: both divisions are correctly rounded (`div_rn`; Triton's `/` is an approximate
division) and ties round half to even, as `torch.round` does. (Until stop 26 they rounded away
from zero after an approximate division; on bf16 activations, whose values sit on a coarse grid,
many codes land on or next to a tie, and one M = 1 token of the down_proj shape came out 8.8e-3
from the reference.)
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from gearshift.kernels._triton import HAS_TRITON, next_pow2, tl, triton
from gearshift.kernels.pdl import launch_kwargs, pdl_enabled, small_pdl
from gearshift.kernels.tile_room import empty_rows
from gearshift.kernels.x_tiles import from_fragment_order
from gearshift.quant.activations import ActQuantSpec, quantize_activations

_QMAX = {"int8": 127.0, "int4": 7.0, "fp8": 448.0}


class ActCodes(NamedTuple):
    """Activations already quantized per token by the kernel that produced them (an RMSNorm):
    codes [M, K] int8 and fp32 scales [M], for a linear whose activations quantize with `qmax`.
    fragment_order: the int8 codes' columns are in `x_tiles.S8_FRAGMENT_ORDER` within each 8 (for the
    fragment kernel's int8 block, `CodesSpec.fragment_order`); `natural_codes` gives them in order."""

    codes: torch.Tensor
    scales: torch.Tensor
    qmax: float
    fragment_order: bool = False


def natural_codes(codes: ActCodes) -> torch.Tensor:
    """The codes [M, K] with their columns in order (a copy where the producer stored them in fragment order)."""
    return from_fragment_order(codes.codes) if codes.fragment_order else codes.codes


class CodesSpec(NamedTuple):
    """What a linear's kernel takes already quantized: the integer range and the dtype holding the
    codes (int8 for the int8 tensor cores; the activations' bf16 / fp16 for the bf16 fragment MMA,
    which runs integer codes as exact 16-bit floats)."""

    qmax: float
    dtype: torch.dtype
    #: int8 codes with each 8 columns in `x_tiles.S8_FRAGMENT_ORDER` (the fragment kernel's int8 block reads
    #: them without input PRMTs: stop 69)
    fragment_order: bool = False


def codes_buffers(rows: int, d: int, qmax: float | None, like: torch.Tensor, dtype: torch.dtype,
                  fragment_order: bool = False):
    """Codes [rows, D] (int8, or exact integers in a float dtype), scales [rows] fp32 and the codes'
    row stride for a producer that emits them, else stand-ins it never touches (like, like, 0).
    fragment_order: the producer stores them in `S8_FRAGMENT_ORDER` (int8 only)."""
    if qmax is None:
        if fragment_order:
            raise ValueError("fragment order is a layout of codes; this producer emits none")
        return like, like, 0
    if fragment_order:
        check_fragment_codes(d, dtype)
    if not 0 < qmax <= 127:
        raise ValueError(f"integer codes need 0 < qmax <= 127, got {qmax}")
    if dtype not in (torch.int8, torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"codes are int8 or exact integers in a float dtype, got {dtype}")
    q = empty_rows(rows, d, dtype, like.device)  # (rows up to whole token tiles, for the wgmma kernels' TMA boxes)
    return q, torch.empty((rows,), device=like.device, dtype=torch.float32), q.stride(0)


def check_fragment_codes(k: int, dtype: torch.dtype) -> None:
    """Fragment-order codes are int8 rows of a multiple of 8 columns (each 8 is permuted in place)."""
    if dtype != torch.int8 or k % 8:
        raise ValueError(f"fragment-order codes are int8 rows of a multiple of 8 columns; got {dtype}, K={k}")


def codes_qmax(spec) -> float | None:
    """The integer code range a per-token activation spec quantizes to, or None where a producer
    cannot emit its codes (fp8, per-group scales, calibrated quantizer modules)."""
    if not isinstance(spec, ActQuantSpec) or spec.group_size is not None or spec.dtype not in ("int8", "int4"):
        return None
    return _QMAX[spec.dtype]

if HAS_TRITON:
    from gearshift.kernels.pdl import small_prologue
    from gearshift.kernels.x_tiles import s8_fragment_permute

    @triton.jit
    def token_codes(x, scale, QMAX: tl.constexpr, FP8: tl.constexpr):
        """fp32 values of one token -> its codes at `scale` (shared with the RMSNorm that emits
        codes, so both give the same bits)."""
        y = tl.math.div_rn(x, scale)
        if FP8:
            q = tl.minimum(tl.maximum(y, -QMAX), QMAX).to(tl.float8e4nv)
        else:
            # round half to even: adding and taking back 1.5 * 2^23 rounds |y| < 2^22 to an integer
            # in round-to-nearest-even fp32 arithmetic (the clamp below keeps larger y harmless)
            r = (y + 12582912.0) - 12582912.0
            q = tl.minimum(tl.maximum(r, -QMAX), QMAX).to(tl.int8)
        return q

    @triton.jit
    def token_scale(amax, QMAX: tl.constexpr):
        return tl.maximum(tl.math.div_rn(amax, QMAX), 1e-8)

    @triton.jit
    def row_codes(y, q_row_ptr, scale_ptr, offs, mask, QMAX: tl.constexpr, FO: tl.constexpr = False):
        """The per-token integer codes of a row a kernel has just stored (y, in the stored dtype),
        as the quantizer would make them from that row: for producers that emit the next linear's
        codes in their own pass (RMSNorm, SwiGLU). Lanes past the row hold 0 and do not move the max.
        FO: stored in `S8_FRAGMENT_ORDER` (the row's columns a multiple of 8)."""
        yf = y.to(tl.float32)
        scale = token_scale(tl.max(tl.abs(yf), 0), QMAX)
        q = token_codes(yf, scale, QMAX, False)  # int8; exact in bf16 / fp16 too
        tl.store(q_row_ptr + offs, s8_fragment_permute(q.to(q_row_ptr.dtype.element_ty), FO), mask=mask)
        tl.store(scale_ptr, scale)

    @triton.jit
    def _act_quant_kernel(x_ptr, q_ptr, s_ptr, sum_ptr, K, stride_x, stride_q, sum_row, sum_group,
                          QMAX: tl.constexpr, FP8: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
                          GROUP: tl.constexpr, ONE_PASS: tl.constexpr, FO: tl.constexpr = False):
        small_prologue(PDL)
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        if ONE_PASS:  # the whole row (BLOCK >= K) in registers: one read of x, no loop
            m = offs < K
            x = tl.load(x_ptr + row * stride_x + offs, mask=m, other=0.0).to(tl.float32)
            scale = token_scale(tl.max(tl.abs(x), 0), QMAX)
            tl.store(q_ptr + row * stride_q + offs, s8_fragment_permute(token_codes(x, scale, QMAX, FP8), FO), mask=m)
        else:
            scale = _two_pass_row(x_ptr, q_ptr, sum_ptr, row, offs, K, stride_x, stride_q, sum_row, sum_group,
                                  QMAX, FP8, BLOCK, GROUP, FO)
        tl.store(s_ptr + row, scale)

    @triton.jit
    def _two_pass_row(x_ptr, q_ptr, sum_ptr, row, offs, K, stride_x, stride_q, sum_row, sum_group,
                      QMAX: tl.constexpr, FP8: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr,
                      FO: tl.constexpr):
        """A row wider than one block: its amax over the blocks, then the codes (and group sums)."""
        amax = tl.zeros([BLOCK], tl.float32)
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_ptr + row * stride_x + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = token_scale(tl.max(amax, 0), QMAX)
        for k0 in range(0, K, BLOCK):
            m = k0 + offs < K
            x = tl.load(x_ptr + row * stride_x + k0 + offs, mask=m, other=0.0).to(tl.float32)
            q = token_codes(x, scale, QMAX, FP8)
            tl.store(q_ptr + row * stride_q + k0 + offs, s8_fragment_permute(q, FO), mask=m)
            if GROUP > 0:  # per-group sums of the codes (exact for int8; fp32 sums of e4m3 values)
                gs = tl.sum(tl.reshape(q.to(tl.float32), (BLOCK // GROUP, GROUP)), 1)
                go = k0 // GROUP + tl.arange(0, BLOCK // GROUP)
                tl.store(sum_ptr + row * sum_row + go * sum_group, gs, mask=go < K // GROUP)
        return scale


#: rows up to this many columns are quantized from registers in one read when there are at most
#: ONE_PASS_ROWS of them (stop 27: at few tokens the two-pass loop's dependent loads are the
#: launch's critical path, W4A8 step 0.95-0.99 at M = 1..256; with many rows the 8-warp loop keeps
#: more rows in flight, the one-pass launch measured 1.018 / 1.025 at M = 1024 / 4096)
ONE_PASS_COLUMNS = 16384
ONE_PASS_ROWS = 256


def one_pass(k: int, group_sums: int = 0, rows: int = 1) -> bool:
    """Whether a launch of `rows` rows of k columns quantizes each row from registers in one read."""
    return not group_sums and next_pow2(k) <= ONE_PASS_COLUMNS and rows <= ONE_PASS_ROWS


def act_block(k: int, group_sums: int = 0, rows: int = 1) -> int:
    """Columns per step of the quantizer's loop over a row (the whole row where it takes one pass)."""
    return next_pow2(k) if one_pass(k, group_sums, rows) else min(4096, next_pow2(k))


def fused_group_sums(k: int, group: int) -> bool:
    """Whether `quantize_act_triton` can emit sums over `group` columns (a group may not straddle a
    block of its loop; per-row stores of a wide K cannot)."""
    return k % group == 0 and act_block(k, group) % group == 0


#: launches of at most this many rows run twice the warps per program (at most 32): fewer columns
#: per thread on the critical path of a few-token launch. Stop 34, H100, W4A8 steps at 1 / 2 / 4 / 16
#: tokens: 0.989 / 0.995 / 0.993 / 0.991 of the narrower programs, and 0.994 / 0.993 / 0.991 / 0.990
#: at 1 / 4 / 16 / 32 in a second call (`policy_ab.py --set-a act_quant.WIDE_ROWS=0`). 0 turns it off;
#: results never change.
WIDE_ROWS = 32


def quant_warps(block: int, rows: int) -> int:
    """Warps of a quantizer program whose loop step (or whole row) is `block` columns, in a launch of `rows` rows."""
    warps = 16 if block >= 8192 else 8 if block >= 2048 else 4
    return min(32, 2 * warps) if rows <= WIDE_ROWS else warps


def quantize_act_triton(x2: torch.Tensor, spec: ActQuantSpec, codes_dtype: torch.dtype | None = None,
                        group_sums: int = 0, sums_by_group: bool = False, fragment_order: bool = False):
    """x2 [M, K] -> codes [M, K] (int8 or float8_e4m3fn) and fp32 scales [M].

    codes_dtype=torch.bfloat16/float16 stores the same codes as 16-bit floats (every int8, int4 and
    e4m3 code is exact there), for kernels that feed them to 16-bit tensor cores.
    group_sums=G > 0 also returns the fp32 sums of the codes over each G columns [M, K // G]: the
    W4A8 GEMM needs them for the weight mins, and summing here (where x is read anyway) saves a
    reduction over every K tile of every output tile there. sums_by_group=True returns them as
    [K // G, M] instead, rows padded to 16 bytes (a TMA box per group for the wgmma kernels).
    fragment_order: int8 codes with each 8 columns in `S8_FRAGMENT_ORDER` (`CodesSpec.fragment_order`)."""
    if spec.group_size is not None:
        raise ValueError("the Triton activation quantizer is per token only")
    m, k = x2.shape
    fp8 = spec.dtype == "fp8"
    q = empty_rows(m, k, codes_dtype or (torch.float8_e4m3fn if fp8 else torch.int8), x2.device)
    if fragment_order:
        check_fragment_codes(k, q.dtype)
    s = torch.empty((m,), device=x2.device, dtype=torch.float32)
    block = act_block(k, group_sums, m)
    if group_sums and not fused_group_sums(k, group_sums):
        raise ValueError(f"group sums need K ({k}) and the block ({block}) to be multiples of {group_sums}")
    # without group sums the kernel never touches sum_ptr: s stands in for it (no allocation)
    if group_sums and sums_by_group:
        sums = torch.empty((k // group_sums, -(-m // 4) * 4), device=x2.device, dtype=torch.float32)[:, :m]
    elif group_sums:
        sums = torch.empty((m, k // group_sums), device=x2.device, dtype=torch.float32)
    else:
        sums = s
    pdl = small_pdl(pdl_enabled(q))
    # element strides of the sums per token and per group, whichever way round they are stored
    sum_row, sum_group = 0, 0
    if group_sums:
        sum_row, sum_group = (sums.stride(1), sums.stride(0)) if sums_by_group else sums.stride()
    _act_quant_kernel[(m,)](x2, q, s, sums, k, x2.stride(0), q.stride(0), sum_row, sum_group,
                            QMAX=_QMAX[spec.dtype], FP8=fp8, BLOCK=block, PDL=pdl, GROUP=group_sums,
                            ONE_PASS=one_pass(k, group_sums, m), FO=fragment_order,
                            num_warps=quant_warps(block, m), **launch_kwargs(pdl))
    return (q, s, sums) if group_sums else (q, s)


def quantize_for(x2: torch.Tensor, spec: ActQuantSpec, codes: CodesSpec) -> ActCodes:
    """x2's codes as a producer would hand them to a linear whose kernel asked for `codes` (`codes_for`): in its
    dtype and column order (benchmarks and tests stand in for the engine's producers with this)."""
    q, s = quantize_act_triton(x2, spec, codes_dtype=codes.dtype, fragment_order=codes.fragment_order)
    return ActCodes(q, s, codes.qmax, codes.fragment_order)


def quantize_act_reference(x2: torch.Tensor, spec: ActQuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_activations(x2, spec)
