"""mx-core: OCP Microscaling (MX) element formats, E8M0 scale math, reference casts.

Everything here is pure PyTorch and runs on any device. ``mx_core.quantize`` is the
bit-exact reference that the kernels in mx-kernels are tested against.
"""

from mx_core.cast_settings import CastSettings
from mx_core.choices import CastBackend, ComputePath, ElementFormatName, MatmulBackend
from mx_core.formats import FORMAT_NAMES, ElementFormat, get_format
from mx_core.packing import as_float4_x2, pack_fp4, pack_fp6, unpack_fp4, unpack_fp6
from mx_core.quantize import INPUT_DTYPES, check_quantize_args, dequantize, quantize
from mx_core.scale import (
    E8M0_BIAS,
    E8M0_NAN,
    ScaleMode,
    e8m0_to_exponent,
    e8m0_to_float,
    exponent_to_e8m0,
    get_scale_mode,
    scale_exponent,
    top_exponent,
)
from mx_core.tensor import DEQUANTIZE_DTYPES, MXTensor

__version__ = "0.1.0"

__all__ = [
    "DEQUANTIZE_DTYPES",
    "E8M0_BIAS",
    "E8M0_NAN",
    "FORMAT_NAMES",
    "INPUT_DTYPES",
    "CastBackend",
    "CastSettings",
    "ComputePath",
    "ElementFormat",
    "ElementFormatName",
    "MXTensor",
    "MatmulBackend",
    "ScaleMode",
    "as_float4_x2",
    "check_quantize_args",
    "dequantize",
    "e8m0_to_exponent",
    "e8m0_to_float",
    "exponent_to_e8m0",
    "get_format",
    "get_scale_mode",
    "pack_fp4",
    "pack_fp6",
    "quantize",
    "scale_exponent",
    "top_exponent",
    "unpack_fp4",
    "unpack_fp6",
]
