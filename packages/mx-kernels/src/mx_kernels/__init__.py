"""mx-kernels: MX casts, dequantize, scale swizzle and scaled matmul as ``torch.library`` ops.

Every op is in the ``mx::`` namespace.

Triton kernels on CUDA (and on CPU under ``TRITON_INTERPRET=1``), mx-core's reference
elsewhere; the choice is logged once per op on the ``mx_kernels`` logger.
"""

from mx_kernels.backend import BACKENDS
from mx_kernels.cast import quantize_both, quantize_colwise, quantize_rowwise
from mx_kernels.dequant import dequantize_rowwise
from mx_kernels.matmul import scaled_mm
from mx_kernels.swizzle import swizzle_scales, swizzled_shape, unswizzle_scales

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "dequantize_rowwise",
    "quantize_both",
    "quantize_colwise",
    "quantize_rowwise",
    "scaled_mm",
    "swizzle_scales",
    "swizzled_shape",
    "unswizzle_scales",
]
