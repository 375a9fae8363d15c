"""mx-kernels: MX casts, dequantize, fake quantize, scale swizzle and scaled matmul.

All but the swizzle (plain torch) are ``torch.library`` ops in the ``mx::`` namespace.
Triton kernels on CUDA (and on CPU under ``TRITON_INTERPRET=1``), mx-core's reference
elsewhere; the choice is logged once per op on the ``mx_kernels`` logger.

Three layers; a module imports only its own layer and those below (checked by the
repository's tests/test_import_cycles.py)::

    ops       cast  fake_quant  inline_casts  dequant  matmul  swizzle
              (cast_plan: the casts' plans; matmul_args: scaled_mm's checks; testing)
                |  the mx:: ops, their checks, backend choice and reference paths
    kernels   cast_triton  dequant_triton  matmul_triton  (Triton kernels + launchers)
              cast_launch (the cast kernel's tiles and launch arguments)
              bf16_mm (the bf16 GEMM of the dequant_bf16 design)
                |
    runtime   settings (environment switches)  backend (choice, logging)
              launch (cached kernel launches)  library (op registration)

Importing the package registers the ops and nothing else: no GPU query, no environment
read, no triton import (the kernel modules are imported on first use).
"""

from mx_kernels.backend import BACKENDS
from mx_kernels.cast import quantize_both, quantize_colwise, quantize_rowwise
from mx_kernels.dequant import dequantize_rowwise
from mx_kernels.fake_quant import (
    fake_quantize_both,
    fake_quantize_colwise,
    fake_quantize_rowwise,
    fake_quantize_rowwise_quantize_colwise,
)
from mx_kernels.matmul import bf16_gemm, bf16_gemm_design, scaled_mm, scaled_mm_backend
from mx_kernels.norm_cast import rms_norm_backward, rms_norm_quantize, rms_norm_reference
from mx_kernels.swiglu_cast import swiglu_backward, swiglu_quantize, swiglu_reference
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
    "fake_quantize_rowwise_quantize_colwise",
    "quantize_both",
    "quantize_colwise",
    "quantize_rowwise",
    "rms_norm_backward",
    "rms_norm_quantize",
    "rms_norm_reference",
    "scaled_mm",
    "scaled_mm_backend",
    "swiglu_backward",
    "swiglu_quantize",
    "swiglu_reference",
    "swizzle_scales",
    "swizzled_shape",
    "unswizzle_scales",
]
