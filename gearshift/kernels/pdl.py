"""Programmatic dependent launch (Hopper) and L2 weight prefetch for the decode kernels.

Why: at 1..16 tokens a linear reads its weights once and is done in 3..30 us, so each launch's
fixed cost (launch, ramp-up of the first loads, the tail of the last wave) is a large part of a
decode step. A kernel launched with PDL may start while its predecessor is still running; it
touches nothing that the predecessor writes until `grid_wait()` (griddepcontrol.wait returns once
the predecessor has completed and its writes are visible), but it may read what nobody writes:
its own weights. The fragment GEMV loads its first weight blocks into registers before the wait;
the W4A16 wgmma kernel (`w4a16_wgmma.py`, its own Gluon helpers) TMAs its first ring's weight tiles
(`w4a8_progressive` can do the same, off by default: it measured slower at M = 64 / 128).

Measured on the H100 (benchmarks/pdl.py): PDL takes 3-6% off a 32-layer step of linears at
1..8 tokens when the next kernel is let in at the right point (`pdl_trigger`); letting it in at
the start hurt from 2 tokens on (since the preloading tiles of stop 30: from 4 on). A bulk L2
prefetch of each program's whole weight slice (`prefetch_l2`, cp.async.bulk.prefetch) was 15-25%
slower, so it is off unless GEARSHIFT_L2_PREFETCH=1.

Contract for every kernel launched with `launch_kwargs()`: no load of an input written by an
earlier kernel, and no store at all, before `grid_wait()`. A kernel that calls
`launch_dependents()` lets the next PDL kernel be scheduled once all of its programs have started;
that kernel still waits for this one to complete before it reads anything this one writes.
The small kernels between the linears enter through `small_prologue()`, which triggers before or after
their wait as `switches.small_trigger_rule` says (after it, an early trigger of the linear before them
cannot let the next linear in beside it: stop 45).
`set_pdl(False)` (or GEARSHIFT_PDL=0) launches everything plainly; the results are identical.
"""

from __future__ import annotations

import functools
import os

import torch

from gearshift.kernels._triton import HAS_TRITON, interpreting, tl, triton
from gearshift.kernels.switches import small_trigger


def _env_on(name: str) -> bool:
    return os.environ.get(name, "1") not in ("0", "", "false", "False")


_STATE = {"pdl": _env_on("GEARSHIFT_PDL")}
#: the fragment kernel's whole-slice bulk L2 prefetch before the PDL wait (a module switch, so
#: `benchmarks/policy_ab.py --set-b pdl.L2_PREFETCH=1` can A/B it)
L2_PREFETCH = os.environ.get("GEARSHIFT_L2_PREFETCH", "0") == "1"


def set_pdl(enabled: bool) -> None:
    _STATE["pdl"] = bool(enabled)


def set_l2_prefetch(enabled: bool) -> None:
    global L2_PREFETCH
    L2_PREFETCH = bool(enabled)


@functools.lru_cache(maxsize=None)
def _triton_has_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception:  # pragma: no cover - depends on the install
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


@functools.lru_cache(maxsize=None)
def _device_has_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def _hopper(t: torch.Tensor) -> bool:
    if not (HAS_TRITON and t.is_cuda) or interpreting():
        return False
    return _device_has_pdl(t.device.index if t.device.index is not None else torch.cuda.current_device())


def pdl_enabled(t: torch.Tensor) -> bool:
    """Launch with PDL (griddepcontrol in the kernel) for kernels writing to t's device."""
    return _STATE["pdl"] and _hopper(t) and _triton_has_pdl()


def l2_prefetch_enabled(t: torch.Tensor) -> bool:
    """Bulk L2 prefetch of the weight slice (cp.async.bulk.prefetch, sm_90+) on t's device."""
    return L2_PREFETCH and _hopper(t)


def small_pdl(on: bool) -> int:
    """The PDL constexpr of a small kernel between the linears (`small_prologue`): 0 plain, 1 let
    the next kernel in before the wait, 2 after it (`switches.small_trigger`)."""
    return 0 if not on else 1 if small_trigger() == "start" else 2


def launch_kwargs(on: bool) -> dict:
    """Extra launch arguments for a kernel whose PDL constexpr is `on`."""
    return {"launch_pdl": True} if on else {}


if HAS_TRITON:
    #: the two griddepcontrol instructions as inline PTX with one dummy output (Triton and Gluon kernels)
    GDC_WAIT = tl.constexpr("griddepcontrol.wait; mov.u32 $0, 0;")
    GDC_LAUNCH = tl.constexpr("griddepcontrol.launch_dependents; mov.u32 $0, 0;")

    @triton.jit
    def grid_wait(PDL: tl.constexpr):
        """Block until the previous kernel in the stream has completed and its writes are visible."""
        if PDL:
            tl.inline_asm_elementwise(GDC_WAIT, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


    @triton.jit
    def launch_dependents(PDL: tl.constexpr):
        """Let the next PDL kernel be scheduled once every program of this one has got here."""
        if PDL:
            tl.inline_asm_elementwise(GDC_LAUNCH, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


    @triton.jit
    def small_prologue(PDL: tl.constexpr):
        """A small kernel's PDL entry (PDL from `small_pdl`): the wait, and the trigger before or after it."""
        if PDL == 1:
            launch_dependents(PDL)
        grid_wait(PDL)
        if PDL == 2:
            launch_dependents(PDL)


    @triton.jit
    def prefetch_l2(ptr, nbytes, pred):
        """One bulk L2 prefetch of nbytes (a multiple of 16, 16-byte aligned) at ptr, per element
        where pred != 0 (one element per thread; other threads issue nothing)."""
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r,r", [ptr, nbytes, pred], dtype=tl.int32, is_pure=False, pack=1)
