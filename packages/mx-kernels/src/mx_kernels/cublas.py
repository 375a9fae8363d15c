"""The ``"cublas"`` backend of :func:`mx_kernels.scaled_mm`: PyTorch's cuBLAS block-scaled
(MX, BlockWise1x32) GEMM, on the devices :mod:`mx_kernels.capability` names.

Entry points, by operand format:

- MXFP8 (e4m3 x e4m3): ``torch._scaled_mm(mat_a, mat_b, scale_a, scale_b, out_dtype=)``.
- MXFP4 (fp4_e2m1 x fp4_e2m1): ``torch.nn.functional.scaled_mm(mat_a, mat_b, scale_a,
  BlockWise1x32, scale_b, BlockWise1x32, swizzle_a=SWIZZLE_32_4_4, swizzle_b=...,
  output_dtype=)``: the released ``torch._scaled_mm`` takes packed fp4 with e8m0 scales
  only under ROCm.

Operands (PyTorch's ``ScaledBlas.cpp`` and ``torch/_meta_registrations.py``): mat_a [M, K]
row-major, mat_b [K, N] column-major (fp4: [M, K // 2] and [K // 2, N] of
``float4_e2m1fn_x2``); K % 32 == 0 (so 16 divides the packed K) and N % 16 == 0; scales
1-D contiguous e8m0 of ``ceil128(rows) * ceil4(K // 32)`` elements in the blocked 32_4_4
layout (https://docs.nvidia.com/cuda/cublas/#d-block-scaling-factors-layout).

Combinations refused (:func:`cublas_unsupported_reason`), which ``"auto"`` sends to Triton
and an explicit ``backend="cublas"`` refuses, naming them: fp4 mixed with fp8, e5m2 x
e5m2 (cuBLAS has no such kernel), and, since PyTorch's MX tests cover only e4m3 x e4m3
and fp4 x fp4 with a bf16 result, e4m3 x e5m2 (the dX and dW GEMMs of
``mxfp8_e5m2_grads``) and fp16 or fp32 results: a bf16 result cast up would silently lose
precision against the emulated reference, and what cuBLAS does for the others is not
known to be right.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mx_kernels.capability import blockwise_api_gap, cublas_mx_gap, device_capability, sm_name
from mx_kernels.matmul_args import FORMATS_BY_DTYPE, SCALE_LAYOUTS
from mx_kernels.swizzle import swizzle_scales

__all__ = [
    "CUBLAS_OUT_DTYPES",
    "CublasArgs",
    "cublas_unsupported_reason",
    "prepare_cublas_args",
    "run_cublas",
    "scaled_mm_cublas",
]

CUBLAS_OUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16,)
"""Result dtypes the cuBLAS backend takes (the one PyTorch's MX GEMM tests use)."""

_FP4 = torch.float4_e2m1fn_x2
_E8 = torch.float8_e8m0fnu


@dataclass(frozen=True, kw_only=True)
class CublasArgs:
    """The operands of PyTorch's cuBLAS MX GEMM, as :func:`run_cublas` passes them.

    Raises:
        ValueError: mat_a or mat_b not 2-D, or a scale not 1-D ``float8_e8m0fnu``.
    """

    mat_a: torch.Tensor
    """[M, K] row-major (fp4: [M, K // 2] ``float4_e2m1fn_x2``)."""
    mat_b: torch.Tensor
    """[K, N] column-major: ``b_q.t()`` (fp4: [K // 2, N])."""
    scale_a: torch.Tensor
    """1-D ``float8_e8m0fnu``, :func:`swizzle_scales` of a_scale flattened."""
    scale_b: torch.Tensor
    """1-D ``float8_e8m0fnu``, :func:`swizzle_scales` of b_scale flattened."""
    out_dtype: torch.dtype = torch.bfloat16
    """The result's dtype."""

    def __post_init__(self) -> None:
        for name in ("mat_a", "mat_b"):
            t = getattr(self, name)
            if t.dim() != 2:
                raise ValueError(f"CublasArgs: {name} must be 2-D, got shape {tuple(t.shape)}")
        for name in ("scale_a", "scale_b"):
            t = getattr(self, name)
            if t.dim() != 1 or t.dtype != _E8:
                raise ValueError(
                    f"CublasArgs: {name} must be 1-D float8_e8m0fnu, got {t.dtype} of "
                    f"shape {tuple(t.shape)}"
                )

    @property
    def fp4(self) -> bool:
        """MXFP4 operands: ``torch.nn.functional.scaled_mm`` runs them."""
        return self.mat_a.dtype == _FP4

    @property
    def entry(self) -> str:
        """The PyTorch function :func:`run_cublas` calls."""
        return "torch.nn.functional.scaled_mm" if self.fp4 else "torch._scaled_mm"


def cublas_unsupported_reason(
    a_dtype: torch.dtype, b_dtype: torch.dtype, n: int, out_dtype: torch.dtype
) -> str | None:
    """Whether the cuBLAS backend takes these operands (the module doc says why each
    refusal).

    Args:
        a_dtype, b_dtype: the storage dtypes of a_q and b_q (uint8 or
            ``float4_e2m1fn_x2``: packed fp4).
        n: b_q's rows, N.
        out_dtype: the result's dtype.
    Returns:
        Why it does not, naming the combination; None where it does.
    """
    a_fmt, b_fmt = FORMATS_BY_DTYPE.get(a_dtype), FORMATS_BY_DTYPE.get(b_dtype)
    if (a_fmt == "fp4_e2m1") != (b_fmt == "fp4_e2m1"):
        return "a_q and b_q mix fp4 and fp8, which cuBLAS MX GEMMs do not take"
    if a_fmt == b_fmt == "fp8_e5m2":
        return "a_q and b_q are both float8_e5m2, which cuBLAS does not multiply"
    if a_fmt != b_fmt:
        return (
            f"a_q is {a_dtype} and b_q {b_dtype}: PyTorch tests its MX GEMM on e4m3 x e4m3 "
            "and fp4 x fp4 only"
        )
    if out_dtype not in CUBLAS_OUT_DTYPES:
        return (
            f"out_dtype={out_dtype}: PyTorch tests its MX GEMM with a bf16 result only (a "
            "bf16 result cast up would lose precision against the emulated reference)"
        )
    if n % 16:
        return f"b_q has N={n} rows; cuBLAS needs N % 16 == 0"
    return None


def _blocked(scale: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "blocked":  # already in cuBLAS's order: no copy
        return scale.reshape(-1).view(_E8)
    return swizzle_scales(scale.view(_E8)).reshape(-1)


def prepare_cublas_args(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    a_scale_layout: str = "plain",
    b_scale_layout: str = "plain",
) -> CublasArgs:
    """Host-side preparation of the cuBLAS MX GEMM (pure torch: runs on any device, the
    meta device included).

    Args:
        a_q, a_scale, b_q, b_scale: as :func:`mx_kernels.scaled_mm` takes them, checked
            (:func:`mx_kernels.matmul_args.check_scaled_mm_args`).
        out_dtype: the result's dtype.
        a_scale_layout, b_scale_layout: ``"plain"`` ([rows, K // 32], swizzled here, one
            copy) or ``"blocked"`` (contiguous, already in the blocked layout: passed on
            as a flat view).
    Returns:
        The operands :func:`run_cublas` passes to PyTorch.
    Raises:
        ValueError: cuBLAS does not take these operands (:func:`cublas_unsupported_reason`),
            or an unknown scale layout.
    """
    reason = cublas_unsupported_reason(a_q.dtype, b_q.dtype, b_q.shape[0], out_dtype)
    if reason is not None:
        raise ValueError(f"scaled_mm(backend='cublas'): {reason}")
    for name, layout in (("a_scale_layout", a_scale_layout), ("b_scale_layout", b_scale_layout)):
        if layout not in SCALE_LAYOUTS:
            raise ValueError(
                f"prepare_cublas_args: {name}={layout!r} is not one of {', '.join(SCALE_LAYOUTS)}"
            )
    mat_a, mat_b = a_q.contiguous(), b_q.contiguous()
    if FORMATS_BY_DTYPE[a_q.dtype] == "fp4_e2m1":
        mat_a, mat_b = mat_a.view(_FP4), mat_b.view(_FP4)
    return CublasArgs(
        mat_a=mat_a,
        mat_b=mat_b.t(),
        scale_a=_blocked(a_scale, a_scale_layout),
        scale_b=_blocked(b_scale, b_scale_layout),
        out_dtype=out_dtype,
    )


def run_cublas(args: CublasArgs) -> torch.Tensor:
    """PyTorch's MX GEMM on prepared operands: ``torch._scaled_mm`` for MXFP8,
    ``torch.nn.functional.scaled_mm`` for MXFP4 (on meta tensors, their meta functions).

    Args:
        args: from :func:`prepare_cublas_args`.
    Returns:
        [M, N] in ``args.out_dtype``.
    Raises:
        RuntimeError: MXFP4 and this torch has no ``torch.nn.functional.scaled_mm`` with
            BlockWise1x32 scales.
    """
    if not args.fp4:
        return torch._scaled_mm(
            args.mat_a, args.mat_b, args.scale_a, args.scale_b, out_dtype=args.out_dtype
        )
    gap = blockwise_api_gap()
    if gap is not None:
        raise RuntimeError(f"scaled_mm: the MXFP4 cuBLAS GEMM cannot run: {gap}")
    functional = torch.nn.functional
    scaling, swizzle = functional.ScalingType, functional.SwizzleType
    mx, blocked = scaling.BlockWise1x32, swizzle.SWIZZLE_32_4_4
    return functional.scaled_mm(
        args.mat_a, args.mat_b, args.scale_a, mx, args.scale_b, mx,
        swizzle_a=blocked, swizzle_b=blocked, output_dtype=args.out_dtype,
    )  # fmt: skip


def scaled_mm_cublas(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    a_scale_layout: str = "plain",
    b_scale_layout: str = "plain",
) -> torch.Tensor:
    """The "cublas" backend: :func:`run_cublas` on :func:`prepare_cublas_args`.
    Arguments as :func:`prepare_cublas_args` (``out_dtype`` positional).

    Returns:
        [M, N] in ``out_dtype``.
    Raises:
        RuntimeError: PyTorch's cuBLAS MX GEMM cannot run on this device or torch (the
            message names the capability, the API or the build feature missing).
        ValueError: as :func:`prepare_cublas_args`.
    """
    device = a_q.device
    capability = device_capability(device)
    where = sm_name(capability) if capability else f"a {device.type} tensor"
    fp4 = FORMATS_BY_DTYPE.get(a_q.dtype) == "fp4_e2m1"
    gap = cublas_mx_gap(capability, fp4=fp4, where=where)
    if gap is not None:
        raise RuntimeError(f"scaled_mm: the cuBLAS MX GEMM cannot run: {gap}")
    args = prepare_cublas_args(
        a_q, a_scale, b_q, b_scale, out_dtype=out_dtype,
        a_scale_layout=a_scale_layout, b_scale_layout=b_scale_layout,
    )  # fmt: skip
    return run_cublas(args)
