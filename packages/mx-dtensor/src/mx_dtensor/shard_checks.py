"""The placement arithmetic and the checks that the ``mx::`` ops' sharding rules
(:mod:`mx_dtensor.sharding`) share: each rank's local sizes, whole MX blocks per rank,
no Partial input, and the error they raise, :class:`MXShardingError`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor.placement_types import Placement, _StridedShard

__all__ = [
    "MXShardingError",
    "check_partial",
    "check_whole_blocks",
    "local_sizes",
    "moved",
    "normalized",
    "placed_as",
    "sharded_dim",
    "split_block_reason",
    "where",
]


class MXShardingError(ValueError, NotImplementedError):
    """A placement the ``mx::`` ops have no rule for, or a shard of a blocked dim that
    does not hold whole blocks.

    A ValueError. It is a NotImplementedError too because DTensor's dispatcher passes
    NotImplementedError from sharding propagation through unchanged and wraps any other
    exception in a RuntimeError (``torch/distributed/tensor/_dispatch.py``, torch
    2.9-2.13)."""


def local_sizes(
    size: int, placements: Sequence[Placement], mesh_shape: Sequence[int], dim: int
) -> list[int]:
    """The size along ``dim`` of every rank's local shard: a ``Shard`` splits as
    ``torch.chunk``, mesh dims left to right, as DTensor does; a
    ``_StridedShard(split_factor=f)`` chunks each of f equal parts (``size`` divisible by
    f); other placements leave the size alone.

    Args:
        size: the global size of ``dim``, in indices of that dim.
        placements: one per mesh dim (a shard's dim compared with ``dim`` as given).
        mesh_shape: the mesh's size per mesh dim.
        dim: the tensor dim.
    Returns:
        One local size per rank, in mesh-coordinate (row-major) order.
    """
    sizes = []
    for coord in itertools.product(*(range(n) for n in mesh_shape)):
        s = size
        for p, n, c in zip(placements, mesh_shape, coord, strict=True):
            if sharded_dim(p) == dim:
                f = p.split_factor if isinstance(p, _StridedShard) else 1
                chunk = -(-(s // f) // n)
                s = f * max(0, min(chunk, s // f - c * chunk))
        sizes.append(s)
    return sizes


def normalized(p: Placement, ndim: int) -> Placement:
    """A placement with a non-negative dim.

    Args:
        p: any placement.
        ndim: the tensor's rank.
    Returns:
        ``p`` with a negative ``Shard``/``_StridedShard`` dim counted from the front
        (the split factor kept); any other placement unchanged.
    """
    if type(p) is Shard and p.dim < 0:
        return Shard(p.dim + ndim)
    if isinstance(p, _StridedShard) and p.dim < 0:
        return _StridedShard(p.dim + ndim, split_factor=p.split_factor)
    return p


def sharded_dim(p: Placement) -> int | None:
    """The tensor dim a placement shards.

    Args:
        p: any placement.
    Returns:
        The dim of a ``Shard`` or ``_StridedShard`` (as stored, possibly negative); None
        for any other placement (Replicate, Partial).
    """
    if type(p) is Shard or isinstance(p, _StridedShard):
        return p.dim
    return None


def moved(p: Placement, dim: int) -> Placement:
    """A shard placement moved to another dim (an output's dim for x's).

    Args:
        p: a ``Shard`` or ``_StridedShard``.
        dim: the dim it shards instead.
    Returns:
        ``Shard(dim)``, or ``_StridedShard(dim)`` with ``p``'s split factor.
    """
    if isinstance(p, _StridedShard):
        return _StridedShard(dim, split_factor=p.split_factor)
    return Shard(dim)


def placed_as(spec: DTensorSpec, dims: Sequence[int] = ()) -> tuple[Placement, ...]:
    """The placements of an output that takes x's dim d as its dim ``dims[d]`` (as dim d
    where ``dims`` is empty), from x's: a shard moves with its dim, the rest replicate.

    Args:
        spec: x's spec.
        dims: x's dim -> the output's dim; ``(1, 0)`` for an output laid out as x^T.
    Returns:
        One placement per mesh dim.
    """
    ndim = len(spec.shape)
    out = []
    for p in spec.placements:
        p = normalized(p, ndim)
        d = sharded_dim(p)
        out.append(Replicate() if d is None else moved(p, dims[d] if dims else d))
    return tuple(out)


def where(op: str, arg: str, spec: DTensorSpec, mesh_dim: int) -> str:
    """The start of an error message about one input on one mesh dim.

    Args:
        op: the op's name.
        arg: the input's name.
        spec: the input's DTensor spec.
        mesh_dim: the mesh dim in question.
    Returns:
        ``"op: arg (shape ..., placements ...) on mesh dim i of size n"``.
    """
    return (
        f"{op}: {arg} (shape {tuple(spec.shape)}, placements {tuple(spec.placements)}) "
        f"on mesh dim {mesh_dim} of size {spec.mesh.shape[mesh_dim]}"
    )


def check_partial(op: str, arg: str, spec: DTensorSpec) -> None:
    """Refuse a Partial input: the amax of a partial sum is not the amax of the sum.

    Args:
        op, arg, spec: as :func:`where`.
    Raises:
        MXShardingError: ``spec`` is Partial on some mesh dim (the message names it).
    """
    for i, p in enumerate(spec.placements):
        if p.is_partial():
            raise MXShardingError(
                f"{where(op, arg, spec, i)} is {p!r}: a Partial input has no rule (the amax "
                "of a partial sum is not the amax of the sum); reduce it first "
                "(redistribute to Replicate or Shard)"
            )


def split_block_reason(
    shape: Sequence[int],
    placements: Sequence[Placement],
    mesh_shape: Sequence[int],
    dim: int,
    block_size: int,
    per: int = 1,
) -> str | None:
    """Why the local shards of ``dim`` would split blocks of ``block_size`` elements.

    A ``Shard`` of ``dim`` (on any number of mesh dims) must leave local sizes that are
    multiples of ``block_size``; a ``_StridedShard`` (what DTensor makes of a flattened
    ``[B, S]`` with S sharded) must be the only one on ``dim`` and leave contiguous runs
    that are multiples of ``block_size``.

    Args:
        shape: the global shape.
        placements: one per mesh dim (a shard's dim compared with ``dim`` as given).
        mesh_shape: the mesh's size per mesh dim.
        dim: the blocked dim.
        block_size: elements per MX block.
        per: elements per index of ``dim`` (2 for packed fp4 bytes).
    Returns:
        The reason, naming the dim, the sizes and the mesh dims, or None when every rank
        holds whole blocks (or ``dim`` is not sharded).
    """
    mesh_dims = [i for i, p in enumerate(placements) if sharded_dim(p) == dim]
    if not mesh_dims:
        return None
    size = shape[dim]
    strided = [i for i in mesh_dims if isinstance(placements[i], _StridedShard)]
    if strided:
        i, p = strided[0], placements[strided[0]]
        sf = p.split_factor
        if len(mesh_dims) > 1 or size % sf:
            return (
                f"dim {dim} (global size {size * per}) is {p} on mesh dim {i} among "
                f"{tuple(placements)}: no rule for this strided shard of a blocked dim"
            )
        runs = sorted(
            {r * per for r in local_sizes(size // sf, [Shard(dim)], [mesh_shape[i]], dim)}
        )
        if any(r % block_size for r in runs):
            return (
                f"dim {dim} (global size {size * per}) is {p} on mesh dim {i} of size "
                f"{mesh_shape[i]}: local runs of {runs} elements, not all multiples of the "
                f"block size {block_size}, so a shard would split a block"
            )
        return None
    local = sorted({s * per for s in local_sizes(size, placements, mesh_shape, dim)})
    if any(s % block_size for s in local):
        return (
            f"dim {dim} (global size {size * per}) sharded over mesh dims {mesh_dims} of "
            f"sizes {[mesh_shape[i] for i in mesh_dims]} gives local sizes {local}, not all "
            f"multiples of the block size {block_size}, so a shard would split a block. "
            f"Shard it so that every rank holds whole blocks (a mesh size that divides its "
            f"{size * per // block_size} blocks), or pad it"
        )
    return None


def check_whole_blocks(
    op: str, arg: str, spec: DTensorSpec, dim: int, block: int, per: int = 1
) -> None:
    """Refuse an input whose local shards of ``dim`` split MX blocks.

    Args:
        op, arg, spec: as :func:`where`.
        dim, per: as :func:`split_block_reason`.
        block: elements per MX block.
    Raises:
        MXShardingError: :func:`split_block_reason` gives a reason (the message has it,
            with the input's shape, placements and mesh shape).
    """
    why = split_block_reason(spec.shape, spec.placements, spec.mesh.shape, dim, block, per)
    if why is not None:
        raise MXShardingError(
            f"{op}: {arg} (shape {tuple(spec.shape)}, placements "
            f"{tuple(spec.placements)}, mesh shape {tuple(spec.mesh.shape)}): {why}"
        )
