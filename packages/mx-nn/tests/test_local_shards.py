"""MXLinear on DTensors runs as one op on the local shards (``mx_nn.placements``): the
same results, bit for bit, and the same gradient placements as dispatching every mx op
through DTensor and its sharding rules, with no mx op left to DTensor's dispatch."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import it by name
from tp_block import BATCH, DIM, PATHS, SEQ, _blocks, _config  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")

RECIPES = ["mxfp8", "mxfp8_hp_wgrad"]


def _run_block(mesh, config, local: bool, grad_arg: bool = True) -> tuple[list, dict]:
    """The parallelized block's output, input grad and (placements, local grad) of every
    parameter; and how many mx ops DTensor's dispatcher saw. ``grad_arg`` False: the
    output is made as on torch 2.11, whose ``from_local`` takes no ``grad_placements``."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    import mx_nn.linear

    rank, tp = mesh.get_local_rank(), mesh.size()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, SEQ, DIM, generator=g)
    grad = torch.randn(BATCH, SEQ, DIM, generator=g)
    _, block = _blocks(config, mesh)
    sl = slice(rank * SEQ // tp, (rank + 1) * SEQ // tp)
    x_loc = x[:, sl].clone().requires_grad_()
    seen: dict[str, int] = {}

    class Count(TorchDispatchMode):  # sees each op before DTensor's own dispatch
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            flat = [*args, *(kwargs or {}).values()]
            if func.namespace == "mx" and any(isinstance(a, DTensor) for a in flat):
                seen[str(func)] = seen.get(str(func), 0) + 1
            return func(*args, **(kwargs or {}))

    saved = mx_nn.linear._LOCAL_SHARDS, mx_nn.linear._FROM_LOCAL_GRAD
    mx_nn.linear._LOCAL_SHARDS = local
    mx_nn.linear._FROM_LOCAL_GRAD = grad_arg and saved[1]
    try:
        with Count():
            y = block(x_loc)
            y.backward(grad[:, sl].contiguous())
    finally:
        mx_nn.linear._LOCAL_SHARDS, mx_nn.linear._FROM_LOCAL_GRAD = saved
    params = [(n, p.grad.placements, p.grad.to_local()) for n, p in block.named_parameters()]
    return [y.detach(), x_loc.grad, *params], seen


def _refusals(mesh) -> list[str]:
    """Placement pairs with no MX linear rule: refused naming the layer."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import mx_nn
    from mx_dtensor.testing import from_full

    msgs = []
    for x_p, w_p in ((Replicate(), Shard(1)), (Shard(0), Shard(0))):
        layer = mx_nn.convert(nn.Sequential(nn.Linear(64, 64, bias=False)), "mxfp8")[0]
        layer.fqn = "proj"
        layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [w_p]))
        try:
            layer(from_full(torch.randn(64, 64), mesh, [x_p]))
            msgs.append("no error")
        except ValueError as e:
            msgs.append(str(e))
    return msgs


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    out = {"runs": {}}
    for recipe in RECIPES:
        for path in PATHS:
            cfg = _config(recipe, path)
            reference = _run_block(mesh, cfg, False)
            out["runs"][recipe, path] = (_run_block(mesh, cfg, True), reference)
            out["runs"][recipe, path, "2.11"] = (_run_block(mesh, cfg, True, False), reference)
    out["refusals"] = _refusals(mesh)
    return out


@functools.cache
def _results(world: int) -> list:
    from mx_dtensor.testing import spawn

    return spawn(_worker, world)


@pytest.mark.parametrize("world", [2, 4], ids=["tp2", "tp4"])
def test_local_shards_equal_dtensor_dispatch_bit_for_bit(world):
    for rank, res in enumerate(_results(world)):
        for key, ((local, seen_local), (dispatched, seen_dispatched)) in res["runs"].items():
            assert torch.equal(local[0], dispatched[0]), (rank, key, "output")
            assert torch.equal(local[1], dispatched[1]), (rank, key, "grad_input")
            for (name, p_a, g_a), (_, p_b, g_b) in zip(local[2:], dispatched[2:], strict=True):
                assert p_a == p_b, (rank, key, name, p_a, p_b)
                assert torch.equal(g_a, g_b), (rank, key, name)
            # The local path leaves no mx op to DTensor; the reference dispatches them all.
            assert seen_local == {}, (key, seen_local)
            assert sum(seen_dispatched.values()) >= 2 * 7, (key, seen_dispatched)


def test_placements_without_a_rule_are_refused_naming_the_layer():
    for msg in _results(2)[0]["refusals"]:
        assert "MXLinear 'proj'" in msg and "has no MX linear rule" in msg, msg
