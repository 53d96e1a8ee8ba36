"""One switch for the engine's small fused Triton kernels (RMSNorm, RoPE, KV-cache write, SwiGLU).

On by default on CUDA; `set_fused_kernels(False)` restores the torch ops (benchmarks compare
the two). GEMM kernels are chosen by the dispatcher, not here.
"""

from __future__ import annotations

from gearshift.kernels._triton import HAS_TRITON

_FUSED = {"enabled": True}


def fused_kernels_enabled() -> bool:
    return HAS_TRITON and _FUSED["enabled"]


def set_fused_kernels(enabled: bool) -> None:
    _FUSED["enabled"] = bool(enabled)
