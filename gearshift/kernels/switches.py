"""One switch for the engine's small fused Triton kernels (RMSNorm, RoPE, KV-cache write, SwiGLU).

On by default on CUDA; `set_fused_kernels(False)` restores the torch ops (benchmarks compare
the two). GEMM kernels are chosen by the dispatcher, not here.
"""

from __future__ import annotations

from gearshift.kernels._triton import HAS_TRITON

_FUSED = {"enabled": True, "on_cpu": False}


def fused_kernels_enabled() -> bool:
    return HAS_TRITON and _FUSED["enabled"]


def set_fused_kernels(enabled: bool) -> None:
    _FUSED["enabled"] = bool(enabled)


def fused_for(t) -> bool:
    """Whether the model runs the fused kernels on tensor t: on CUDA, or on CPU when a test has
    asked for it (`fused_on_cpu`, under TRITON_INTERPRET=1: the model-level check of the fused
    path that CI can run)."""
    return fused_kernels_enabled() and (t.is_cuda or _FUSED["on_cpu"])


def fused_on_cpu(enabled: bool) -> None:
    _FUSED["on_cpu"] = bool(enabled)
