"""Which Triton kernels get compiled from some point on, and how long each compile takes.

A server watches this after its warm-up. There, a compile stalls the whole running batch (seconds
at 8B scale), and each one it reports is a shape the warm-up did not cover. The report names the
kernel with Triton's own description of the specialization: the argument types and which integer
arguments were specialized as divisible by 16. A kernel that Triton loads from its disk cache counts
too, since it is still a miss in the in-memory cache, but that takes milliseconds. Triton's hooks
(`triton.knobs.runtime.jit_cache_hook` / `jit_post_compile_hook`) fire on the launching thread.
Hooks installed before this one keep running.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from gearshift.kernels._triton import HAS_TRITON, triton


@dataclass
class CompileEvent:
    kernel: str  # the kernel function's qualified name
    signature: str  # Triton's repr: options and argument types with their specialization
    seconds: float  # from the in-memory cache miss to the compiled (or disk-loaded) kernel


def _runtime_knobs():
    knobs = getattr(triton, "knobs", None) if HAS_TRITON else None
    rt = getattr(knobs, "runtime", None)
    return rt if rt is not None and hasattr(rt, "jit_cache_hook") and hasattr(rt, "jit_post_compile_hook") else None


class CompileWatch:
    """Records a `CompileEvent` for every Triton compile between `start()` and `stop()`, and passes it to
    `on_compile` (called on the compiling thread: keep it short)."""

    def __init__(self, on_compile: Callable[[CompileEvent], None] | None = None):
        self.on_compile = on_compile
        self.events: list[CompileEvent] = []
        self._started: dict[tuple, float] = {}
        self._prev: tuple = (None, None)
        self._lock = threading.Lock()
        self.active = False

    @staticmethod
    def available() -> bool:
        """Whether this Triton has the compile hooks (3.4 and later)."""
        return _runtime_knobs() is not None

    def start(self) -> bool:
        """Install the hooks; False (and nothing installed) where this Triton has none."""
        rt = _runtime_knobs()
        if rt is None or self.active:
            return self.active
        self._prev = (rt.jit_cache_hook, rt.jit_post_compile_hook)
        rt.jit_cache_hook, rt.jit_post_compile_hook = self._before, self._after
        self.active = True
        return True

    def stop(self) -> None:
        rt = _runtime_knobs()
        if rt is not None and self.active:
            rt.jit_cache_hook, rt.jit_post_compile_hook = self._prev
        self.active = False

    def _before(self, **hook_args):
        with self._lock:
            self._started[(threading.get_ident(), str(hook_args["key"]))] = time.perf_counter()
        return self._chain(0, hook_args)

    def _after(self, **hook_args):
        now = time.perf_counter()
        with self._lock:
            t0 = self._started.pop((threading.get_ident(), str(hook_args["key"])), now)
        fn = hook_args["fn"]
        ev = CompileEvent(getattr(fn, "name", None) or str(fn), hook_args["repr"], now - t0)
        with self._lock:
            self.events.append(ev)
        if self.on_compile is not None:
            self.on_compile(ev)
        return self._chain(1, hook_args)

    def _chain(self, which: int, hook_args: dict):
        """The hook that was installed before this watch (0: before compiling, 1: after), with Triton's arguments."""
        prev = self._prev[which]
        return prev(**hook_args) if prev is not None else None
