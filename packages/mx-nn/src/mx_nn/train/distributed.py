"""Process group and device mesh for ``--tp``/``--dp`` > 1 (under ``torchrun``), and
the hand-off to ``mx_nn.parallelize``."""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import mx_nn
from mx_nn.train.args import BF16, TrainArgs

__all__ = [
    "agree_step",
    "apply_parallel",
    "dp_rank_and_size",
    "dp_shard",
    "is_main",
    "max_over_ranks",
    "sum_over_dp",
    "setup",
]

logger = logging.getLogger("mx_nn.train")


def setup(args: TrainArgs) -> tuple[DeviceMesh | None, torch.device]:
    """Start the process group for ``--tp``/``--dp`` > 1 (under torchrun).

    Args:
        args: the run's flags.
    Returns:
        ``(mesh, device)``: the 2-D (``"dp"``, ``"tp"``) mesh and this rank's device (CUDA:
        ``LOCAL_RANK``'s); ``(None, args.device)`` on one process.
    Raises:
        RuntimeError: parallelism asked for but ``mx_nn.parallelize`` is missing, or the
            process count (``WORLD_SIZE``) is not ``tp * dp``.
    """
    device = torch.device(args.device)
    world = args.tp * args.dp
    if world == 1:
        return None, device
    if getattr(mx_nn, "parallelize", None) is None:
        raise RuntimeError(
            f"--tp {args.tp} --dp {args.dp}: tensor/data parallel training needs "
            "mx_nn.parallelize, which this mx-nn does not provide"
        )
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world != world:
        raise RuntimeError(
            f"--tp {args.tp} x --dp {args.dp} needs {world} processes, WORLD_SIZE is "
            f"{env_world}: run under torchrun --nproc-per-node {world} -m mx_nn.train ..."
        )
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    mesh = init_device_mesh(device.type, (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    return mesh, device


def apply_parallel(model: nn.Module, mesh: DeviceMesh, recipe: str) -> nn.Module:
    """``mx_nn.parallelize`` the model on ``mesh`` in ``recipe``.

    A mesh dim of size 1 is left out (``mesh["dp"]`` alone: FSDP2 only; ``mesh["tp"]``
    alone: tensor parallel only), so no parameter becomes a DTensor over one rank.

    Args:
        model: the plain model.
        mesh: :func:`setup`'s (dp, tp) mesh.
        recipe: an mx_nn recipe, or ``"bf16"`` (no MX layers: ``recipe=None``).
    Returns:
        The parallelized model (``mx_nn.parallelize``'s).
    """
    dp, tp = mesh["dp"].size(), mesh["tp"].size()
    sub = mesh if dp > 1 and tp > 1 else mesh["dp"] if dp > 1 else mesh["tp"]
    logger.info("mx-train: parallelize on %s mesh %s (dp=%d, tp=%d)",
                sub.mesh_dim_names, tuple(sub.mesh.shape), dp, tp)  # fmt: skip
    return mx_nn.parallelize(model, sub, recipe=None if recipe == BF16 else recipe)


def dp_rank_and_size(mesh: DeviceMesh | None) -> tuple[int, int]:
    """This rank's place in data parallelism.

    Args:
        mesh: :func:`setup`'s mesh, or None on one process.
    Returns:
        ``(rank, size)``: the data-parallel index and degree (``(0, 1)`` without a mesh).
    """
    if mesh is None:
        return 0, 1
    return mesh["dp"].get_local_rank(), mesh["dp"].size()


def is_main() -> bool:
    """Whether this process prints and writes the report.

    Returns:
        True on rank 0, or without a process group.
    """
    return not dist.is_initialized() or dist.get_rank() == 0


def dp_shard(rows: int, mesh: DeviceMesh | None) -> tuple[torch.Tensor, torch.Tensor]:
    """This data-parallel rank's share of a global batch of ``rows`` rows: the row
    indices (int64 [ceil(rows / dp)]) and their weights (float64, 1 or 0).

    Rank r takes the r-th contiguous block, so the dp ranks together see the global
    batch in its order. When ``rows`` is not a multiple of dp the last blocks are padded
    with copies of the last row of weight 0: every rank runs the same forward count and
    shape (FSDP's collectives need it) and the padding counts for nothing.

    Args:
        rows: the global batch's rows.
        mesh: :func:`setup`'s mesh, or None on one process.
    Returns:
        ``(idx, weight)``: int64 [ceil(rows / dp)] row indices and float64 weights of the
        same shape, 1 for a row of this rank, 0 for padding.
    """
    rank, size = dp_rank_and_size(mesh)
    per = -(-rows // size)
    idx = torch.arange(rank * per, (rank + 1) * per)
    weight = (idx < rows).to(torch.float64)
    return idx.clamp(max=rows - 1), weight


def sum_over_dp(values: list[float], mesh: DeviceMesh | None) -> list[float]:
    """Sum values over the data-parallel ranks (one all-reduce, float64).

    Args:
        values: this rank's values.
        mesh: :func:`setup`'s mesh, or None on one process.
    Returns:
        The elementwise sums (``values`` themselves without data parallelism).
    """
    if mesh is None or mesh["dp"].size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=mesh.device_type)
    dist.all_reduce(t, group=mesh["dp"].get_group())
    return t.tolist()


def agree_step(loss: float, stop: bool, mesh: DeviceMesh | None) -> tuple[float, bool]:
    """After a step: the mean of ``loss`` over the data-parallel ranks (the global
    batch's loss, the ranks' batches being of one size), and whether any rank was asked
    to stop, so that all stop after the same step (a signal can reach the ranks between
    different steps; a rank that stopped alone would leave the others in a collective).

    One all-reduce over all ranks: the tensor-parallel ranks of one dp group hold the
    same loss, so the mean over all ranks is the mean over dp.

    Args:
        loss: this rank's loss of the step.
        stop: whether this rank was asked to stop.
        mesh: :func:`setup`'s mesh, or None on one process.
    Returns:
        ``(mean loss, any rank stops)``.
    """
    if mesh is None:
        return loss, stop
    t = torch.tensor([loss, float(stop)], dtype=torch.float64, device=mesh.device_type)
    dist.all_reduce(t)
    return t[0].item() / dist.get_world_size(), t[1].item() > 0


def max_over_ranks(value: float, mesh: DeviceMesh | None) -> float:
    """The largest value of all ranks (one all-reduce).

    Args:
        value: this rank's value.
        mesh: :func:`setup`'s mesh, or None on one process.
    Returns:
        The maximum over every rank (``value`` itself without a mesh).
    """
    if mesh is None:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=mesh.device_type)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()
