"""DPR bit partitions (ADAngel section 4.2): every strategy names how it splits W and X.

A strategy computes Y = X W^T as a sum of partial products X_s W_t * 2^(shift_s + shift_t)
over a weight partition P_W and an activation partition P_X, each part promoted to one native
tensor-core type (`physical`). Padding is the trivial partition, Bitwise the finest, Split in
between. The partition is data on the strategy so the profiler, the docs and the ablations
(ADAngel-R maps families by M) can all read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DPRPartition:
    """P_W, P_X (bits per part, least significant first) and the native type they run on."""

    weight_parts: tuple[int, ...]
    act_parts: tuple[int, ...]
    physical: str  # bf16 | fp16 | int8 | fp8 (the one tensor-core type all parts are promoted to)
    family: str  # padding | split | bitwise | library

    @property
    def partial_products(self) -> int:
        return len(self.weight_parts) * len(self.act_parts)

    def describe(self) -> str:
        pw = ",".join(map(str, self.weight_parts))
        px = ",".join(map(str, self.act_parts))
        return f"P_W=({pw}) P_X=({px}) -> {self.partial_products}x {self.physical} MMA [{self.family}]"


def shifts(parts: tuple[int, ...]) -> tuple[int, ...]:
    """shift(i) = sum of the widths before part i (equation 3)."""
    out, s = [], 0
    for q in parts:
        out.append(s)
        s += q
    return tuple(out)
