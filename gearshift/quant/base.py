"""The weight-format interface every linear layer's store implements.

A format is an `nn.Module` holding its tensors as buffers, so `.to(device)` and
`state_dict()` work unchanged; `meta()` holds the non-tensor facts (group size, bits) that a
checkpoint needs to rebuild it. Formats are registered by name so checkpoints can name them.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

FORMATS: dict[str, type["WeightFormat"]] = {}


def register_format(cls: type["WeightFormat"]) -> type["WeightFormat"]:
    FORMATS[cls.format_name] = cls
    return cls


class WeightFormat(nn.Module):
    """One stored weight matrix of logical shape [out_features, in_features]."""

    format_name: ClassVar[str] = "abstract"
    #: the weight bit width the precision modes see (16 for dense, 8, 4, ...)
    weight_bits: ClassVar[int] = 16

    def __init__(self, out_features: int, in_features: int):
        super().__init__()
        self.out_features = int(out_features)
        self.in_features = int(in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as a dense [out, in] tensor (the torch reference of every kernel)."""
        raise NotImplementedError

    def meta(self) -> dict:
        """JSON-serialisable facts needed to rebuild this store from its buffers."""
        return {}

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], meta: dict) -> "WeightFormat":
        raise NotImplementedError

    def nbytes(self) -> int:
        """Bytes of every tensor this store holds, measured from the tensors themselves."""
        return sum(t.numel() * t.element_size() for t in self.buffers())

    @property
    def device(self) -> torch.device:
        return next(self.buffers()).device

    def extra_repr(self) -> str:
        return f"{self.out_features}x{self.in_features}, {self.format_name}"


@register_format
class DenseWeight(WeightFormat):
    """An unquantized weight (fp32 / fp16 / bf16), kept as the source dtype."""

    format_name = "dense"
    weight_bits = 16

    def __init__(self, weight: torch.Tensor):
        super().__init__(weight.shape[0], weight.shape[1])
        self.register_buffer("weight", weight)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.weight.to(dtype)

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], meta: dict) -> "DenseWeight":
        return cls(tensors["weight"])


def build_format(name: str, tensors: dict[str, torch.Tensor], meta: dict) -> WeightFormat:
    """Rebuild a store from a checkpoint's tensors and metadata."""
    if name not in FORMATS:
        from gearshift.errors import GearshiftError

        raise GearshiftError(f"unknown weight format {name!r} (known: {', '.join(sorted(FORMATS))})")
    return FORMATS[name].from_state(tensors, meta)
