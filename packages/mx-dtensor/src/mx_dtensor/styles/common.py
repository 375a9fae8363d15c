"""What the MX styles refuse and how they say so: a module's name in errors, whole MX
blocks per rank in a linear's weight and in a sequence shard, and the one log line of a
gather that stays in high precision.

Duck-typed: the sizes come from a linear's ``weight`` [out_features, in_features]
(``nn.Linear`` or any subclass, as PyTorch's styles take), and the module's ``fqn``,
where it has one (``mx_nn.MXLinear``), is quoted in messages.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Shard

from mx_dtensor.sharding import local_sizes

__all__ = ["check_linear", "check_tokens", "is_last_dim", "log_once", "module_name"]

logger = logging.getLogger("mx_dtensor")
_LOGGED: set[tuple[str, str]] = set()


def is_last_dim(dim: int, ndim: int) -> bool:
    """Whether ``dim`` is the last of ``ndim`` dims: the blocked one.

    Args:
        dim: a dim, negative counting from the end.
        ndim: the tensor's number of dims.

    Returns:
        True for the last dim.
    """
    return dim % ndim == ndim - 1


def log_once(style: str, layout: Placement) -> None:
    """Log, once per style and layout, that a gather of that layout runs in high
    precision (the rowwise MX blocks run along the last dim, which it gathers).

    Args:
        style: the style's name.
        layout: the input layout gathered in high precision.
    """
    key = (style, repr(layout))
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.info(
            "mx_dtensor.%s: %s -> Replicate() gathers in high precision (the MX blocks run "
            "along the last dim)",
            *key,
        )


def module_name(module: nn.Module) -> str:
    """How errors name ``module``.

    Args:
        module: any module.

    Returns:
        Its type, its ``fqn`` if it has one, and for a 2-D weight its features.
    """
    fqn = getattr(module, "fqn", None)
    name = type(module).__name__ + (f" {fqn!r}" if isinstance(fqn, str) and fqn else "")
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim == 2:
        name += f" (in_features={weight.shape[1]}, out_features={weight.shape[0]})"
    return name


def check_linear(style: str, module: nn.Module, mesh: DeviceMesh, split: int, bs: int) -> None:
    """Refuse a module that ``style`` cannot shard along weight dim ``split`` (0: the
    out_features, colwise; 1: the in_features, rowwise) over ``mesh`` into whole MX
    blocks of ``bs``: each rank's share of either dim a multiple of ``bs``.

    Args:
        style: the style's name, for messages.
        module: the module the style is applied to.
        mesh: the 1-D mesh it shards over.
        split: the weight dim it splits (0 or 1).
        bs: the MX block size.

    Raises:
        NotImplementedError: not an ``nn.Linear`` (an embedding is not MX: use PyTorch's
            style).
        ValueError: a shard (or the unsplit dim) not a multiple of ``bs``.
    """
    if not isinstance(module, nn.Linear):
        raise NotImplementedError(
            f"{style} shards linears (nn.Linear and its subclasses), got {module_name(module)}"
            f"; use {style.removeprefix('MX')} for other modules (they are not MX)"
        )
    weight = module.weight
    tp = mesh.size()
    for dim, what in ((0, "out_features"), (1, "in_features")):
        size = weight.shape[dim]
        sizes = local_sizes(size, (Shard(0),), (tp,), 0) if dim == split else [size]
        if any(s % bs for s in sizes):
            per = f"splits into {sorted(set(sizes))} per rank" if dim == split else "is unsplit"
            raise ValueError(
                f"{style}: {module_name(module)}: {what}={size} {per} at tp={tp}, not a "
                f"multiple of block_size={bs}: MX casts need whole blocks on every rank"
            )


def check_tokens(
    style: str, module: nn.Module, x: object, seq_dim: int, bs: int, mesh: DeviceMesh
) -> None:
    """Refuse a sequence shard whose tokens per rank along ``seq_dim`` are not a multiple
    of ``bs`` (shapes only: nothing is communicated). ``x``: this rank's shard, or a
    DTensor about to be sharded along ``seq_dim``; anything else is left to the style.

    Args:
        style: the style's name, for messages.
        module: the module whose input ``x`` is, for messages.
        x: the input.
        seq_dim: the sequence dim, negative counting from the end.
        bs: the MX block size.
        mesh: the 1-D mesh the sequence is sharded over.

    Raises:
        ValueError: naming ``module``, the sizes and the padding that fixes them.
    """
    if not isinstance(x, torch.Tensor) or x.ndim == 0:
        return
    dim, tp = seq_dim % x.ndim, mesh.size()
    if isinstance(x, DTensor):
        total = x.shape[dim]
        sizes = local_sizes(total, (Shard(dim),), (tp,), dim)
        got = f"input shape {tuple(x.shape)} gives {sorted(set(sizes))} tokens per rank"
    else:
        sizes = [x.shape[dim]]
        total = sizes[0] * tp
        got = f"this rank's shard {tuple(x.shape)} has {sizes[0]} tokens ({total} in all)"
    if all(s % bs == 0 for s in sizes):
        return
    step = bs * tp
    padded = -(-total // step) * step
    raise ValueError(
        f"{style}: {module_name(module)}: tokens per rank along dim {dim} must be a multiple "
        f"of block_size={bs} (the MX columnwise casts of the linears' inputs block along the "
        f"tokens); {got} at tp={tp}. Pad the sequence by {padded - total} to {padded} tokens "
        f"(a multiple of {bs} x {tp})"
    )
