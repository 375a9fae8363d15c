"""``enable_fsdp_mx_all_gather``: make FSDP2 gather MXLinear weights in MX (the weight
subclasses and what each gather moves are in :mod:`mx_nn.fsdp.weight`)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from mx_nn.fsdp.weight import MXShardedWeight, ShardState, is_sharded
from mx_nn.linear import MXLinear

__all__ = ["enable_fsdp_mx_all_gather"]


def enable_fsdp_mx_all_gather(module: nn.Module) -> int:
    """Make FSDP2 gather every :class:`mx_nn.MXLinear` weight under ``module`` in MX (see
    the module doc). Call it after tensor parallelism and before ``fully_shard``, which
    must use ``reshard_after_forward=True`` for the modules holding these layers. State
    dicts keep plain tensors (DTensors of them).

    Args:
        module: the module (a decoder block, or the model) whose MXLinear weights FSDP2
            will gather in MX; weights made so already are left as they are.

    Returns:
        How many weights it made so.

    Raises:
        ValueError: ``module`` or a module under it is already ``fully_shard``-ed.
    """
    if any(isinstance(m, FSDPModule) for m in module.modules()):
        raise ValueError(
            "enable_fsdp_mx_all_gather must run before fully_shard: "
            f"{type(module).__name__} already has FSDP-sharded modules"
        )
    count = 0
    for m in module.modules():
        if not isinstance(m, MXLinear) or is_sharded(m.weight):
            continue
        w = m.weight
        state = ShardState(m.layer_name)
        with torch.no_grad():
            if isinstance(w, DTensor):
                local = MXShardedWeight(w._local_tensor.detach(), state)
                new = DTensor.from_local(local, w.device_mesh, w.placements, run_check=False,
                                         shape=w.shape, stride=w.stride())  # fmt: skip
            else:
                new = MXShardedWeight(w.detach(), state)
        m.weight = nn.Parameter(new, requires_grad=w.requires_grad)
        m.register_state_dict_post_hook(_plain_state_dict)
        count += 1
    return count


def _plain_state_dict(module: nn.Module, state_dict: dict, prefix: str, _meta) -> None:
    """State dicts hold the plain weight (a DTensor of it), so that a checkpoint loads
    into a model without this option; ``keep_vars=True`` keeps the Parameter."""
    key = prefix + "weight"
    v = state_dict.get(key)
    if v is None or isinstance(v, nn.Parameter) or not is_sharded(v):
        return
    if isinstance(v, DTensor):
        state_dict[key] = DTensor.from_local(
            v._local_tensor._data, v.device_mesh, v.placements, run_check=False,
            shape=v.shape, stride=v.stride(),
        )  # fmt: skip
    else:
        state_dict[key] = v._data
