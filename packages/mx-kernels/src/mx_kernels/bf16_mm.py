"""The bf16 GEMM that the ``dequant_bf16`` design of the Triton matmul runs after its
dequantize (:mod:`mx_kernels.matmul_triton`), and that MX linear layers run on their
fake-quantized operands (mx-nn): cuBLAS on CUDA, an fp32 matmul elsewhere.

Plain torch, no Triton: the op surface (:mod:`mx_kernels.matmul`) re-exports it, and
importing it must not import triton.
"""

from __future__ import annotations

import torch

__all__ = ["bf16_gemm"]


def bf16_gemm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b`` as the ``dequant_bf16`` design multiplies: operands in bf16 (exact for
    MX-valued inputs), fp32 accumulation, one rounding to ``out_dtype``; cuBLAS on CUDA,
    an fp32 matmul elsewhere.

    Args:
        a: [M, K], any float dtype and strides (cast to bf16 first where it is not).
        b: [K, N], likewise.
        out_dtype: the result's dtype.

    Returns:
        [M, N] in ``out_dtype``.
    """
    # torch.mm, not ``@``: torch.matmul's dispatch in front of the same GEMM took 81
    # against 18 us of host time per call for bf16 on CPU (torch 2.13), and the layers
    # call this three times a step (BENCHMARKS.md, 2026-12-05 'TP layer: where the step
    # goes').
    bf16 = torch.bfloat16
    if a.dtype != bf16:
        a = a.to(bf16)
    if b.dtype != bf16:
        b = b.to(bf16)
    if not a.is_cuda:
        return torch.mm(a.float(), b.float()).to(out_dtype)  # bf16 values are exact in fp32
    if out_dtype == bf16:
        return torch.mm(a, b)
    return torch.mm(a, b, out_dtype=torch.float32).to(out_dtype)
