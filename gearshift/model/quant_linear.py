"""`QuantLinear`: one weight store, many precision modes.

The store (dense, int8, group-wise int4, ...) is held once; the precision mode is an argument
of `forward`. W4A16, W4A8 and W4A4 therefore read the very same packed int4 tensors, which is
what lets QSPEC draft and verify with one model and GEARBX swap gears without a second model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gearshift.dispatch import get_dispatcher, run_linear, run_linear_codes
from gearshift.errors import GearshiftError
from gearshift.kernels.act_quant import ActCodes, CodesSpec
from gearshift.kernels.switches import x_tiles_on
from gearshift.kernels.x_tiles import XTiles
from gearshift.quant.base import WeightFormat
from gearshift.quant.modes import PrecisionMode, get_mode


_STORE_VERSION = [0]


def store_version() -> int:
    """Bumped on every store or activation-quantizer swap, so cached CUDA graphs can tell."""
    return _STORE_VERSION[0]


@dataclass(frozen=True)
class CodesOnly:
    """Activations whose producer (an RMSNorm, SwiGLU) stored only their per-token codes, because
    the next linear's kernel takes those (`QuantLinear.codes_for`) and nothing observes the layer:
    the shape and dtype the activations would have had. `QuantLinear.forward` takes it as x."""
    codes: ActCodes
    shape: tuple[int, ...]
    dtype: torch.dtype


class QuantLinear(nn.Module):
    def __init__(self, store: WeightFormat, bias: torch.Tensor | None = None, pinned_mode: str | None = None):
        super().__init__()
        self.store = store
        if bias is not None:
            self.register_buffer("bias", bias)
        else:
            self.bias = None
        #: a layer that always runs one mode whatever the model's mode (the lm_head runs w16a16)
        self.pinned_mode = pinned_mode
        #: per-mode activation quantizers that replace the mode's default (set by calibration)
        self.act_overrides: dict[str, object] = {}

    @property
    def in_features(self) -> int:
        return self.store.in_features

    @property
    def out_features(self) -> int:
        return self.store.out_features

    def supports(self, mode: str | PrecisionMode) -> bool:
        m = get_mode(mode) if isinstance(mode, str) else mode
        return m.weight_bits in (0, self.store.weight_bits)

    def _act(self, mode: str | PrecisionMode):
        wanted = self.pinned_mode or mode
        m = get_mode(wanted) if isinstance(wanted, str) else wanted
        if m.weight_bits not in (0, self.store.weight_bits):
            raise GearshiftError(
                f"mode {m.name} needs {m.weight_bits}-bit weights but this layer holds "
                f"{self.store.format_name} ({self.store.weight_bits}-bit); load or quantize the model for it")
        return self.act_overrides.get(m.name, m.act)

    def forward(self, x: torch.Tensor | CodesOnly | XTiles, mode: str | PrecisionMode = "w4a16",
                codes: ActCodes | None = None) -> torch.Tensor:
        """codes: x already quantized per token (from the RMSNorm before this layer, in the range
        `codes_qmax` asked for); the kernel then skips its own quantizer. Same result either way.
        x may be `CodesOnly` (the codes without the activations) or `XTiles` (in the fragment kernel's
        layout, where `x_tiles_for` asked for it)."""
        if isinstance(x, CodesOnly):
            return self.forward_codes(x.codes, mode, x.dtype, x.shape[:-1])
        if isinstance(x, XTiles):
            ask = getattr(get_dispatcher(), "linear_tiles", None)
            if ask is not None:
                act = self._act(mode)
                return ask(x, self.store, act, None if self.bias is None else self.bias.to(x.dtype))
            x = x.rows()
        act = self._act(mode)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return run_linear(x, self.store, act, bias, codes)

    def glu(self, x: torch.Tensor | CodesOnly | XTiles, mode: str | PrecisionMode = "w4a16",
            codes: ActCodes | None = None, y_tiles: bool = False) -> torch.Tensor | XTiles | None:
        """For a fused gate_up layer (gate rows, then up rows): silu(gate) * up from its kernel's epilogue,
        where the dispatcher's kernel for these tokens has one (on x, or on its `codes` in W4A8 / W4A4); None
        elsewhere, and for a layer that forward hooks observe (they want gate_up's own output). Same bits as
        `forward` then SwiGLU. y_tiles: the product as `XTiles` where the epilogue can store it so (down's
        `x_tiles_for`), else in rows."""
        ask = getattr(get_dispatcher(), "linear_glu", None)
        if ask is None or self.bias is not None or self.observed():
            return None
        act = self._act(mode)
        if isinstance(x, CodesOnly):
            return ask(None, self.store, act, x.codes, x.shape, x.dtype)
        return ask(x, self.store, act, codes, y_tiles=y_tiles)

    def forward_codes(self, codes: ActCodes, mode: str | PrecisionMode, dtype: torch.dtype,
                      lead_shape: tuple[int, ...]) -> torch.Tensor:
        """`forward` for activations whose producer stored only their codes (in the range and dtype
        `codes_for` asked for): the output [*lead_shape, out_features] in `dtype`. Raises where no
        kernel takes them. Forward hooks do not see such a call: producers ask `observed` first."""
        act = self._act(mode)
        bias = None if self.bias is None else self.bias.to(dtype)
        y = run_linear_codes(codes, self.store, act, bias, dtype)
        return y.reshape(*lead_shape, self.out_features)

    def observed(self) -> bool:
        """Whether forward hooks (calibration's statistics) want this layer's activations, so a
        producer must store them even where the kernel would take codes alone."""
        return bool(self._forward_pre_hooks or self._forward_hooks or nn.modules.module._global_forward_pre_hooks
                    or nn.modules.module._global_forward_hooks)

    def codes_qmax(self, mode: str | PrecisionMode, tokens: int) -> float | None:
        """Whether the kernel for `tokens` rows in this mode would take its activations already
        quantized (their integer range), so the producer of x can emit them in the same pass."""
        ask = getattr(get_dispatcher(), "codes_qmax", None)  # absent on a dispatcher that takes no codes
        return None if ask is None else ask(self.store, self._act(mode), tokens)

    def x_tiles_for(self, mode: str | PrecisionMode, tokens: int, dtype: torch.dtype,
                    linear: str | None = None) -> bool:
        """Whether the producer of x should store it in the fragment kernel's layout (`XTiles`) because the
        kernel for these tokens reads it so; never for a layer that hooks observe (they want the rows).
        linear: this projection's `switches.X_TILE_LINEARS` name, which the switches may leave out (A/Bs)."""
        ask = getattr(get_dispatcher(), "x_tiles_for", None)
        return (ask is not None and not self.observed() and x_tiles_on(tokens, linear)
                and ask(self.store, self._act(mode), tokens, dtype))

    def codes_for(self, mode: str | PrecisionMode, tokens: int, dtype: torch.dtype) -> CodesSpec | None:
        """`codes_qmax` and the dtype (int8, or `dtype` itself) the kernel takes the codes in."""
        ask = getattr(get_dispatcher(), "codes_for", None)
        if ask is not None:
            return ask(self.store, self._act(mode), tokens, dtype)
        qmax = self.codes_qmax(mode, tokens)  # a dispatcher from before codes_for: int8 codes
        return None if qmax is None else CodesSpec(qmax, torch.int8)

    def set_act_quantizer(self, mode: str, quantizer) -> None:
        """Replace a mode's activation quantizer (an ActQuantSpec or a calibrated nn.Module)."""
        get_mode(mode)
        self.act_overrides[mode] = quantizer
        _STORE_VERSION[0] += 1
        if isinstance(quantizer, nn.Module):  # registered, so .to(device) moves its tensors
            self.add_module(f"act_{mode}", quantizer)

    def set_store(self, store: WeightFormat) -> WeightFormat:
        """Swap the weight store (GEARBX gear shift); returns the previous one."""
        old, self.store = self.store, store
        _STORE_VERSION[0] += 1
        return old


def concat_rows(stores: list[WeightFormat]) -> WeightFormat:
    """Stack stores of one format along the output dimension (q/k/v -> qkv, gate/up -> gate_up).

    Every format keeps its per-row data (packed rows, row scales, group scales) in buffers
    whose first dimension is the output dimension, so the concatenation is exact.
    """
    first = stores[0]
    kinds = {(type(s), str(s.meta())) for s in stores}
    if len(kinds) != 1:
        return _concat_dense(stores)
    tensors = {}
    for name, _ in first.named_buffers():
        parts = [getattr(s, name) for s in stores]
        tensors[name] = torch.cat(parts, 0)
    return type(first).from_state(tensors, first.meta())


def _concat_dense(stores: list[WeightFormat]) -> WeightFormat:
    raise GearshiftError("cannot fuse projections stored in different formats: "
                         + ", ".join(f"{s.format_name}{s.meta() or ''}" for s in stores))
