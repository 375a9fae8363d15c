"""MXLinear on DTensors runs as one op on the local shards (``mx_nn.dtensor.local_shards``):
the same results, bit for bit, and the same gradient placements as dispatching every mx
op through DTensor and its sharding rules (``dispatch_per_op``), with no mx op left to
DTensor's dispatch."""

from __future__ import annotations

import contextlib
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


def _run_block(
    mesh, config, local: bool, form: str = "eager", autocast: bool = False
) -> tuple[list, dict]:
    """The parallelized block's output, input grad and (placements, local grad) of every
    parameter; and how many mx ops DTensor's dispatcher saw. ``form``: "eager" (the
    eager op), "eager DTensor()" (the same, its DTensors made as a torch without
    ``Tensor._dtensor__new__`` makes them), "traced" (the form torch.compile traces, run
    eagerly) or "traced 2.11" (the same, as on torch 2.11, whose ``from_local`` takes no
    ``grad_placements``);
    ``autocast``: under bf16 autocast (fp32 parameters)."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    import mx_nn.dtensor.local_shards

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

    ls = mx_nn.dtensor.local_shards
    saved = ls._EAGER_OP, ls._FROM_LOCAL_GRAD, ls._FAST_NEW
    ls._EAGER_OP = form.startswith("eager")
    ls._FROM_LOCAL_GRAD = form != "traced 2.11" and saved[1]
    ls._FAST_NEW = form != "eager DTensor()" and saved[2]
    dispatch = contextlib.nullcontext() if local else ls.dispatch_per_op()
    try:
        with dispatch, Count(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = block(x_loc)
            y.backward(grad[:, sl].contiguous())
    finally:
        ls._EAGER_OP, ls._FROM_LOCAL_GRAD, ls._FAST_NEW = saved
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
            for form in ("eager", "eager DTensor()", "traced", "traced 2.11"):
                out["runs"][recipe, path, form] = (_run_block(mesh, cfg, True, form), reference)
    cfg = _config("mxfp8", "fake_quant")
    reference = _run_block(mesh, cfg, False, autocast=True)
    out["runs"]["mxfp8", "fake_quant", "autocast"] = (
        _run_block(mesh, cfg, True, autocast=True),
        reference,
    )
    out["refusals"] = _refusals(mesh)
    return out


@functools.cache
def _results(world: int) -> list:
    from mx_dtensor.testing import spawn

    return spawn(_worker, world)


# Under bf16 autocast some backward bf16 GEMMs read the same values from operands of
# another memory layout (DTensor's ops leave strided views where the local op has
# contiguous tensors), so the CPU GEMM sums in another order: gradients one bf16
# rounding apart in places. The forward stays bit-exact.
AUTOCAST_GRAD_REL_TOL = 1e-3


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("world", [2, 4], ids=["tp2", "tp4"])
def test_local_shards_equal_dtensor_dispatch_bit_for_bit(world):
    for rank, res in enumerate(_results(world)):
        for key, ((local, seen_local), (dispatched, seen_dispatched)) in res["runs"].items():
            assert torch.equal(local[0], dispatched[0]), (rank, key, "output")
            grads = [("grad_input", None, local[1], dispatched[1])]
            for (name, p_a, g_a), (_, p_b, g_b) in zip(local[2:], dispatched[2:], strict=True):
                assert p_a == p_b, (rank, key, name, p_a, p_b)
                grads.append((name, p_a, g_a, g_b))
            for name, _, g_a, g_b in grads:
                if "autocast" in key:
                    assert _rel(g_a, g_b) <= AUTOCAST_GRAD_REL_TOL, (rank, key, name)
                else:
                    assert torch.equal(g_a, g_b), (rank, key, name)
            # The local path leaves no mx op to DTensor; the reference dispatches them all.
            assert seen_local == {}, (key, seen_local)
            assert sum(seen_dispatched.values()) >= 2 * 7, (key, seen_dispatched)


def test_placements_without_a_rule_are_refused_naming_the_layer():
    for msg in _results(2)[0]["refusals"]:
        assert "MXLinear 'proj'" in msg and "has no MX linear rule" in msg, msg
