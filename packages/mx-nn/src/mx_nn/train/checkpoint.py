"""Checkpoints: model and optimizer through ``torch.distributed.checkpoint`` (each rank
writes its own shards, so a sharded model saves as it is), plus a small per-rank file
of the loop's state (step, RNG states, finished runs, loss history)."""

from __future__ import annotations

import contextlib
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

__all__ = ["load", "rng_state", "save", "set_rng_state"]


@contextlib.contextmanager
def _quiet_single_process():
    # DCP warns that it "assumes the intent is to save in a single process" even when
    # told so (no_dist=True); one process is the intent here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """This process's torch RNG states (CPU, and every CUDA device when CUDA is up)."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, loop: dict) -> None:
    """Write ``path`` (a folder) atomically: DCP shards of model and optimizer, and
    ``loop-rank<r>.pt`` holding ``loop`` (picklable Python values and tensors). An
    existing checkpoint at ``path`` is replaced only once the new one is complete."""
    tmp = path.with_name(path.name + ".tmp")
    if _rank() == 0 and tmp.exists():
        shutil.rmtree(tmp)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _quiet_single_process():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp),
                 no_dist=not dist.is_initialized())  # fmt: skip
    torch.save(loop, tmp / f"loop-rank{_rank()}.pt")
    _barrier()
    if _rank() == 0:
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    _barrier()


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load ``path`` into ``model`` and ``optimizer`` (in place, either sharded or not as
    when saved) and return this rank's loop state."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    with _quiet_single_process():
        dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])  # fmt: skip
    return load_loop(path)


def load_loop(path: Path) -> dict:
    """This rank's loop state alone (no model or optimizer)."""
    return torch.load(path / f"loop-rank{_rank()}.pt", weights_only=True)
