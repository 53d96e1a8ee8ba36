"""One switch for the engine's small fused Triton kernels (RMSNorm, RoPE, KV-cache write, SwiGLU).

On by default on CUDA; `set_fused_kernels(False)` restores the torch ops (benchmarks compare
the two). GEMM kernels are chosen by the dispatcher, not here.
"""

from __future__ import annotations

from gearshift.kernels._triton import HAS_TRITON

_FUSED = {"enabled": True, "on_cpu": False, "swiglu_codes": True, "swiglu_codes_min_rows": 1}


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


def swiglu_codes_for(rows: int) -> bool:
    """Whether the fused SwiGLU also emits the down projection's activation codes (where its kernel
    takes them) for `rows` tokens. With one program per row (the codes need the row's max) that was
    slower than SwiGLU plus the quantizer below 64 tokens (H100, benchmarks/swiglu_codes.py, per layer:
    6.0 against 5.5 us at 1 token), so it started at 64 until stop 34; since then up to
    `silu_mul.SPLIT_ROWS` rows split each row over programs that meet at a barrier: 3.8 against 5.3 us
    at 1 token, 4.7 against 6.2 at 16, 6.9 against 9.4 at 64 (and 11.9 against 13.9 at 256, 157
    against 202 at 4096 with one program per row). `set_swiglu_codes` changes it (same bits either
    way: for A/B timing)."""
    return _FUSED["swiglu_codes"] and rows >= _FUSED["swiglu_codes_min_rows"]


def set_swiglu_codes(enabled: bool, min_rows: int | None = None) -> None:
    _FUSED["swiglu_codes"] = bool(enabled)
    if min_rows is not None:
        _FUSED["swiglu_codes_min_rows"] = int(min_rows)
