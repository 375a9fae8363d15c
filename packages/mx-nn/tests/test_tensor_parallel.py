"""MXLinear under PyTorch's own tensor and sequence parallelism (gloo, 2 and 4 ranks).

A Llama-style block (grouped-query attention, SwiGLU MLP, RMSNorm) converted to MX and
parallelized with PyTorch's styles in torchtitan's plan; outputs and every gradient are
compared with the same MX block run whole on one process. Why they are not all bit-exact:
the rowwise layers (wo, w2) sum per-rank partial products (a K split) where the single
process runs one GEMM, so their fp32 outputs round differently, and everything after them
inherits that; the colwise layers' outputs and the weight gradients that contract over
the unsharded M are bit-exact (checked layer by layer).
"""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import it by name
from tp_block import BATCH, DIM, PATHS, RECIPES, REL_TOL, SEQ, _blocks, _config, _rel  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")


def _step(module, x, grad):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(grad)
    return y, x.grad


def _compare_block(mesh, config, compiled: bool = False) -> dict:
    """Relative errors of the TP block's output, input grad and parameter grads against
    the reference, and CommDebugMode's counts for forward and backward."""
    from torch.distributed.tensor.debug import CommDebugMode

    rank, tp = mesh.get_local_rank(), mesh.size()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, SEQ, DIM, generator=g)
    grad = torch.randn(BATCH, SEQ, DIM, generator=g)
    ref, block = _blocks(config, mesh)
    run = torch.compile(block, fullgraph=True) if compiled else block
    y_ref, gx_ref = _step(ref, x, grad)
    shard = SEQ // tp
    x_loc = x[:, rank * shard : (rank + 1) * shard].clone().requires_grad_()
    g_loc = grad[:, rank * shard : (rank + 1) * shard].contiguous()
    if compiled:  # CommDebugMode cannot run compiled code: count the graphs' collectives
        counter = _GraphCollectives()
        with torch._inductor.config.patch(post_grad_custom_post_pass=counter):
            y = run(x_loc)
            y.backward(g_loc)
        fwd, bwd = counter.graphs
    else:
        with CommDebugMode() as fwd:
            y = run(x_loc)
        with CommDebugMode() as bwd:
            y.backward(g_loc)
    sl = slice(rank * shard, (rank + 1) * shard)
    errs = {"out": _rel(y, y_ref[:, sl]), "grad_input": _rel(x_loc.grad, gx_ref[:, sl])}
    ref_params = dict(ref.named_parameters())
    for name, p in block.named_parameters():
        errs[name] = _rel(p.grad.full_tensor(), ref_params[name].grad)
    return {"errs": errs, "fwd": _counts(fwd), "bwd": _counts(bwd)}


def _counts(mode) -> dict:
    if isinstance(mode, dict):
        return mode
    return {str(k).split(".")[-1]: v for k, v in mode.get_comm_counts().items()}


class _GraphCollectives:
    """An Inductor post-grad pass that records, per compiled graph (forward, then
    backward), how many of each functional collective it holds."""

    def __init__(self) -> None:
        self.graphs: list[dict] = []

    def __call__(self, graph) -> None:
        counts: dict[str, int] = {}
        for node in graph.nodes:
            name = getattr(node.target, "name", lambda: "")()
            if name.startswith("_c10d_functional::") and "wait" not in name:
                key = name.split("::")[1].split(".")[0]
                counts[key] = counts.get(key, 0) + 1
        self.graphs.append(counts)

    def uuid(self):  # never cached: the counts must come from this compilation
        return None


def _layer_exactness(mesh, path: str) -> dict:
    """One colwise and one rowwise MXLinear: which results are bit-exact with the layer
    run whole (those whose arithmetic is the same), and the error of the others."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import mx_nn

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(128, 256, bias=False), nn.Linear(256, 128, bias=False))
    cfg = _config("mxfp8", path)
    ref = mx_nn.convert(copy.deepcopy(model), cfg)
    tp = parallelize_module(
        mx_nn.convert(copy.deepcopy(model), cfg),
        mesh,
        {"0": ColwiseParallel(use_local_output=False), "1": RowwiseParallel()},
    )
    x = torch.randn(2, 40, 128)
    grad = torch.randn(2, 40, 128)
    ref_h = ref[0](x.clone().requires_grad_())
    tp_h = tp[0](x.clone().requires_grad_())
    out = {"colwise_y_exact": torch.equal(tp_h.full_tensor(), ref_h)}
    y_ref, gx_ref = _step(ref, x, grad)
    y, gx = _step(tp, x, grad)
    out["colwise_dw_exact"] = torch.equal(tp[0].weight.grad.full_tensor(), ref[0].weight.grad)
    out["rowwise_dw_exact"] = torch.equal(tp[1].weight.grad.full_tensor(), ref[1].weight.grad)
    out["rowwise_y_rel"] = _rel(y, y_ref)
    out["grad_input_rel"] = _rel(gx, gx_ref)
    out["colwise_placement"] = str(tp_h.placements) == str((Shard(2),))
    return out


def _refusals(mesh) -> list:
    """Shards that would split a block, and a Partial input: refused naming the layer."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import mx_nn

    tp = mesh.size()
    odd = 32 * (tp + 1)  # per-rank shards of 48 (tp=2) or 40 (tp=4) features
    cases = []
    for style, shape in (("colwise", (64, odd)), ("rowwise", (odd, 64))):
        model = mx_nn.convert(nn.Sequential(nn.Linear(*shape, bias=False)), "mxfp8")
        plan = {"0": ColwiseParallel() if style == "colwise" else RowwiseParallel()}
        model = parallelize_module(model, mesh, plan)
        try:
            model(torch.randn(4, shape[0] // (tp if style == "rowwise" else 1)))
            cases.append((style, "no error"))
        except ValueError as e:
            cases.append((style, str(e)))
    # A sequence-sharded input to a replicated layer: tokens per rank must be whole blocks.
    layer = mx_nn.convert(nn.Sequential(nn.Linear(64, 64, bias=False)), "mxfp8")[0]
    layer.fqn = "proj"
    layer.weight = nn.Parameter(
        torch.distributed.tensor.distribute_tensor(layer.weight.detach(), mesh, [Replicate()])
    )
    from mx_dtensor.testing import from_full

    x = from_full(torch.randn(1, 24 * tp, 64), mesh, [Shard(1)])
    try:
        layer(x)
        cases.append(("tokens", "no error"))
    except ValueError as e:
        cases.append(("tokens", str(e)))
    try:
        layer(from_full(torch.randn(1, 32, 64), mesh, [Partial()]))
        cases.append(("partial", "no error"))
    except ValueError as e:
        cases.append(("partial", str(e)))
    return cases


def _sequence_sharded_layer(mesh) -> dict:
    """A replicated MXLinear on a sequence-sharded input: the output stays sharded on
    the sequence, nothing is communicated but the weight gradient's reduction."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    import mx_nn
    from mx_dtensor.testing import from_full

    tp, rank = mesh.size(), mesh.get_local_rank()
    torch.manual_seed(3)
    ref = mx_nn.convert(nn.Sequential(nn.Linear(64, 96, bias=False)), "mxfp8")[0]
    layer = copy.deepcopy(ref)
    layer.weight = nn.Parameter(
        torch.distributed.tensor.distribute_tensor(layer.weight.detach(), mesh, [Replicate()])
    )
    x_full, g_full = torch.randn(2, 32 * tp, 64), torch.randn(2, 32 * tp, 96)
    x = from_full(x_full, mesh, [Shard(1)], requires_grad=True)
    with CommDebugMode() as comm:
        y = layer(x)
        y.backward(from_full(g_full, mesh, [Shard(1)]))
    y_ref, gx_ref = _step(ref, x_full, g_full)
    sl = slice(32 * rank, 32 * (rank + 1))
    return {
        "placements": str(y.placements),
        "y_exact": torch.equal(y.to_local(), y_ref[:, sl]),
        "gx_exact": torch.equal(x.grad.to_local(), gx_ref[:, sl]),
        "gw_rel": _rel(layer.weight.grad.full_tensor(), ref.weight.grad),
        "comms": comm.get_total_counts(),
    }


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    out = {"blocks": {}, "layers": {}}
    out["plain"] = _compare_block(mesh, None)  # nn.Linear: the styles' own collectives
    for recipe in RECIPES:
        for path in PATHS:
            out["blocks"][recipe, path] = _compare_block(mesh, _config(recipe, path))
    for path in PATHS:
        out["layers"][path] = _layer_exactness(mesh, path)
    out["refusals"] = _refusals(mesh)
    out["sequence_sharded"] = _sequence_sharded_layer(mesh)
    return out


def _compiled_worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    out = {"plain": _compare_block(mesh, None)}
    for path in PATHS:
        out[path] = _compare_block(mesh, _config("mxfp8", path), compiled=True)
    return out


@functools.cache
def _results(world: int) -> list:
    from mx_dtensor.testing import spawn

    return spawn(_worker, world)


@pytest.fixture(params=[2, 4], ids=["tp2", "tp4"])
def results(request):
    return request.param, _results(request.param)


def test_block_matches_single_process(results):
    _, per_rank = results
    for rank, res in enumerate(per_rank):
        for (recipe, path), r in res["blocks"].items():
            for name, err in r["errs"].items():
                assert err <= REL_TOL, f"rank {rank} {recipe} {path} {name}: rel err {err:.2e}"


def test_collectives_are_the_styles_own(results):
    # The MX block communicates exactly as the nn.Linear block under the same plan:
    # two all-gathers (sequence -> replicate) and two reduce-scatters (rowwise outputs)
    # forward, the reverse backward; the casts and MX GEMMs add nothing.
    _, per_rank = results
    for res in per_rank:
        plain = res["plain"]
        assert sum(plain["fwd"].values()) == 4, plain["fwd"]
        for key, r in res["blocks"].items():
            assert r["fwd"] == plain["fwd"], (key, r["fwd"], plain["fwd"])
            assert r["bwd"] == plain["bwd"], (key, r["bwd"], plain["bwd"])


def test_layers_bit_exact_where_arithmetic_is_the_same(results):
    _, per_rank = results
    for res in per_rank:
        for path, r in res["layers"].items():
            assert r["colwise_placement"], path
            assert r["colwise_y_exact"] and r["colwise_dw_exact"] and r["rowwise_dw_exact"], r
            assert r["rowwise_y_rel"] <= REL_TOL and r["grad_input_rel"] <= REL_TOL, r


def test_shards_that_split_blocks_are_refused_naming_the_layer(results):
    world, per_rank = results
    cases = dict(per_rank[0]["refusals"])
    local = 32 * (world + 1) // world
    assert "MXLinear '0'" in cases["colwise"] and "out_features" in cases["colwise"]
    assert "MXLinear '0'" in cases["rowwise"] and "in_features" in cases["rowwise"]
    for style in ("colwise", "rowwise"):
        assert f"local sizes [{local}]" in cases[style], cases[style]
    assert "MXLinear 'proj'" in cases["tokens"] and "runs of [24]" in cases["tokens"]
    assert "MXLinear 'proj'" in cases["partial"] and "Partial" in cases["partial"]


def test_sequence_sharded_input_keeps_its_sharding(results):
    _, per_rank = results
    for res in per_rank:
        r = res["sequence_sharded"]
        assert r["placements"] == "(Shard(dim=1),)", r
        assert r["y_exact"] and r["gx_exact"] and r["gw_rel"] <= REL_TOL, r
        assert r["comms"] == 0, r  # the weight grad stays Partial until it is read


def test_compiled_block_matches_single_process():
    # torch.compile(fullgraph=True) of the parallelized block, both paths, at tp=2 only
    # (CPU compilation is slow).
    from mx_dtensor.testing import spawn

    for res in spawn(_compiled_worker, 2):
        for path in PATHS:
            r = res[path]
            for name, err in r["errs"].items():
                assert err <= REL_TOL, f"compiled {path} {name}: rel err {err:.2e}"
            # The compiled graphs hold the styles' collectives and nothing else.
            assert r["fwd"] == res["plain"]["fwd"], (path, r["fwd"])
            assert r["bwd"] == res["plain"]["bwd"], (path, r["bwd"])
