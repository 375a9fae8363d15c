"""Helpers for multi-rank tests on CPU: spawn a gloo process group from pytest, and build
DTensors from a full tensor every rank holds, without communicating.

Not imported by ``mx_dtensor`` itself (import ``mx_dtensor.testing``).
"""

from __future__ import annotations

import datetime
import os
import socket
import traceback
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import Placement

__all__ = ["from_full", "local_slice", "spawn"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # A rank that fails leaves the others waiting in a collective: time out instead of
    # hanging the test run (rank skew here is at most a CPU compilation, about a minute).
    timeout = datetime.timedelta(seconds=300)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    try:
        results[rank] = ("ok", fn(rank, world, *args))
    except BaseException:  # reported to the parent, which fails the test with it
        results[rank] = ("error", traceback.format_exc())
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, world: int, *args) -> list:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes that share a gloo
    process group (on 127.0.0.1, a free port, a 300 s collective timeout).

    Args:
        fn: a module-level function (the spawned processes import it by name).
        world: the number of ranks.
        *args: passed to ``fn`` after rank and world; picklable.

    Returns:
        Each rank's (picklable) return value, in rank order.

    Raises:
        AssertionError: an exception on a rank (the first such rank's traceback).
    """
    manager = mp.get_context("spawn").Manager()
    results = manager.dict()
    mp.start_processes(
        _entry, args=(world, _free_port(), fn, args, results), nprocs=world, start_method="spawn"
    )
    out = []
    for rank in range(world):
        status, value = results[rank]
        if status != "ok":
            raise AssertionError(f"rank {rank} failed:\n{value}")
        out.append(value)
    return out


def local_slice(full: torch.Tensor, mesh, placements: Sequence[Placement]) -> torch.Tensor:
    """This rank's shard of ``full`` under ``placements``.

    Args:
        full: the whole tensor, as every rank holds it.
        mesh: the device mesh.
        placements: Shard and Replicate placements, one per mesh dim.

    Returns:
        A view of ``full``: this rank's local shard.
    """
    shape, offset = compute_local_shape_and_global_offset(full.shape, mesh, placements)
    out = full
    for d, (n, o) in enumerate(zip(shape, offset, strict=True)):
        out = out.narrow(d, o, n)
    return out


def from_full(
    full: torch.Tensor, mesh, placements: Sequence[Placement], *, requires_grad: bool = False
) -> DTensor:
    """A DTensor of ``full`` under ``placements``, built from this rank's slice: no
    communication, any dtype (gloo refuses float8), uneven shards allowed.

    Args:
        full: the whole tensor, as every rank holds it.
        mesh: the device mesh.
        placements: Shard and Replicate placements, one per mesh dim.
        requires_grad: make it a leaf DTensor that requires grad.

    Returns:
        The DTensor (its local tensor a copy of this rank's slice).
    """
    local = local_slice(full, mesh, placements).clone()
    dt = DTensor.from_local(
        local, mesh, placements, run_check=False, shape=full.shape, stride=full.stride()
    )
    return dt.detach().requires_grad_(requires_grad) if requires_grad else dt
