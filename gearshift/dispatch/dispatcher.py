"""The run-time side of the dispatcher: one lookup per linear call, then the kernel."""

from __future__ import annotations

import torch

from gearshift.kernels.reference import linear_reference
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.base import WeightFormat


class Dispatcher:
    """Chooses a kernel per call. This base class always runs the torch reference."""

    name = "reference"

    def linear(self, x: torch.Tensor, store: WeightFormat, act: ActQuantSpec | None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear_reference(x, store, act, bias)


_active: Dispatcher = Dispatcher()


def get_dispatcher() -> Dispatcher:
    return _active


def set_dispatcher(d: Dispatcher) -> None:
    global _active
    _active = d


def run_linear(x: torch.Tensor, store: WeightFormat, act: ActQuantSpec | None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    return _active.linear(x, store, act, bias)
