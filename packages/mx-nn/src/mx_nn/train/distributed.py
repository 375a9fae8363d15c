"""Process group and device mesh for ``--tp``/``--dp`` > 1 (under ``torchrun``), and
the hand-off to ``mx_nn.parallelize``."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import mx_nn
from mx_nn.train.args import BF16, TrainArgs

__all__ = ["apply_parallel", "dp_rank_and_size", "is_main", "mean_over_dp", "setup"]


def setup(args: TrainArgs) -> tuple[DeviceMesh | None, torch.device]:
    """The (dp, tp) mesh and this rank's device; ``(None, args.device)`` on one process.

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
    """``mx_nn.parallelize`` the model on ``mesh`` in ``recipe`` (None for bf16)."""
    return mx_nn.parallelize(model, mesh, recipe=None if recipe == BF16 else recipe)


def dp_rank_and_size(mesh: DeviceMesh | None) -> tuple[int, int]:
    """This rank's data-parallel index and the data-parallel degree."""
    if mesh is None:
        return 0, 1
    return mesh["dp"].get_local_rank(), mesh["dp"].size()


def is_main() -> bool:
    """Whether this process prints and writes the report (rank 0)."""
    return not dist.is_initialized() or dist.get_rank() == 0


def mean_over_dp(value: float, mesh: DeviceMesh | None) -> float:
    """The mean of ``value`` over the data-parallel ranks."""
    if mesh is None or mesh["dp"].size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=mesh.device_type)
    dist.all_reduce(t, group=mesh["dp"].get_group())
    return t.item() / mesh["dp"].size()
