"""gearshift: one set of quantized weights served at many precisions.

QSPEC (draft with low-precision activations, verify with W4A16), ADAngel (policy-mapped
mixed-precision GEMM strategies) and GEARBX (entropy-routed precision gears) in one engine.
"""

__version__ = "0.1.0"

from gearshift.errors import GearshiftError  # noqa: E402,F401
