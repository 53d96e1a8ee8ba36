"""Per-output-channel symmetric int8 weights (the W8A16 / W8A8 store)."""

from __future__ import annotations

import torch

from gearshift.quant.base import WeightFormat, register_format


@register_format
class Int8Weight(WeightFormat):
    """`w = q * scale[row]`, q in -127..127 stored as int8, one fp32 scale per output row."""

    format_name = "int8c"
    weight_bits = 8

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor):
        super().__init__(qweight.shape[0], qweight.shape[1])
        if qweight.dtype != torch.int8 or scales.shape != (qweight.shape[0],):
            raise ValueError("int8 store needs int8 qweight [N, K] and scales [N]")
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.float() * self.scales.float().unsqueeze(1)).to(dtype)

    @classmethod
    def from_state(cls, tensors, meta):
        return cls(tensors["qweight"], tensors["scales"])


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    w = weight.detach().float()
    scale = (w.abs().amax(1) / 127.0).clamp_min(1e-8)
    q = torch.clamp(torch.round(w / scale.unsqueeze(1)), -127, 127).to(torch.int8)
    return Int8Weight(q, scale)
