"""The torch reference of every quantized linear: the CPU path and the oracle of GPU kernels.

It dequantizes the store, fake-quantizes the activations the way the mode says, and calls
`F.linear`. On CPU the dequantized weight can be cached on the store (one cache per store,
shared by every mode that reads it: W4A16, W4A8 and W4A4 see the same tensor), which trades
memory for speed; GPU kernels read the packed weights instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gearshift.quant.activations import ActQuantSpec, dequantize_activations, fake_quantize
from gearshift.quant.base import WeightFormat

_CACHE_ATTR = "_gs_dequant_cache"
_cache_enabled = {"cpu": True}


def set_dequant_cache(enabled: bool, device_type: str = "cpu") -> None:
    """Turn the dequantized-weight cache of the reference path on or off for a device type."""
    _cache_enabled[device_type] = bool(enabled)


def dequantized_weight(store: WeightFormat, dtype: torch.dtype) -> torch.Tensor:
    if not _cache_enabled.get(store.device.type, False) or store.format_name == "dense":
        return store.dequantize(dtype)
    cached = getattr(store, _CACHE_ATTR, None)
    if cached is not None and cached.dtype == dtype and cached.device == store.device:
        return cached
    w = store.dequantize(dtype)
    object.__setattr__(store, _CACHE_ATTR, w)  # plain attribute: not a buffer, never saved
    return w


def drop_dequant_cache(store: WeightFormat) -> None:
    if getattr(store, _CACHE_ATTR, None) is not None:
        object.__setattr__(store, _CACHE_ATTR, None)


def linear_reference(x: torch.Tensor, store: WeightFormat, act: ActQuantSpec | None,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = Q_act(x) @ dequant(W).T + b, computed in x's dtype."""
    w = dequantized_weight(store, x.dtype)
    if isinstance(act, ActQuantSpec):
        x = fake_quantize(x, act)
    elif act is not None:  # a calibrated quantizer object (outlier channels, rotation, ...)
        x = act.fake_quantize(x)
    return F.linear(x, w, bias)


def linear_reference_codes(q: torch.Tensor, scales: torch.Tensor, store: WeightFormat, act: ActQuantSpec,
                           bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """`linear_reference` for activations given only as their per-token codes q (any dtype holding
    the integers) and fp32 scales, in `dtype`: the same Q_act(x) when q, scales = Q(x)."""
    x = dequantize_activations(q, scales.reshape(*q.shape[:-1], 1), act, dtype)  # (one group per token)
    return F.linear(x, dequantized_weight(store, dtype), bias)
