"""Dynamic activation quantizers (per token, optionally per group of input channels).

`quantize_activations` returns the integer (or fp8) codes and their scales, which is what a
low-precision kernel consumes; `fake_quantize` returns the dequantized activations, which is
the torch reference: `fake_quantize(x) @ W.T` is exactly what an A8/A4 kernel computes, up to
its accumulation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
_QMAX = {"int8": 127.0, "int4": 7.0, "fp8": FP8_MAX}


@dataclass(frozen=True)
class ActQuantSpec:
    """How a mode quantizes activations: element type and scale granularity."""

    dtype: str = "int8"  # int8 | int4 | fp8
    group_size: int | None = None  # None: one scale per token; else one per token and group of K

    def __post_init__(self):
        if self.dtype not in _QMAX:
            raise ValueError(f"unknown activation dtype {self.dtype!r}")

    @property
    def bits(self) -> int:
        return 4 if self.dtype == "int4" else 8

    def describe(self) -> str:
        return self.dtype + ("/token" if self.group_size is None else f"/g{self.group_size}")


def _grouped(x: torch.Tensor, group_size: int | None) -> torch.Tensor:
    k = x.shape[-1]
    g = k if group_size is None else group_size
    if k % g:
        raise ValueError(f"activation width {k} is not a multiple of group size {g}")
    return x.reshape(*x.shape[:-1], k // g, g)


def quantize_activations(x: torch.Tensor, spec: ActQuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [..., K] (int8 for int8/int4, float8_e4m3fn for fp8) and fp32 scales [..., K//g]."""
    xg = _grouped(x.float(), spec.group_size)
    qmax = _QMAX[spec.dtype]
    amax = xg.abs().amax(-1, keepdim=True)
    # a correctly rounded division on every device (torch divides a CUDA tensor by a Python scalar
    # as a multiplication by its reciprocal), so the Triton quantizer can give the same bits
    scale = (amax / torch.full_like(amax, qmax)).clamp_min(1e-8)
    if spec.dtype == "fp8":
        q = (xg / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    else:
        q = torch.clamp(torch.round(xg / scale), -qmax, qmax).to(torch.int8)
    return q.reshape(x.shape), scale.squeeze(-1)


def dequantize_activations(q: torch.Tensor, scale: torch.Tensor, spec: ActQuantSpec,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    qg = _grouped(q.float(), spec.group_size)
    return (qg * scale.unsqueeze(-1)).reshape(q.shape).to(dtype)


def fake_quantize(x: torch.Tensor, spec: ActQuantSpec) -> torch.Tensor:
    q, s = quantize_activations(x, spec)
    return dequantize_activations(q, s, spec, x.dtype)


# Calibrated activation quantizers (objects with per-layer state, e.g. outlier channels) are
# registered here so checkpoints can save and rebuild them. Each class provides
# `kind: str`, `fake_quantize(x)`, `to_state() -> (meta: dict, tensors: dict[str, Tensor])`
# and `from_state(meta, tensors)`.
ACT_QUANTIZERS: dict[str, type] = {}


def register_act_quantizer(cls: type) -> type:
    ACT_QUANTIZERS[cls.kind] = cls
    return cls
