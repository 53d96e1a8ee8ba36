"""Picks the kernel for each quantized linear call (ADAngel's strategy dispatcher).

`run_linear` is the single hook `QuantLinear` calls. On CPU it runs the torch reference; on
GPU the active `Dispatcher` looks the call's (mode, N, K, M) up in its policy map.
"""

from gearshift.dispatch.dispatcher import Dispatcher, get_dispatcher, run_linear, set_dispatcher  # noqa: F401
