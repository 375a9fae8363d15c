"""MXLinear's casts of its operands: the config's cast arguments, X's casts shared by the
layers that read X within one call of their parent (q/k/v, gate/up:
:mod:`mx_nn.casts.scopes`) or handed over by an MX gather (:mod:`mx_nn.casts.gathered`),
the weight's kept across the micro-batches of one step inside
``mx_nn.keep_weight_casts()``, and rows padded to whole MX blocks where a cast runs
along M.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

import mx_kernels
from mx_nn.casts.compute_path import cast_kwargs
from mx_nn.casts.scopes import cast_shared, cast_weight_kept, peek_cast
from mx_nn.config import MXLinearConfig

__all__ = [
    "as_rows", "cast_input", "cast_weight", "colwise_values", "config_cast",
    "fake_quantized_input", "mx_input", "pad_rows",
]  # fmt: skip


def _layout(scale_layout: str) -> dict:
    # passed only where blocked: the plain casts keep their keys (shared and kept casts)
    return {} if scale_layout == "plain" else {"scale_layout": scale_layout}


def config_cast(
    fn,
    x: torch.Tensor,
    fmt: str,
    c: MXLinearConfig,
    inline: bool = False,
    scale_layout: str = "plain",
):
    """``fn`` (an mx_kernels cast or fake-quantize) with the config's block, mode, backend.

    Args:
        fn: e.g. ``mx_kernels.quantize_both`` or ``mx_kernels.fake_quantize_rowwise``.
        x: the tensor to cast, as ``fn`` takes it.
        fmt: the element format name.
        c: the layer's config.
        inline: a fake-quantize's inline overload, which torch.compile launches from its
            generated code, for a tensor no other layer casts (``mx_kernels.inline_casts``).
        scale_layout: a quantize's scale layout, ``"plain"`` or ``"blocked"`` (cuBLAS's,
            flat; :func:`mx_nn.casts.compute_path.blocked_scales`).

    Returns:
        What ``fn`` returns.
    """
    if inline:
        return fn(x, fmt, inline=True, **cast_kwargs(c))
    return fn(x, fmt, **cast_kwargs(c), **_layout(scale_layout))


def cast_weight(
    fn,
    weight: torch.Tensor,
    fmt: str,
    c: MXLinearConfig,
    inline: bool = False,
    scale_layout: str = "plain",
):
    """:func:`config_cast` of the weight, kept while it is unchanged inside
    ``mx_nn.keep_weight_casts()`` (:func:`mx_nn.casts.scopes.cast_weight_kept`).

    Arguments as :func:`config_cast`, with ``weight`` [N, K] for ``x``.

    Returns:
        What ``fn`` returns.
    """
    if inline:
        return cast_weight_kept(fn, weight, fmt, inline=True, **cast_kwargs(c))
    return cast_weight_kept(fn, weight, fmt, **cast_kwargs(c), **_layout(scale_layout))


def cast_input(fn, x: torch.Tensor, fmt: str, c: MXLinearConfig, scale_layout: str = "plain"):
    """:func:`config_cast` of the layer's input, shared with the other layers that read the
    same tensor (q/k/v, gate/up; :mod:`mx_nn.casts.scopes`).

    Arguments as :func:`config_cast` (never inline: the cast is shared).

    Returns:
        What ``fn`` returns (the shared result where another layer made it).
    """
    return cast_shared(fn.__name__, fn, x, fmt, **cast_kwargs(c), **_layout(scale_layout))


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] with its leading dims folded.

    Args:
        x: [..., K], rank >= 1.

    Returns:
        [M, K]: ``x`` itself where 2-D, else a view where the strides allow (as
        ``reshape``).
    """
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """x [M, K] with zero rows appended up to a multiple of ``multiple``.

    Args:
        x: [M, K], a tensor or a DTensor whose M is not sharded.
        multiple: the row count to pad to a multiple of (the block size).

    Returns:
        ``x`` itself where M is a multiple already, else [ceil(M / multiple) * multiple,
        K] (a DTensor padded on each rank for a DTensor).

    Raises:
        ValueError: a DTensor sharded along M.
    """
    extra = -x.shape[0] % multiple
    if not extra:
        return x
    if not isinstance(x, DTensor):
        return F.pad(x, (0, 0, 0, extra))
    # M is not sharded here: a sharded M holds whole blocks or MXLinear refused it
    # (mx_nn.dtensor.placements), so it needs no padding. Each rank pads its own rows.
    if any(getattr(p, "dim", None) == 0 for p in x.placements):
        raise ValueError(f"MXLinear: rows sharded as {x.placements} cannot be padded locally")
    m, k = x.shape
    local = F.pad(x.to_local(), (0, 0, 0, extra))
    return DTensor.from_local(
        local, x.device_mesh, x.placements, run_check=False, shape=(m + extra, k), stride=(k, 1)
    )


def mx_input(
    x2: torch.Tensor, c: MXLinearConfig, colwise: bool, scale_layout: str = "plain"
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    """X [M, K] cast along K (codes, scales), and what backward keeps for dW: where
    ``colwise`` (the MX dW GEMM will run), X's columnwise cast (codes, scales; about
    half of X's bytes in bf16), made from the same read (``quantize_both``, shared by
    the layers reading X) or, where an MX gather handed the rowwise cast over, alone
    (``quantize_colwise``, shared too); else X itself. Casting in forward also means the
    compiler never recomputes X for the cast in backward: Inductor's recompute of an
    RMSNorm output in backward was seen to differ from the forward's in the last bit.

    Args:
        x2: X [M, K].
        c: the layer's config.
        colwise: whether backward computes the MX dW (needs X cast along M).
        scale_layout: of the casts made here, ``"plain"`` or ``"blocked"`` (cuBLAS's,
            flat); a rowwise cast an MX gather handed over keeps its plain scales.

    Returns:
        ``((codes [M, K], scales [M, K // bs]), saved)``: ``saved`` is X's columnwise
        cast ``(codes, scales)`` (M padded to whole blocks) where ``colwise``, else
        ``(x2,)``. Blocked scales are flat; the rowwise ones then cover M padded to
        whole blocks, which pads to the same multiple of 128 rows as M.
    """
    rowwise, fmt = mx_kernels.quantize_rowwise, c.input_fmt
    if not colwise:
        return cast_input(rowwise, x2, fmt, c, scale_layout), (x2,)
    handed = peek_cast(rowwise.__name__, rowwise, x2, fmt, **cast_kwargs(c))
    x_pad = pad_rows(x2, c.block_size)  # colwise blocks run along M
    if handed is not None:
        cols = cast_input(mx_kernels.quantize_colwise, x_pad, fmt, c, scale_layout)
        return handed, tuple(cols)
    x_q, x_s, xt_q, xt_s = cast_input(mx_kernels.quantize_both, x_pad, fmt, c, scale_layout)
    m = x2.shape[0]
    return (x_q[:m], x_s if x_s.dim() == 1 else x_s[:m]), (xt_q, xt_s)


def fake_quantized_input(
    x2: torch.Tensor, c: MXLinearConfig, colwise: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """X [M, K] fake-quantized along K, and what backward keeps for dW where ``colwise``
    (the MX dW GEMM will run): X's columnwise cast, instead of X.

    With ``c.save_mx_activations`` that cast is kept as MX codes and scales
    (about half of X's bf16 bytes), which backward decodes to the same values
    (:func:`colwise_values`); the rowwise values come from the same read of X
    (``fake_quantize_rowwise_quantize_colwise``). Without it both come from one read of X
    (``fake_quantize_both``) and the columnwise values are kept in X's dtype: one
    launch fewer per step (BENCHMARKS.md, 2026-12-05 'TP layer: where the step goes')
    and as much memory as saving X. Each cast is shared by the layers reading X; where
    an MX gather handed the rowwise cast over, only the columnwise one is made.

    Args:
        x2: X [M, K].
        c: the layer's config.
        colwise: whether backward computes the MX dW.

    Returns:
        ``(rowwise [M, K] in X's dtype, saved)``: ``saved`` is ``(codes [K, M_pad],
        scales [K, M_pad // bs])`` (MX), ``(values [M_pad, K],)`` (X's dtype) or ``()``
        where not ``colwise``; ``M_pad`` is M padded to whole blocks.
    """
    rowwise, fmt = mx_kernels.fake_quantize_rowwise, c.input_fmt
    if not colwise:
        return cast_input(rowwise, x2, fmt, c), ()
    handed = peek_cast(rowwise.__name__, rowwise, x2, fmt, **cast_kwargs(c))
    x_pad = pad_rows(x2, c.block_size)  # colwise blocks run along M
    if c.save_mx_activations:
        if handed is not None:
            return handed, tuple(cast_input(mx_kernels.quantize_colwise, x_pad, fmt, c))
        both = mx_kernels.fake_quantize_rowwise_quantize_colwise  # one read of X
        row, q_t, s_t = cast_input(both, x_pad, fmt, c)
        return (row if x_pad is x2 else row[: x2.shape[0]]), (q_t, s_t)
    if handed is not None:
        return handed, (cast_input(mx_kernels.fake_quantize_colwise, x_pad, fmt, c),)
    row, col = cast_input(mx_kernels.fake_quantize_both, x_pad, fmt, c)
    return (row if x_pad is x2 else row[: x2.shape[0]]), (col,)


def colwise_values(saved: tuple[torch.Tensor, ...], c: MXLinearConfig, dtype: torch.dtype):
    """The dW GEMM's right operand from what :func:`fake_quantized_input` kept: X's
    columnwise fake-quantized values [M_pad, K] (a transposed view where decoded from
    MX codes: ``fake_quantize_colwise`` is the decode of ``quantize_colwise``, bit for
    bit).

    Args:
        saved: ``fake_quantized_input``'s second result (not empty).
        c: the layer's config.
        dtype: X's dtype.

    Returns:
        [M_pad, K] in ``dtype``.
    """
    if len(saved) == 1:
        return saved[0]
    q_t, s_t = saved
    kw = cast_kwargs(c)
    values_t = mx_kernels.dequantize_rowwise(
        q_t, s_t, c.input_fmt, block_size=kw["block_size"], out_dtype=dtype,
        backend=kw["backend"],
    )  # fmt: skip
    return values_t.t()
