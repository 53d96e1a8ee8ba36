"""Picks the kernel for each quantized linear call (ADAngel's strategy dispatcher).

`run_linear` is the single hook `QuantLinear` calls. On CPU it runs the torch reference; on
GPU the active `AdaptiveDispatcher` looks the call's (mode, N, K, M) up in its policy map.
"""

from gearshift.dispatch.dispatcher import (  # noqa: F401
    AdaptiveDispatcher, Dispatcher, get_dispatcher, install_policy, run_linear, run_linear_codes, set_dispatcher)
from gearshift.dispatch.policy import M_BUCKETS, PolicyMap, load_policy_for_device  # noqa: F401
