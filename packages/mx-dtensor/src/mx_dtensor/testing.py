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
    process group; return each rank's (picklable) return value, in rank order.

    ``fn`` must be a module-level function. An exception on any rank is raised here as
    an AssertionError carrying that rank's traceback.
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
    """This rank's shard of ``full`` under ``placements`` (Shard and Replicate; a view)."""
    shape, offset = compute_local_shape_and_global_offset(full.shape, mesh, placements)
    out = full
    for d, (n, o) in enumerate(zip(shape, offset, strict=True)):
        out = out.narrow(d, o, n)
    return out


def from_full(
    full: torch.Tensor, mesh, placements: Sequence[Placement], *, requires_grad: bool = False
) -> DTensor:
    """A DTensor of ``full`` (held whole by every rank) under Shard/Replicate
    ``placements``, built from this rank's slice: no communication, any dtype (gloo
    refuses float8), uneven shards allowed. ``requires_grad``: a leaf DTensor."""
    local = local_slice(full, mesh, placements).clone()
    dt = DTensor.from_local(
        local, mesh, placements, run_check=False, shape=full.shape, stride=full.stride()
    )
    return dt.detach().requires_grad_(requires_grad) if requires_grad else dt
