"""MX casts as ``torch.library`` ops: rowwise, columnwise, and both from one read.

=====================  ===============================  ==========================
function               op                               blocks along
=====================  ===============================  ==========================
``quantize_rowwise``   ``mx::quantize_rowwise``         the last dim, any rank
``quantize_colwise``   ``mx::quantize_colwise``         dim 0 of a 2-D x [M, K];
                                                        written as the row-major
                                                        cast of x^T: [K, M]
``quantize_both``      ``mx::quantize_both``            both of the above
=====================  ===============================  ==========================

All three are bit-identical to :func:`mx_core.quantize`. The scales of
``quantize_colwise``, and both scales of ``quantize_both``, come back column-major
(``scale.t()`` is contiguous; see :func:`quantize_colwise` and :func:`quantize_both`);
the ops themselves return those contiguous buffers, which the functions transpose.
Triton runs every format and scale mode for power-of-two block sizes up to 128 (fp6/fp4
codes are built in integer arithmetic; fp8 uses the GPU's conversion); other block sizes
run mx-core's reference on the same device (``backend="auto"`` logs that choice once;
``backend="triton"`` raises instead).

``scale_layout="blocked"`` (2-D x, block size 32) returns each scale instead as the
flat bytes of cuBLAS's blocked layout (:func:`mx_kernels.swizzle.swizzle_scales` of the
plain scale matrix, flattened; padding zero), written there by the kernel itself, so a
GEMM on sm100 needs no swizzle of its own.
"""

from __future__ import annotations

import torch

import mx_core
from mx_core import get_format
from mx_kernels.cast_launch import empty_both, empty_cast, empty_cast_t
from mx_kernels.cast_plan import (
    CAST_ARGS,
    REFERENCES,
    check_args,
    check_scale_layout,
    plan_for,
    public_layout,
)
from mx_kernels.library import define_op, may_skip_dispatch

__all__ = ["quantize_rowwise", "quantize_colwise", "quantize_both"]


def _reference(x, fmt, block_size, scale_mode):
    t = mx_core.quantize(x, fmt, block_size=block_size, dim=-1, scale_mode=scale_mode)
    return t.qdata, t.scale


def _reference_t(x, fmt, block_size, scale_mode):
    """mx-core's columnwise cast of x [M, K], in the layout of :func:`empty_cast_t`."""
    qdata_t, scale_t = _reference(x.t().contiguous(), fmt, block_size, scale_mode)
    return qdata_t, scale_t.t().contiguous()


def _reference_both(x, fmt, block_size, scale_mode):
    """Both casts, in the layout of :func:`empty_both`."""
    q_row, s_row = _reference(x, fmt, block_size, scale_mode)
    return q_row, s_row.t().contiguous(), *_reference_t(x, fmt, block_size, scale_mode)


REFERENCES.update(
    quantize_rowwise=_reference, quantize_colwise=_reference_t, quantize_both=_reference_both
)


# The quantize ops take the scales' layout last, positional with a default: a call that
# leaves it out is the plain cast, and DTensor's sharding rules see it among the args.
_ARGS = CAST_ARGS[:-1] + ', str scale_layout="plain")'


# The op bodies: checks, backend choice and launch arguments are planned once per call
# signature (mx_kernels.cast_plan).
def _quantize_rowwise_impl(
    x, fmt: str, block_size: int, scale_mode: str, backend: str, scale_layout: str = "plain"
):
    plan = plan_for(
        "quantize_rowwise", False, x, fmt, block_size, scale_mode, backend, scale_layout
    )
    return plan(x)


def _quantize_colwise_impl(
    x, fmt: str, block_size: int, scale_mode: str, backend: str, scale_layout: str = "plain"
):
    plan = plan_for(
        "quantize_colwise", False, x, fmt, block_size, scale_mode, backend, scale_layout
    )
    return plan(x)


def _quantize_both_impl(
    x, fmt: str, block_size: int, scale_mode: str, backend: str, scale_layout: str = "plain"
):
    plan = plan_for("quantize_both", False, x, fmt, block_size, scale_mode, backend, scale_layout)
    return plan(x)


def _fake(op: str, empty):
    def fake(x, fmt, block_size, scale_mode, backend, scale_layout="plain"):
        check_scale_layout(op, scale_layout, block_size, x.shape)
        return empty(x.shape, get_format(fmt), block_size, x.device, scale_layout == "blocked")

    return fake


QUANTIZE_ROWWISE = define_op(
    f"quantize_rowwise{_ARGS} -> (Tensor, Tensor)",
    _quantize_rowwise_impl,
    _fake("quantize_rowwise", empty_cast),
)
QUANTIZE_COLWISE = define_op(
    f"quantize_colwise{_ARGS} -> (Tensor, Tensor)",
    _quantize_colwise_impl,
    _fake("quantize_colwise", empty_cast_t),
)
QUANTIZE_BOTH = define_op(
    f"quantize_both{_ARGS} -> (Tensor, Tensor, Tensor, Tensor)",
    _quantize_both_impl,
    _fake("quantize_both", empty_both),
)


def _public(outs, scale_layout: str):
    """A colwise or both op's outputs as the public function returns them (blocked
    scales stay flat)."""
    return outs if scale_layout == "blocked" else public_layout(outs)


def quantize_rowwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
    scale_layout: str = "plain",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MX cast with blocks along the last dim.

    Args:
        x: [..., K] fp32/bf16/fp16, K divisible by ``block_size``; any strides.
        fmt, block_size, scale_mode: as :func:`mx_core.quantize`.
        backend: ``"auto"``, ``"triton"`` or ``"reference"`` (see :mod:`mx_kernels.backend`).
        scale_layout: ``"plain"`` or ``"blocked"`` (2-D x [M, K] and block_size 32 only):
            the scale as cuBLAS's MX GEMM reads it on sm100 (see Returns).
    Returns:
        ``(qdata, scale)``: qdata [..., K] (fp4: [..., K // 2] uint8), scale
        [..., K // block_size] float8_e8m0fnu; both contiguous. Equal to
        ``mx_core.quantize(x, fmt, dim=-1, ...)``'s ``qdata`` and ``scale``. Blocked:
        scale is 1-D, ``swizzle_scales(plain_scale).flatten()`` (:mod:`mx_kernels.swizzle`):
        the [M, K // 32] matrix padded with zero bytes to [ceil128(M), ceil4(K // 32)],
        in 128x4 tiles of 512 bytes each.
    Raises:
        ValueError: scale_layout not ``"plain"`` or ``"blocked"``; blocked with a
            block_size other than 32 or an x that is not 2-D.
    """
    if may_skip_dispatch(x) and type(block_size) is int:  # plain eager: the plan, directly
        return plan_for(
            "quantize_rowwise", True, x, fmt, block_size, scale_mode, backend, scale_layout
        )(x)
    name, mode = check_args(
        "quantize_rowwise", x, fmt, block_size, scale_mode, backend, scale_layout
    )
    return QUANTIZE_ROWWISE(x, name, block_size, mode, backend, scale_layout)


def quantize_colwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
    scale_layout: str = "plain",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MX cast of a 2-D x [M, K] with blocks along M, laid out as the cast of x^T.

    Args:
        x: [M, K] fp32/bf16/fp16, M divisible by ``block_size``; any strides.
        fmt, block_size, scale_mode, backend, scale_layout: as :func:`quantize_rowwise`.
    Returns:
        ``(qdata_t, scale_t)``: qdata_t [K, M] (fp4: [K, M // 2]) row-major, and scale_t
        [K, M // block_size] stored column-major: ``scale_t.t()`` is the contiguous
        [M // block_size, K] buffer (strides (1, K)). Both are equal to
        ``mx_core.quantize(x.t().contiguous(), fmt, dim=-1, ...)``'s ``qdata`` and
        ``scale``, without materialising the transpose. With ``scale_layout="blocked"``
        (block_size 32 only) scale_t is 1-D instead: the blocked layout of the
        [K, M // 32] matrix, as :func:`quantize_rowwise` describes.

    Why scale_t is column-major: a tile of the cast covers few blocks along M, so
    row-major scales would be written a byte or two per row; column-major they are
    written in whole rows, which made the cast 13% faster on the H200 (BENCHMARKS.md).
    It is also the layout Transformer Engine keeps columnwise MXFP8 scales in. Call
    ``scale_t.contiguous()`` for a row-major copy.
    """
    if may_skip_dispatch(x) and type(block_size) is int:
        return plan_for(
            "quantize_colwise", True, x, fmt, block_size, scale_mode, backend, scale_layout
        )(x)
    name, mode = check_args(
        "quantize_colwise", x, fmt, block_size, scale_mode, backend, scale_layout
    )
    outs = QUANTIZE_COLWISE(x, name, block_size, mode, backend, scale_layout)
    return _public(outs, scale_layout)


def quantize_both(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
    scale_layout: str = "plain",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rowwise and columnwise casts of a 2-D x [M, K] from one read of x.

    Args:
        x: [M, K] fp32/bf16/fp16, M and K divisible by ``block_size``; any strides.
        fmt, block_size, scale_mode, backend, scale_layout: as :func:`quantize_rowwise`.
    Returns:
        ``(q_row, s_row, q_col_t, s_col_t)``: the values of :func:`quantize_rowwise` then
        :func:`quantize_colwise` of x. q_row [M, K] and q_col_t [K, M] are row-major
        (fp4: [M, K // 2] and [K, M // 2]); both scales are column-major: s_row
        [M, K // block_size] with strides (1, M), s_col_t [K, M // block_size] with
        strides (1, K). With ``scale_layout="blocked"`` (block_size 32 only) both scales
        are 1-D: the blocked layouts of [M, K // 32] and of [K, M // 32], as
        :func:`quantize_rowwise` describes.

    Why s_row is column-major here (not in :func:`quantize_rowwise`): a tile of this
    cast covers many rows and few blocks along K, so column-major scales go out as
    contiguous runs per block column instead of a byte or a few in each row; that made
    the cast 6-8% faster on the H200 (BENCHMARKS.md). ``dequantize_rowwise`` and
    ``scaled_mm`` take either layout; call ``s_row.contiguous()`` for a row-major copy.
    """
    if may_skip_dispatch(x) and type(block_size) is int:
        return plan_for(
            "quantize_both", True, x, fmt, block_size, scale_mode, backend, scale_layout
        )(x)
    name, mode = check_args("quantize_both", x, fmt, block_size, scale_mode, backend, scale_layout)
    outs = QUANTIZE_BOTH(x, name, block_size, mode, backend, scale_layout)
    return _public(outs, scale_layout)
