"""Shared Triton index helpers for the per-row kernels (one program per (batch, token, head))."""

from __future__ import annotations

from gearshift.kernels._triton import HAS_TRITON, tl, triton  # noqa: F401 (Triton's JIT wants tl in the module)

if HAS_TRITON:

    @triton.jit
    def split_bth(pid, T, H):
        """Program id -> (b, t, h, b*T + t) for a grid of B*T*H programs, head fastest."""
        h = pid % H
        bt = pid // H
        return bt // T, bt % T, h, bt
