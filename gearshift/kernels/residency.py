"""Cap how many CTAs of one compiled Triton kernel share an SM, by launching it with shared memory
it does not use.

Why: the fragment GEMV's whole decode step ran up to 1.09x slower whenever ptxas happened to give its
tiles fewer registers, i.e. room for more CTAs per SM (stops 35 and 36). Registers are not ours to
set (`maxnreg` only caps them), shared memory per launch is, so residency became a parameter we
could measure (`benchmarks/mma_ablations/step_ladder.py --residency`). It refuted the idea: every cap
made the step slower (stop 36, docs/kernels_history.md), so nothing caps by default. Timing only: the
kernel's results never depend on it.
"""
from __future__ import annotations

import ctypes

SHARED_PER_SM = 233472  # bytes of shared memory per SM on sm_90 (228 KB)
RESERVED_PER_CTA = 1024  # the driver's own shared memory per CTA
MAX_SHARED_PER_CTA = 232448  # 227 KB
_ATTR_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_SET_ON = "_gearshift_residency"


def shared_bytes(ctas_per_sm: int, own: int = 0) -> int:
    """Shared memory per CTA at which at most `ctas_per_sm` CTAs fit on an SM (never below `own`)."""
    if ctas_per_sm < 1:
        raise ValueError(f"ctas_per_sm must be >= 1, got {ctas_per_sm}")
    need = SHARED_PER_SM // (ctas_per_sm + 1) - RESERVED_PER_CTA + 128  # one CTA more no longer fits
    return min(max(own, need), MAX_SHARED_PER_CTA)


def cap(kernel, ctas_per_sm: int) -> None:
    """Make every later launch of `kernel` (a Triton CompiledKernel that has run once) ask for the
    shared memory of `shared_bytes(ctas_per_sm)`. Idempotent per kernel; one cap per compiled kernel
    (give the cap to the kernel as a constexpr so that each cap compiles its own)."""
    done = getattr(kernel, _SET_ON, None)
    if done == ctas_per_sm:
        return
    if done is not None:
        raise ValueError(f"kernel {kernel.name} is already capped at {done} CTAs per SM")
    meta = tuple(kernel.packed_metadata)
    if len(meta) != 3:
        raise RuntimeError(f"this Triton packs launch metadata as {meta!r}; residency.cap knows (warps, ctas, shared)")
    warps, ctas, own = meta
    shared = shared_bytes(ctas_per_sm, own)
    if shared > 49152:
        err = ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute(ctypes.c_void_p(kernel.function),
                                                             _ATTR_MAX_DYNAMIC_SHARED, ctypes.c_int(shared))
        if err:
            raise RuntimeError(f"cuFuncSetAttribute(max dynamic shared = {shared}) failed with CUresult {err}")
    kernel.packed_metadata = (warps, ctas, shared)
    setattr(kernel, _SET_ON, ctas_per_sm)
