"""Library strategies: what torch/cuBLAS offer, on (or converted from) our stores.

* `dequant_cublas`: dequantize one layer into a transient bf16 buffer (Triton for int4), then
  cuBLAS `F.linear`. No persistent second copy; DPR P_W=(4) promoted to bf16 in memory.
* `tinygemm` (`torch._weight_int4pack_mm`): needs its own packed weight and a
  [K/G, N, 2] scale/zero tensor, i.e. a second copy of the weight. Its value is
  w = (q - 8) * s + z, so z = min + 8 * s, and its packer takes the even column in the high
  nibble. Used by the benchmark only, never by the dispatcher.
* `scaled_mm_fp8`: `torch._scaled_mm` with a per-row fp8 weight (1 byte/param, a different
  quantization of the dense weight, not our store) and per-token fp8 activations; benchmark only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gearshift.kernels._triton import HAS_TRITON
from gearshift.kernels.reference import linear_reference
from gearshift.quant.activations import ActQuantSpec, fake_quantize, quantize_activations
from gearshift.quant.base import WeightFormat
from gearshift.quant.int4 import Int4Weight


def dequant_cublas_linear(x2: torch.Tensor, store: WeightFormat, act: ActQuantSpec | None) -> torch.Tensor:
    """Same function as the reference, but with the Triton dequantizer and no cached copy."""
    if isinstance(store, Int4Weight) and HAS_TRITON and x2.is_cuda:
        from gearshift.kernels.dequant import dequant_int4_triton

        w = dequant_int4_triton(store, x2.dtype)
    else:
        w = store.dequantize(x2.dtype)
    if act is not None:
        x2 = fake_quantize(x2, act)
    return F.linear(x2, w)


def dequant_cublas_reference(x2: torch.Tensor, store: WeightFormat, act: ActQuantSpec | None) -> torch.Tensor:
    return linear_reference(x2, store, act)


# --- tinygemm (benchmark only: holds a second, converted copy) ---------------------------------

def to_tinygemm(store: Int4Weight, inner_k_tiles: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed weight, scales_and_zeros) for torch._weight_int4pack_mm; a second weight copy."""
    q = store.rows_qweight()
    swapped = ((q & 0x0F) << 4) | (q >> 4)  # our even column is the low nibble; tinygemm wants it high
    packed = torch.ops.aten._convert_weight_to_int4pack(swapped.contiguous(), inner_k_tiles)
    s = store.scales.float()
    z = store.mins.float() + 8.0 * s
    sz = torch.stack((s, z), dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [K/G, N, 2]
    return packed, sz


def tinygemm_linear(x2: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, group_size: int) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm(x2, packed, group_size, sz)


# --- fp8 scaled_mm (benchmark only: its own fp8 weight) ----------------------------------------

def to_fp8_rowwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense [N, K] -> fp8 e4m3 codes and fp32 per-row scales [1, N]."""
    s = (w.float().abs().amax(1) / 448.0).clamp_min(1e-8)
    q = (w.float() / s[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s[None, :].contiguous()


def scaled_mm_fp8_linear(x2: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    xq, xs = quantize_activations(x2, ActQuantSpec("fp8"))
    return torch._scaled_mm(xq, wq.t(), scale_a=xs.reshape(-1, 1).float().contiguous(), scale_b=ws, out_dtype=x2.dtype)
