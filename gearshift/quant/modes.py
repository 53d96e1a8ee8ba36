"""Precision modes: which weight bits a forward reads and how it quantizes activations.

A mode is an argument of `QuantLinear.forward`, not a copy of the model: `w4a16`, `w4a8` and
`w4a4` all read the same int4 store and differ only in the activation quantizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from gearshift.errors import GearshiftError
from gearshift.quant.activations import ActQuantSpec


@dataclass(frozen=True)
class PrecisionMode:
    name: str
    weight_bits: int  # 0: whatever each layer's store holds (GEARBX gears mix stores)
    act: ActQuantSpec | None  # None: activations stay in the compute dtype (A16)

    @property
    def act_bits(self) -> int:
        return 16 if self.act is None else self.act.bits


MODES: dict[str, PrecisionMode] = {
    m.name: m
    for m in (
        PrecisionMode("w16a16", 16, None),
        PrecisionMode("w8a16", 8, None),
        PrecisionMode("w8a8", 8, ActQuantSpec("int8")),
        PrecisionMode("w4a16", 4, None),
        PrecisionMode("w4a8", 4, ActQuantSpec("int8")),
        PrecisionMode("w4a8fp8", 4, ActQuantSpec("fp8")),
        PrecisionMode("w4a4", 4, ActQuantSpec("int4")),
        PrecisionMode("native", 0, None),
    )
}


def get_mode(name: str) -> PrecisionMode:
    try:
        return MODES[name]
    except KeyError:
        raise GearshiftError(f"unknown precision mode {name!r}; choose one of {', '.join(MODES)}") from None
