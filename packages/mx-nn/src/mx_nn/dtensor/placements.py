"""Which DTensor placements an :class:`mx_nn.MXLinear` takes, checked before it runs so
that a refusal names the layer (the ops' sharding rules would refuse the same inputs,
naming only the op).

X [..., K] (leading dims folded into M) and W [N, K], per mesh dim, as PyTorch's styles
make them: X Replicate and W Shard(0) (colwise: Y Shard(-1)), X Shard(-1) and W Shard(1)
(rowwise: Y Partial), X sharded along a leading dim and W Replicate (Y sharded alike),
both Replicate. Every sharded blocked dim must hold whole blocks on every rank: K of X
and W, N of W (its columnwise cast), and M where the columnwise casts of X and dY run
(any recipe but ``hp_weight_grad``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from mx_dtensor import local_sizes, split_block_reason
from mx_nn.config import MXLinearConfig

__all__ = ["LinearLayout", "check_placements", "linear_layout"]


def check_placements(
    layer: str, x: torch.Tensor, weight: torch.Tensor, config: MXLinearConfig
) -> None:
    """Refuse placements of ``x`` [..., K] and ``weight`` [N, K] that MXLinear cannot run
    without splitting MX blocks or reducing a Partial.

    Args:
        layer: how errors name the layer (``MXLinear.layer_name``).
        x: the input, [..., K].
        weight: the weight, [N, K].
        config: the layer's config (its block size, and whether X is cast along M).

    Raises:
        TypeError: one of them is a DTensor and the other is not.
        ValueError: a Partial operand, or a shard that splits blocks (the message names
            ``layer``, the operand, the dim, the global and local sizes and the mesh).
    """
    if not (isinstance(x, DTensor) and isinstance(weight, DTensor)):
        raise TypeError(
            f"{layer}: input is a {type(x).__name__} and weight a {type(weight).__name__}; "
            "both must be DTensors on one mesh (parallelize the module) or neither"
        )
    for name, t in (("input", x), ("weight", weight)):
        for i, p in enumerate(t.placements):
            if p.is_partial():
                raise ValueError(
                    f"{layer}: {name} is {p!r} on mesh dim {i}; MX casts need the reduced "
                    "values (the amax of a partial sum is not the amax of the sum): "
                    "redistribute it to Replicate or Shard first"
                )
    bs = config.block_size
    mesh = x.device_mesh
    # Size by size: torch 2.11's dynamo cannot trace tuple(mesh.shape) (seen on the H200:
    # "Failed to trace builtin operator tuple"), 2.13's can.
    mesh_shape = tuple(mesh.size(d) for d in range(mesh.ndim))
    operands = [
        ("input", x, x.dim() - 1, "in_features"),
        ("weight", weight, 1, "in_features"),
        ("weight", weight, 0, "out_features"),
    ]
    for name, t, dim, what in operands:
        why = split_block_reason(t.shape, t.placements, mesh_shape, dim, bs)
        if why is not None:
            raise ValueError(
                f"{layer}: {name} {what} per rank would split MX blocks of {bs}: {why} "
                f"({name} shape {tuple(t.shape)}, placements {tuple(t.placements)})"
            )
    if config.needs_colwise_input:
        _check_tokens(layer, x, bs, mesh_shape)


def _check_tokens(layer: str, x: DTensor, bs: int, mesh_shape: tuple[int, ...]) -> None:
    """M = the leading dims folded: where one of them is sharded, each rank's contiguous
    run of rows (its shard of that dim times the dims after it) must hold whole blocks,
    since the columnwise casts of X and dY block along M."""
    lead = tuple(x.shape[:-1])
    for d in range(len(lead)):
        if not any(getattr(p, "dim", None) == d for p in x.placements):
            continue
        inner = math.prod(lead[d + 1 :])
        runs = sorted({s * inner for s in local_sizes(lead[d], x.placements, mesh_shape, d)})
        if any(r % bs for r in runs):
            raise ValueError(
                f"{layer}: tokens per rank would split MX blocks of {bs} along M (the "
                f"columnwise casts of the input and its gradient): input shape "
                f"{tuple(x.shape)} with placements {tuple(x.placements)} on mesh "
                f"{mesh_shape} gives runs of {runs} rows per rank along dim {d} (global "
                f"size {lead[d]}). Give each rank a multiple of {bs} tokens (pad the "
                f"sequence to a multiple of {bs} x the mesh size), or use hp_weight_grad"
            )


class LinearLayout(NamedTuple):
    """Placements, per mesh dim, of an MXLinear's output Y [..., N] and of the gradients
    of its input X [..., K] and weight W [N, K], as DTensor's rules for the same ops
    would give them."""

    output: tuple[Placement, ...]
    grad_input: tuple[Placement, ...]
    grad_weight: tuple[Placement, ...]


# (x, weight, config-derived) key -> LinearLayout of placements that passed the checks;
# only successes are kept, so every refusal is raised (and names its layer) each time.
_LAYOUTS: dict[tuple, LinearLayout] = {}
_MAX_LAYOUTS = 4096


def linear_layout(
    layer: str, x: torch.Tensor, weight: torch.Tensor, config: MXLinearConfig
) -> LinearLayout:
    """:func:`check_placements`, then the :class:`LinearLayout` of these placements.

    Per mesh dim: (X Replicate, W Shard(0)) -> Y Shard(-1), dX Partial, dW Shard(0);
    (X Shard(-1), W Shard(1)) -> Y Partial, dX Shard(-1), dW Shard(1); (X sharded along
    a leading dim, W Replicate) -> Y sharded alike, dX alike, dW Partial; (Replicate,
    Replicate) -> all Replicate. Checked once per shapes, placements and mesh (eager).

    Arguments as :func:`check_placements`.

    Returns:
        The :class:`LinearLayout` (shared between calls: not to be changed).

    Raises:
        TypeError, ValueError: as :func:`check_placements`; ValueError also for a pair of
            placements with no rule (naming ``layer``, the mesh dim and both placements).
    """
    key = None
    if not torch.compiler.is_compiling():
        key = (
            x.shape, x.placements, weight.shape, weight.placements, x.device_mesh,
            weight.device_mesh, config.block_size, config.needs_colwise_input,
        )  # fmt: skip
        hit = _LAYOUTS.get(key)
        if hit is not None:
            return hit
    check_placements(layer, x, weight, config)
    if weight.device_mesh != x.device_mesh:
        raise ValueError(
            f"{layer}: input and weight are DTensors on different meshes "
            f"({x.device_mesh} and {weight.device_mesh})"
        )
    out, gx, gw = [], [], []
    last = x.dim() - 1
    for i, (px, pw) in enumerate(zip(x.placements, weight.placements, strict=True)):
        dx = getattr(px, "dim", None)
        if px.is_replicate() and pw.is_replicate():
            row = (Replicate(), Replicate(), Replicate())
        elif px.is_replicate() and pw == Shard(0):
            row = (Shard(last), Partial(), Shard(0))
        elif dx is not None and dx % x.dim() == last and pw == Shard(1):
            row = (Partial(), px, Shard(1))
        elif dx is not None and dx % x.dim() != last and pw.is_replicate():
            row = (px, px, Partial())
        else:
            raise ValueError(
                f"{layer}: input {px!r} with weight {pw!r} on mesh dim {i} has no MX linear "
                "rule; per mesh dim the input and weight may be (Replicate, Replicate), "
                "(Replicate, Shard(0)) (colwise), (Shard(-1), Shard(1)) (rowwise) or "
                "(Shard of a leading dim, Replicate) (sequence-sharded input)"
            )
        for acc, p in zip((out, gx, gw), row, strict=True):
            acc.append(p)
    layout = LinearLayout(tuple(out), tuple(gx), tuple(gw))
    if key is not None:
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    return layout
