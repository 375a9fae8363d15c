"""MX fake quantization as ``torch.library`` ops: the values a tensor takes in MX, in its
own dtype, from one read.

``fake_quantize_rowwise(x)`` equals ``mx_core.quantize(x, dim=-1).dequantize(x.dtype)``;
``fake_quantize_colwise(x)`` blocks along dim 0 of a 2-D x and keeps x's [M, K] layout
(nothing is transposed: a bf16 GEMM takes either orientation); ``fake_quantize_both``
returns both from one read. This is the sm90 path of an MX linear layer: where the MX
GEMM is a bf16 GEMM on dequantized operands (``scaled_mm`` design ``dequant_bf16``), the
cast and the dequantize fuse into one pass that writes bf16 instead of codes, scales and
then bf16 again. Same kernel, block sizes and backend rules as :mod:`mx_kernels.cast`.
"""

from __future__ import annotations

import torch

import mx_core
from mx_core import get_format
from mx_kernels.cast import _CAST_ARGS, _check, _choose, _launch
from mx_kernels.library import define_op, may_skip_dispatch

__all__ = ["fake_quantize_both", "fake_quantize_colwise", "fake_quantize_rowwise"]


def _reference(x: torch.Tensor, fmt: str, block_size: int, scale_mode: str, dim: int):
    t = mx_core.quantize(x, fmt, block_size=block_size, dim=dim, scale_mode=scale_mode)
    return t.dequantize(x.dtype)


def _triton(x2d, fmt: str, block_size: int, scale_mode: str, rowwise: bool, colwise: bool):
    """Fake-quantized [M, K] outputs of the Triton kernel, None where not asked for."""
    row = torch.empty(x2d.shape, dtype=x2d.dtype, device=x2d.device) if rowwise else None
    col = torch.empty(x2d.shape, dtype=x2d.dtype, device=x2d.device) if colwise else None
    _launch(x2d, get_format(fmt), block_size, scale_mode, row, None, col, None, dequantized=True)
    return row, col


def _fake_quantize_rowwise_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    f = get_format(fmt)
    if _choose("fake_quantize_rowwise", backend, x, f, block_size, (-1,)) == "reference":
        return _reference(x, fmt, block_size, scale_mode, -1).contiguous()
    if x.dim() == 2:
        return _triton(x, fmt, block_size, scale_mode, True, False)[0]
    row, _ = _triton(x.reshape(-1, x.shape[-1]), fmt, block_size, scale_mode, True, False)
    return row.view(x.shape)


def _fake_quantize_colwise_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    f = get_format(fmt)
    if _choose("fake_quantize_colwise", backend, x, f, block_size, (0,)) == "reference":
        return _reference(x, fmt, block_size, scale_mode, 0).contiguous()
    return _triton(x, fmt, block_size, scale_mode, False, True)[1]


def _fake_quantize_both_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    f = get_format(fmt)
    if _choose("fake_quantize_both", backend, x, f, block_size, (-1, 0)) == "reference":
        return (
            _reference(x, fmt, block_size, scale_mode, -1).contiguous(),
            _reference(x, fmt, block_size, scale_mode, 0).contiguous(),
        )
    return _triton(x, fmt, block_size, scale_mode, True, True)


def _like(x, fmt, block_size, scale_mode, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


FAKE_QUANTIZE_ROWWISE = define_op(
    f"fake_quantize_rowwise{_CAST_ARGS} -> Tensor", _fake_quantize_rowwise_impl, _like
)
FAKE_QUANTIZE_COLWISE = define_op(
    f"fake_quantize_colwise{_CAST_ARGS} -> Tensor", _fake_quantize_colwise_impl, _like
)
FAKE_QUANTIZE_BOTH = define_op(
    f"fake_quantize_both{_CAST_ARGS} -> (Tensor, Tensor)",
    _fake_quantize_both_impl,
    lambda *args: (_like(*args), _like(*args)),
)


def fake_quantize_rowwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> torch.Tensor:
    """x's values after an MX cast with blocks along the last dim, in x's dtype.

    Args:
        x: [..., K] fp32/bf16/fp16, K divisible by ``block_size``; any strides.
        fmt, block_size, scale_mode: as :func:`mx_core.quantize`.
        backend: ``"auto"``, ``"triton"`` or ``"reference"`` (see :mod:`mx_kernels.backend`).
    Returns:
        [..., K] contiguous, x's dtype; equal to
        ``mx_core.quantize(x, fmt, dim=-1, ...).dequantize(x.dtype)``.
    """
    name, mode = _check("fake_quantize_rowwise", x, fmt, block_size, scale_mode, backend)
    op = _fake_quantize_rowwise_impl if may_skip_dispatch(x) else FAKE_QUANTIZE_ROWWISE
    return op(x, name, block_size, mode, backend)


def fake_quantize_colwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> torch.Tensor:
    """x [M, K]'s values after an MX cast with blocks along M, in x's dtype and layout.

    Returns:
        [M, K] contiguous; equal to ``mx_core.quantize(x, fmt, dim=0, ...).dequantize(x.dtype)``.
    """
    name, mode = _check("fake_quantize_colwise", x, fmt, block_size, scale_mode, backend)
    op = _fake_quantize_colwise_impl if may_skip_dispatch(x) else FAKE_QUANTIZE_COLWISE
    return op(x, name, block_size, mode, backend)


def fake_quantize_both(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fake_quantize_rowwise` and :func:`fake_quantize_colwise` of a 2-D x [M, K]
    from one read of x. Returns ``(rowwise [M, K], colwise [M, K])``."""
    name, mode = _check("fake_quantize_both", x, fmt, block_size, scale_mode, backend)
    op = _fake_quantize_both_impl if may_skip_dispatch(x) else FAKE_QUANTIZE_BOTH
    return op(x, name, block_size, mode, backend)
