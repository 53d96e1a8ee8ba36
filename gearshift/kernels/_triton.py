"""Whether Triton kernels can run here: on a CUDA device, or on CPU under TRITON_INTERPRET=1."""

from __future__ import annotations

import os

import torch

try:  # triton is an optional dependency (the CPU engine runs without it)
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except Exception:  # pragma: no cover - depends on the install
    triton = None
    tl = None
    HAS_TRITON = False


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_usable(t: torch.Tensor) -> bool:
    """Triton kernels run on CUDA tensors, or on CPU tensors only under the interpreter."""
    if not HAS_TRITON:
        return False
    return t.is_cuda or interpreting()


# Host-side grid arithmetic. triton.cdiv / triton.next_power_of_2 are `constexpr_function`s since
# Triton 3.5: called from Python they cost microseconds each (benchmarks/host_overhead.py), which
# eager decode pays several times per linear.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
