"""Weight formats and activation quantizers (the bottom layer: imports only torch)."""

from gearshift.quant.base import WeightFormat, DenseWeight  # noqa: F401
from gearshift.quant.int4 import Int4Weight, quantize_int4  # noqa: F401
from gearshift.quant.int8 import Int8Weight, quantize_int8  # noqa: F401
