"""Which Triton kernels get compiled from some point on, and how long each compile takes.

A server watches this after its warm-up. There, a compile stalls the whole running batch (seconds
at 8B scale), and each one it reports is a shape the warm-up did not cover. The report names the
kernel with its specialization: the argument types, which integer arguments were specialized as
divisible by 16, and the constexpr values. A kernel that Triton loads from its disk cache counts
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
    signature: str  # options, argument types with their specialization (divisible by 16), constexpr values
    seconds: float  # from the in-memory cache miss to the compiled (or disk-loaded) kernel


def _runtime_knobs():
    knobs = getattr(triton, "knobs", None) if HAS_TRITON else None
    rt = getattr(knobs, "runtime", None)
    return rt if rt is not None and hasattr(rt, "jit_cache_hook") and hasattr(rt, "jit_post_compile_hook") else None


def describe(kernel: str, hook_args: dict) -> str:
    """The compile's specialization, from the hook's `compile` dict: Triton's own `repr` lists the
    arguments' specialization from the wrong part of the key in 3.6 (every argument reads `()`), so
    it cannot tell two specializations apart. Falls back to that `repr` where the dict lacks the parts."""
    c = hook_args.get("compile") or {}
    sig, consts = c.get("signature"), c.get("constants") or {}
    configs = c.get("configs") or [{}]
    attrs = configs[0] if isinstance(configs[0], dict) else {}
    if not isinstance(sig, dict) or not isinstance(consts, dict):
        return str(hook_args.get("repr", kernel))
    parts = []
    for i, (name, ty) in enumerate(sig.items()):
        if (i,) in consts or name in consts:
            parts.append(f"{name}={consts.get((i,), consts.get(name))}")
            continue
        flags = [f"{str(k).split('.')[-1]}={v}" for k, v in attrs.get((i,), []) if isinstance(k, str)]
        parts.append(f"{name}: {ty}" + "".join(f" {f}" for f in flags))
    return f"{kernel}[num_warps={c.get('num_warps')}, num_stages={c.get('num_stages')}]({', '.join(parts)})"


class _Hooks:
    """The one pair of hooks installed for all started watches, chained to the hooks that were there
    before the first one started and restored when the last one stops (in any order: a watch per hook
    pair would put a stopped watch's hooks back when watches stop out of order)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.watches: list[CompileWatch] = []
        self.prev: tuple = (None, None)

    def add(self, watch: CompileWatch) -> bool:
        rt = _runtime_knobs()
        if rt is None:
            return False
        with self.lock:
            if not self.watches:
                self.prev = (rt.jit_cache_hook, rt.jit_post_compile_hook)
                rt.jit_cache_hook, rt.jit_post_compile_hook = self.before, self.after
            self.watches.append(watch)
        return True

    def remove(self, watch: CompileWatch) -> None:
        rt = _runtime_knobs()
        with self.lock:
            if watch not in self.watches:
                return
            self.watches.remove(watch)
            if not self.watches and rt is not None and rt.jit_post_compile_hook == self.after:
                rt.jit_cache_hook, rt.jit_post_compile_hook = self.prev
                self.prev = (None, None)

    def before(self, **hook_args):
        for w in list(self.watches):
            w._before(hook_args)
        return self._chain(0, hook_args)

    def after(self, **hook_args):
        for w in list(self.watches):
            w._after(hook_args)
        return self._chain(1, hook_args)

    def _chain(self, which: int, hook_args: dict):
        """The hook that was installed before the first watch (0: before compiling, 1: after), with
        Triton's arguments."""
        prev = self.prev[which]
        return prev(**hook_args) if prev is not None else None


_HOOKS = _Hooks()


class CompileWatch:
    """Records a `CompileEvent` for every Triton compile between `start()` and `stop()`, and passes it to
    `on_compile` (called on the compiling thread: keep it short)."""

    def __init__(self, on_compile: Callable[[CompileEvent], None] | None = None):
        self.on_compile = on_compile
        self.events: list[CompileEvent] = []
        self._started: dict[tuple, float] = {}
        self._lock = threading.Lock()
        self.active = False

    @staticmethod
    def available() -> bool:
        """Whether this Triton has the compile hooks (3.4 and later)."""
        return _runtime_knobs() is not None

    def start(self) -> bool:
        """Install the hooks; False (and nothing installed) where this Triton has none."""
        if not self.active:
            self.active = _HOOKS.add(self)
        return self.active

    def stop(self) -> None:
        _HOOKS.remove(self)
        self.active = False

    def _before(self, hook_args: dict) -> None:
        with self._lock:
            self._started[(threading.get_ident(), str(hook_args["key"]))] = time.perf_counter()

    def _after(self, hook_args: dict) -> None:
        now = time.perf_counter()
        with self._lock:
            t0 = self._started.pop((threading.get_ident(), str(hook_args["key"])), now)
        fn = hook_args["fn"]
        kernel = getattr(fn, "name", None) or str(fn)
        ev = CompileEvent(kernel, describe(kernel, hook_args), now - t0)
        with self._lock:
            self.events.append(ev)
        if self.on_compile is not None:
            self.on_compile(ev)
