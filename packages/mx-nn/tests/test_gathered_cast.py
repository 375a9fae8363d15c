"""mx_nn.casts.gathered: after an MX all-gather (PrepareMXModuleInput) the q/k/v MXLinears
take the gather's cast and make no forward input cast of their own; their outputs are
bit-identical to those after a bf16 gather (the linears' own cast of those values), on
both compute paths (2 gloo ranks)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mx_dtensor.testing import spawn

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")

DIM, OUT, BATCH, SEQ = 128, 64, 2, 64


class QKV(nn.Module):
    """Three linears reading one input, as attention's q, k and v do."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(DIM, OUT, bias=False) for _ in range(3))

    def forward(self, x):
        return self.q(x), self.k(x), self.v(x)


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module

    import mx_nn
    from mx_dtensor import MXColwiseParallel, PrepareMXModuleInput
    from mx_kernels.testing import counting_casts

    counting = counting_casts()  # kept: exiting (or collecting) it stops the count
    calls = counting.__enter__()  # this process only runs the test
    mx_nn.casts.enable_gather_handover()  # parallelize calls it; this test builds its own plan
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, SEQ, DIM, generator=g).to(torch.bfloat16).chunk(world, 1)[rank]
    layouts = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
    out = {}
    for path in ("mx", "fake_quant"):
        config = mx_nn.MXLinearConfig.from_recipe("mxfp8", compute_path=path)
        cast = config.input_cast
        other = dataclasses.replace(cast, fmt="fp8_e5m2")
        gathers = {
            "bf16": PrepareModuleInput(**layouts),
            "mx": PrepareMXModuleInput(**layouts, cast=cast),
            "mx, another cast": PrepareMXModuleInput(**layouts, cast=other),
        }
        for name, gather in gathers.items():
            torch.manual_seed(0)
            model = mx_nn.convert(QKV().to(torch.bfloat16), config)
            plan = {p: MXColwiseParallel(cast=cast) for p in ("q", "k", "v")}
            parallelize_module(model, mesh, gather)
            parallelize_module(model, mesh, plan)
            leaf = x.detach().clone().requires_grad_()
            calls.clear()
            ys = model(leaf)
            forward = list(calls)
            sum(y.float().sum() for y in ys).backward()  # the backward runs as before
            out[path, name] = {
                # The linears' forward input casts: of the [M, K] view of the local (whole) input.
                "linear casts": [c for c in forward if c[1] == (BATCH * SEQ, DIM)],
                "ys": [y.detach() for y in ys],
                "grad": leaf.grad is not None,
            }
    return out


def test_linears_take_the_gathered_cast():
    for r in spawn(_worker, 2):
        # Either path casts x both ways in forward in one read (the fused path along K
        # to values and along M to MX codes, kept for backward), unless a gather handed
        # it the rowwise cast (then x is cast along M alone, still in forward).
        md = (BATCH * SEQ, DIM)
        fused = ["fake_quantize_rowwise_quantize_colwise"]
        x_casts = {"mx": ["quantize_both"], "fake_quant": fused}
        for path, names in x_casts.items():
            bf16, mx, other = (r[path, n] for n in ("bf16", "mx", "mx, another cast"))
            one_cast = [(name, md) for name in names]
            assert bf16["linear casts"] == one_cast, path  # shared by q, k and v
            # The rowwise cast handed over by the gather; the columnwise one shared.
            assert mx["linear casts"] == [("quantize_colwise", md)]
            assert other["linear casts"] == one_cast, path  # the primed key did not match
            for a, b in zip(mx["ys"], bf16["ys"], strict=True):
                assert torch.equal(a, b), path
            assert bf16["grad"] and mx["grad"]


def _parallelized_worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    import mx_nn
    from mx_kernels.testing import counting_casts

    mesh = init_device_mesh("cpu", (world,))
    out = {}
    for path in ("mx", "fake_quant"):
        torch.manual_seed(0)
        shape = mx_nn.models.LlamaConfig(dim=DIM, hidden_dim=320)  # no weight is [M, DIM] per rank
        model = mx_nn.models.Llama(shape).to(torch.bfloat16)
        config = mx_nn.MXLinearConfig.from_recipe("mxfp8", compute_path=path)
        model = mx_nn.parallelize(model, mesh, recipe=config)
        tokens = torch.randint(0, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        with counting_casts() as calls:
            logits = model(tokens)
        logits.float().sum().backward()
        # Forward's casts of the gathered attention and MLP inputs: [M, dim], M all tokens.
        out[path] = sorted({op for op, shape in calls if shape == (BATCH * SEQ, DIM)})
        out[path, "count"] = sum(1 for _, shape in calls if shape == (BATCH * SEQ, DIM))
    return out


def test_parallelize_hands_the_gathered_cast_to_the_linears():
    """Under mx_nn.parallelize (SP, MX gathers) each gathered input of the two blocks'
    attention and MLP is cast once, along M only: the gather's rowwise cast reaches
    q/k/v and gate/up through the module's cast scope."""
    for r in spawn(_parallelized_worker, 2):
        for path in ("mx", "fake_quant"):  # the fused path keeps MX codes along M too
            assert r[path] == ["quantize_colwise"], path
            assert r[path, "count"] == 4, path  # 2 blocks x (attention, MLP)
