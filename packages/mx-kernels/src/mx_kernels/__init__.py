"""mx-kernels: MX casts, dequantize, fake quantize, scale swizzle and scaled matmul.

All are ``torch.library`` ops in the ``mx::`` namespace.

Triton kernels on CUDA (and on CPU under ``TRITON_INTERPRET=1``), mx-core's reference
elsewhere; the choice is logged once per op on the ``mx_kernels`` logger.
"""

from mx_kernels.backend import BACKENDS
from mx_kernels.cast import quantize_both, quantize_colwise, quantize_rowwise
from mx_kernels.dequant import dequantize_rowwise
from mx_kernels.fake_quant import fake_quantize_both, fake_quantize_colwise, fake_quantize_rowwise
from mx_kernels.matmul import bf16_gemm, bf16_gemm_design, scaled_mm
from mx_kernels.swizzle import swizzle_scales, swizzled_shape, unswizzle_scales

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "bf16_gemm",
    "bf16_gemm_design",
    "dequantize_rowwise",
    "fake_quantize_both",
    "fake_quantize_colwise",
    "fake_quantize_rowwise",
    "quantize_both",
    "quantize_colwise",
    "quantize_rowwise",
    "scaled_mm",
    "swizzle_scales",
    "swizzled_shape",
    "unswizzle_scales",
]
