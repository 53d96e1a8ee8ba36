"""What one forward of a model's linears costs in a precision mode, read from a policy map.

The profiler stores, per (mode, group, N, K) and M bucket, the winning kernel's time; summing
the model's linears gives a step cost without running anything. QSPEC uses it to say whether
speculation can pay on this GPU (DESIGN.md: "measure, don't assume"). The lm_head is left out:
it runs in the same precision for draft and verify.
"""

from __future__ import annotations

from gearshift.dispatch.policy import PolicyMap, type_key
from gearshift.dispatch.strategies import group_of, mode_key
from gearshift.quant.modes import get_mode

#: modes that run the same kernels as another one (int4 activation codes go through the int8 /
#: bf16-code paths), used when a map was profiled without them
SAME_KERNELS = {"w4a4": "w4a8"}


def linear_step_us(pm: PolicyMap, linears, mode: str, m: int) -> float | None:
    """Sum of the profiled times (us) of `linears` [(name, QuantLinear)] at M = m tokens, or None
    when the map lacks any of their shapes."""
    act = get_mode(mode).act
    total = 0.0
    for name, lin in linears:
        if name == "lm_head":
            continue
        st = lin.store
        c = pm.lookup(type_key(mode_key(st, act), group_of(st), st.out_features, st.in_features), m)
        if c is None and mode in SAME_KERNELS:
            alt = get_mode(SAME_KERNELS[mode]).act
            c = pm.lookup(type_key(mode_key(st, alt), group_of(st), st.out_features, st.in_features), m)
        if c is None or c.us is None:
            return None
        total += c.us
    return total
