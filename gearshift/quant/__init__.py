"""Weight formats and activation quantizers (the bottom layer: imports only torch)."""

from gearshift.quant.base import WeightFormat, DenseWeight  # noqa: F401
from gearshift.quant.int4 import Int4Weight, quantize_int4, quantize_int4_progressive  # noqa: F401
from gearshift.quant.int8 import Int8Weight, quantize_int8  # noqa: F401
from gearshift.quant import act_quantizers  # noqa: F401,E402  (registers the calibrated activation quantizers)
from gearshift.quant.rowwise import RowwiseWeight, quantize_rowwise  # noqa: F401,E402
