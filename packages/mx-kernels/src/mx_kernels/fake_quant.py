"""MX fake quantization as ``torch.library`` ops: the values a tensor takes in MX, in its
own dtype, from one read.

``fake_quantize_rowwise(x)`` equals ``mx_core.quantize(x, dim=-1).dequantize(x.dtype)``;
``fake_quantize_colwise(x)`` blocks along dim 0 of a 2-D x and keeps x's [M, K] layout
(nothing is transposed: a bf16 GEMM takes either orientation); ``fake_quantize_both``
returns both from one read, and ``fake_quantize_rowwise_quantize_colwise`` the rowwise
values with the columnwise MX codes and scales (what a layer keeps of its input for the
weight gradient when it saves MX activations), from one read too. This is the sm90
path of an MX linear layer: where the MX GEMM is a bf16 GEMM on dequantized operands
(``scaled_mm`` design ``dequant_bf16``), the cast and the dequantize fuse into one pass
that writes bf16 instead of codes, scales and then bf16 again. Same kernel, block sizes
and backend rules as :mod:`mx_kernels.cast`.

Each op but ``fake_quantize_rowwise_quantize_colwise`` has an ``inline`` overload too
(the public functions' ``inline=True``), the same cast, which torch.compile launches
from its generated code (:mod:`mx_kernels.inline_casts`).
"""

from __future__ import annotations

import torch

import mx_core
from mx_core import get_format
from mx_kernels.cast_launch import empty_cast_t
from mx_kernels.cast_plan import CAST_ARGS, REFERENCES, check_args, plan_for, public_layout
from mx_kernels.inline_casts import register_inline
from mx_kernels.library import define_op, may_skip_dispatch

__all__ = [
    "fake_quantize_both",
    "fake_quantize_colwise",
    "fake_quantize_rowwise",
    "fake_quantize_rowwise_quantize_colwise",
]


def _reference(x: torch.Tensor, fmt, block_size: int, scale_mode: str, dim: int):
    t = mx_core.quantize(x, fmt, block_size=block_size, dim=dim, scale_mode=scale_mode)
    return t.dequantize(x.dtype).contiguous()


REFERENCES.update(
    fake_quantize_rowwise=lambda x, *args: _reference(x, *args, -1),
    fake_quantize_colwise=lambda x, *args: _reference(x, *args, 0),
    fake_quantize_both=lambda x, *args: (_reference(x, *args, -1), _reference(x, *args, 0)),
    # quantize_colwise's reference is mx_kernels.cast's (registered there, looked up here
    # at call time: cast imports after this module in some orders)
    fake_quantize_rowwise_quantize_colwise=lambda x, *args: (
        _reference(x, *args, -1),
        *REFERENCES["quantize_colwise"](x, *args),
    ),
)


# The op bodies, planned once per call signature (mx_kernels.cast_plan).
def _fake_quantize_rowwise_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    return plan_for("fake_quantize_rowwise", False, x, fmt, block_size, scale_mode, backend)(x)


def _fake_quantize_colwise_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    return plan_for("fake_quantize_colwise", False, x, fmt, block_size, scale_mode, backend)(x)


def _fake_quantize_both_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    return plan_for("fake_quantize_both", False, x, fmt, block_size, scale_mode, backend)(x)


def _fake_quantize_rowwise_quantize_colwise_impl(
    x, fmt: str, block_size: int, scale_mode: str, backend: str
):
    op = "fake_quantize_rowwise_quantize_colwise"
    return plan_for(op, False, x, fmt, block_size, scale_mode, backend)(x)


def _like(x, fmt, block_size, scale_mode, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _like_both(*args):
    return _like(*args), _like(*args)


FAKE_QUANTIZE_ROWWISE = define_op(
    f"fake_quantize_rowwise{CAST_ARGS} -> Tensor", _fake_quantize_rowwise_impl, _like
)
FAKE_QUANTIZE_COLWISE = define_op(
    f"fake_quantize_colwise{CAST_ARGS} -> Tensor", _fake_quantize_colwise_impl, _like
)
FAKE_QUANTIZE_BOTH = define_op(
    f"fake_quantize_both{CAST_ARGS} -> (Tensor, Tensor)",
    _fake_quantize_both_impl,
    _like_both,
)
FAKE_QUANTIZE_ROWWISE_QUANTIZE_COLWISE = define_op(
    f"fake_quantize_rowwise_quantize_colwise{CAST_ARGS} -> (Tensor, Tensor, Tensor)",
    _fake_quantize_rowwise_quantize_colwise_impl,
    lambda x, fmt, block_size, *_: (
        _like(x, fmt, block_size, *_),
        *empty_cast_t(x.shape, get_format(fmt), block_size, x.device),
    ),
)
# Their inline overloads: the same bodies, replaced by their kernel's launch under
# torch.compile (mx_kernels.inline_casts). The op above has none: it casts the input
# that several layers share, which only a default overload lets the compiler merge.
_INLINE = {
    FAKE_QUANTIZE_ROWWISE: define_op(
        f"fake_quantize_rowwise.inline{CAST_ARGS} -> Tensor", _fake_quantize_rowwise_impl, _like
    ),
    FAKE_QUANTIZE_COLWISE: define_op(
        f"fake_quantize_colwise.inline{CAST_ARGS} -> Tensor", _fake_quantize_colwise_impl, _like
    ),
    FAKE_QUANTIZE_BOTH: define_op(
        f"fake_quantize_both.inline{CAST_ARGS} -> (Tensor, Tensor)",
        _fake_quantize_both_impl,
        _like_both,
    ),
}
for _default, _inline in _INLINE.items():
    register_inline(_inline, _default._schema.name.split("::")[1])


def _overload(default: torch._ops.OpOverload, inline: bool, fn: str) -> torch._ops.OpOverload:
    """The overload that public function ``fn`` calls, after checking ``inline``."""
    if inline is False:
        return default
    if inline is True:
        return _INLINE[default]
    raise TypeError(f"{fn}: inline must be a bool, got {inline!r}")


def fake_quantize_rowwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
    inline: bool = False,
) -> torch.Tensor:
    """x's values after an MX cast with blocks along the last dim, in x's dtype.

    Args:
        x: [..., K] fp32/bf16/fp16, K divisible by ``block_size``; any strides.
        fmt, block_size, scale_mode: as :func:`mx_core.quantize`.
        backend: ``"auto"``, ``"triton"`` or ``"reference"`` (see :mod:`mx_kernels.backend`).
        inline: under torch.compile on CUDA, let the compiler allocate the output and
            launch the kernel from its generated code instead of calling the op (less
            host time per call); two inline casts of one tensor are not merged into
            one, so leave it off for a tensor cast more than once
            (:mod:`mx_kernels.inline_casts`). The same values either way.
    Returns:
        [..., K] contiguous, x's dtype; equal to
        ``mx_core.quantize(x, fmt, dim=-1, ...).dequantize(x.dtype)``.
    Raises:
        TypeError, ValueError: bad arguments (the message names the argument).
    """
    op = _overload(FAKE_QUANTIZE_ROWWISE, inline, "fake_quantize_rowwise")
    if may_skip_dispatch(x) and type(block_size) is int:  # plain eager: the plan, directly
        return plan_for("fake_quantize_rowwise", True, x, fmt, block_size, scale_mode, backend)(x)
    name, mode = check_args("fake_quantize_rowwise", x, fmt, block_size, scale_mode, backend)
    return op(x, name, block_size, mode, backend)


def fake_quantize_colwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
    inline: bool = False,
) -> torch.Tensor:
    """x [M, K]'s values after an MX cast with blocks along M, in x's dtype and layout.

    Arguments as :func:`fake_quantize_rowwise`, with x 2-D and M divisible by
    ``block_size``.

    Returns:
        [M, K] contiguous; equal to ``mx_core.quantize(x, fmt, dim=0, ...).dequantize(x.dtype)``.
    Raises:
        TypeError, ValueError: bad arguments (the message names the argument).
    """
    op = _overload(FAKE_QUANTIZE_COLWISE, inline, "fake_quantize_colwise")
    if may_skip_dispatch(x) and type(block_size) is int:  # plain eager: the plan, directly
        return plan_for("fake_quantize_colwise", True, x, fmt, block_size, scale_mode, backend)(x)
    name, mode = check_args("fake_quantize_colwise", x, fmt, block_size, scale_mode, backend)
    return op(x, name, block_size, mode, backend)


def fake_quantize_both(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
    inline: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fake_quantize_rowwise` and :func:`fake_quantize_colwise` of a 2-D x [M, K]
    from one read of x.

    Arguments as :func:`fake_quantize_rowwise`, with x 2-D and M and K divisible by
    ``block_size``.

    Returns:
        ``(rowwise, colwise)``, both [M, K] contiguous in x's dtype.
    Raises:
        TypeError, ValueError: bad arguments (the message names the argument).
    """
    op = _overload(FAKE_QUANTIZE_BOTH, inline, "fake_quantize_both")
    if may_skip_dispatch(x) and type(block_size) is int:  # plain eager: the plan, directly
        return plan_for("fake_quantize_both", True, x, fmt, block_size, scale_mode, backend)(x)
    name, mode = check_args("fake_quantize_both", x, fmt, block_size, scale_mode, backend)
    return op(x, name, block_size, mode, backend)


def fake_quantize_rowwise_quantize_colwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`fake_quantize_rowwise` and :func:`mx_kernels.quantize_colwise` of a 2-D x
    [M, K] from one read of x: the values a layer's forward GEMM takes and the MX cast
    its weight-gradient GEMM needs, kept for backward in 1 + 1/32 bytes per element.

    Arguments as :func:`fake_quantize_rowwise` (no ``inline``), with x 2-D and M and K
    divisible by ``block_size``.

    Returns:
        ``(rowwise, qdata_t, scale_t)``: rowwise [M, K] contiguous in x's dtype, equal to
        ``fake_quantize_rowwise(x)``; qdata_t [K, M] (fp4: [K, M // 2]) and scale_t
        [K, M // block_size] (column-major), equal to ``quantize_colwise(x)``'s.
    Raises:
        TypeError, ValueError: bad arguments (the message names the argument).
    """
    op = "fake_quantize_rowwise_quantize_colwise"
    if may_skip_dispatch(x) and type(block_size) is int:  # plain eager: the plan, directly
        return plan_for(op, True, x, fmt, block_size, scale_mode, backend)(x)
    name, mode = check_args(op, x, fmt, block_size, scale_mode, backend)
    return public_layout(FAKE_QUANTIZE_ROWWISE_QUANTIZE_COLWISE(x, name, block_size, mode, backend))
