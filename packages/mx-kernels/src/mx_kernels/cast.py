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
"""

from __future__ import annotations

import functools

import torch

import mx_core
from mx_core import ElementFormat, get_format, get_scale_mode
from mx_kernels.backend import (
    BACKENDS,
    TRITON_BLOCK_SIZES,
    log_choice,
    resolve_backend_for,
)
from mx_kernels.cast_launch import _empty_both, _empty_cast, _empty_cast_t, _launch
from mx_kernels.library import define_op, may_skip_dispatch

__all__ = ["quantize_rowwise", "quantize_colwise", "quantize_both"]


def _choose(
    op: str, backend: str, x: torch.Tensor, fmt: ElementFormat, block_size: int, dims: tuple
) -> str:
    """The implementation an op body runs, after the checks of the tensor's shape: the
    op bodies always see real tensors (local shards under DTensor, run-time tensors
    under torch.compile), so these checks live here, not in the public functions."""
    shape = x.shape
    # The common case in a few comparisons (this is every cast's hot path); anything
    # else gets the full checks, which raise with the argument named.
    rank_ok = len(shape) >= 1 if dims == (-1,) else len(shape) == 2
    fine = (
        rank_ok
        and x.dtype in mx_core.INPUT_DTYPES
        and block_size > 0
        and not block_size % 2
        and all(shape[d] % block_size == 0 for d in dims)
    )
    if not fine:
        if dims != (-1,) and x.dim() != 2:
            raise ValueError(f"{op}: x must be 2-D [M, K], got shape {tuple(x.shape)}")
        for dim in dims:
            mx_core.check_quantize_args(x, block_size, dim, fn=op)
    gap = None
    if block_size not in TRITON_BLOCK_SIZES:
        gap = f"block_size={block_size} has no Triton cast (Triton: {TRITON_BLOCK_SIZES})"
    return resolve_backend_for(op, backend, x.device, gap)


def _reference(x, fmt, block_size, scale_mode):
    t = mx_core.quantize(x, fmt, block_size=block_size, dim=-1, scale_mode=scale_mode)
    return t.qdata, t.scale


def _reference_t(x, fmt, block_size, scale_mode):
    """mx-core's columnwise cast of x [M, K], in the layout of :func:`_empty_cast_t`."""
    qdata_t, scale_t = _reference(x.t().contiguous(), fmt, block_size, scale_mode)
    return qdata_t, scale_t.t().contiguous()


def _quantize_rowwise_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    f = get_format(fmt)
    if _choose("quantize_rowwise", backend, x, f, block_size, (-1,)) == "reference":
        return _reference(x, f, block_size, scale_mode)
    qdata, scale = _empty_cast(x.shape, f, block_size, x.device)
    x2d = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    _launch(x2d, f, block_size, scale_mode, qdata, scale, None, None)
    return qdata, scale


def _quantize_colwise_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    f = get_format(fmt)
    if _choose("quantize_colwise", backend, x, f, block_size, (0,)) == "reference":
        return _reference_t(x, f, block_size, scale_mode)
    q_t, s_t = _empty_cast_t(x.shape, f, block_size, x.device)
    _launch(x, f, block_size, scale_mode, None, None, q_t, s_t)
    return q_t, s_t


def _quantize_both_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    f = get_format(fmt)
    if _choose("quantize_both", backend, x, f, block_size, (-1, 0)) == "reference":
        q_row, s_row = _reference(x, f, block_size, scale_mode)
        return q_row, s_row.t().contiguous(), *_reference_t(x, f, block_size, scale_mode)
    if f.is_packed and x.stride(1) != 1:
        # On the H200 (triton 3.6) the fused cast wrote wrong columnwise scales and codes
        # for fp4 from an fp32 x strided along K (x.t() of a contiguous tensor), while
        # from a contiguous x it was exact (BENCHMARKS.md, 2026-12-03 'Casts: word
        # stores'; reproducer: tools/bench/repro_both_fp4.py). Until that is understood,
        # it reads a copy.
        log_choice("quantize_both", "triton", x.device.type, "fp4, x strided along K: copy")
        x = x.contiguous()
    q_row, s_row_buf, q_col, s_col = _empty_both(x.shape, f, block_size, x.device)
    _launch(x, f, block_size, scale_mode, q_row, s_row_buf.t(), q_col, s_col)
    return q_row, s_row_buf, q_col, s_col


_CAST_ARGS = "(Tensor x, str fmt, SymInt block_size, str scale_mode, str backend)"
QUANTIZE_ROWWISE = define_op(
    f"quantize_rowwise{_CAST_ARGS} -> (Tensor, Tensor)",
    _quantize_rowwise_impl,
    lambda x, fmt, block_size, scale_mode, backend: _empty_cast(
        x.shape, get_format(fmt), block_size, x.device
    ),
)
QUANTIZE_COLWISE = define_op(
    f"quantize_colwise{_CAST_ARGS} -> (Tensor, Tensor)",
    _quantize_colwise_impl,
    lambda x, fmt, block_size, scale_mode, backend: _empty_cast_t(
        x.shape, get_format(fmt), block_size, x.device
    ),
)
QUANTIZE_BOTH = define_op(
    f"quantize_both{_CAST_ARGS} -> (Tensor, Tensor, Tensor, Tensor)",
    _quantize_both_impl,
    lambda x, fmt, block_size, scale_mode, backend: _empty_both(
        x.shape, get_format(fmt), block_size, x.device
    ),
)


def _check(fn: str, x, fmt, block_size, scale_mode, backend) -> tuple[str, str]:
    """Validate the public functions' arguments that the op bodies do not see as
    tensors; returns the format's and the scale mode's canonical names. The shape
    checks run in the op bodies (:func:`_choose`), on the tensors that really run."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"{fn}: block_size must be an int, got {type(block_size).__name__}")
    names = _names.__wrapped__ if torch.compiler.is_compiling() else _names  # dynamo: no caches
    try:
        return names(fmt, scale_mode, backend)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{fn}: {e}") from None


@functools.lru_cache(maxsize=256)
def _names(fmt, scale_mode, backend) -> tuple[str, str]:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    return get_format(fmt).name, get_scale_mode(scale_mode).value


def quantize_rowwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MX cast with blocks along the last dim.

    Args:
        x: [..., K] fp32/bf16/fp16, K divisible by ``block_size``; any strides.
        fmt, block_size, scale_mode: as :func:`mx_core.quantize`.
        backend: ``"auto"``, ``"triton"`` or ``"reference"`` (see :mod:`mx_kernels.backend`).
    Returns:
        ``(qdata, scale)``: qdata [..., K] (fp4: [..., K // 2] uint8), scale
        [..., K // block_size] float8_e8m0fnu; both contiguous. Equal to
        ``mx_core.quantize(x, fmt, dim=-1, ...)``'s ``qdata`` and ``scale``.
    """
    name, mode = _check("quantize_rowwise", x, fmt, block_size, scale_mode, backend)
    op = _quantize_rowwise_impl if may_skip_dispatch(x) else QUANTIZE_ROWWISE
    return op(x, name, block_size, mode, backend)


def quantize_colwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MX cast of a 2-D x [M, K] with blocks along M, laid out as the cast of x^T.

    Returns:
        ``(qdata_t, scale_t)``: qdata_t [K, M] (fp4: [K, M // 2]) row-major, and scale_t
        [K, M // block_size] stored column-major: ``scale_t.t()`` is the contiguous
        [M // block_size, K] buffer (strides (1, K)). Both are equal to
        ``mx_core.quantize(x.t().contiguous(), fmt, dim=-1, ...)``'s ``qdata`` and
        ``scale``, without materialising the transpose.

    Why scale_t is column-major: a tile of the cast covers few blocks along M, so
    row-major scales would be written a byte or two per row; column-major they are
    written in whole rows, which made the cast 13% faster on the H200 (BENCHMARKS.md).
    It is also the layout Transformer Engine keeps columnwise MXFP8 scales in. Call
    ``scale_t.contiguous()`` for a row-major copy.
    """
    name, mode = _check("quantize_colwise", x, fmt, block_size, scale_mode, backend)
    op = _quantize_colwise_impl if may_skip_dispatch(x) else QUANTIZE_COLWISE
    qdata_t, scale_buf = op(x, name, block_size, mode, backend)
    return qdata_t, scale_buf.t()


def quantize_both(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rowwise and columnwise casts of a 2-D x [M, K] from one read of x.

    Returns:
        ``(q_row, s_row, q_col_t, s_col_t)``: the values of :func:`quantize_rowwise` then
        :func:`quantize_colwise` of x. q_row [M, K] and q_col_t [K, M] are row-major
        (fp4: [M, K // 2] and [K, M // 2]); both scales are column-major: s_row
        [M, K // block_size] with strides (1, M), s_col_t [K, M // block_size] with
        strides (1, K).

    Why s_row is column-major here (not in :func:`quantize_rowwise`): a tile of this
    cast covers many rows and few blocks along K, so column-major scales go out as
    contiguous runs per block column instead of a byte or a few in each row; that made
    the cast 6-8% faster on the H200 (BENCHMARKS.md). ``dequantize_rowwise`` and
    ``scaled_mm`` take either layout; call ``s_row.contiguous()`` for a row-major copy.
    """
    name, mode = _check("quantize_both", x, fmt, block_size, scale_mode, backend)
    op = _quantize_both_impl if may_skip_dispatch(x) else QUANTIZE_BOTH
    q_row, s_row_buf, q_col_t, s_col_buf = op(x, name, block_size, mode, backend)
    return q_row, s_row_buf.t(), q_col_t, s_col_buf.t()
