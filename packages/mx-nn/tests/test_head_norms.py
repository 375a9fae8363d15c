"""mx_nn.plan.norms.HeadShardedNorm: OLMo2's q_norm (the installed transformers'
Olmo2RMSNorm, over all heads) on 2 gloo ranks, each holding its heads' features, against
the same norm on one process: output, the input's and the weight's gradients (fp32,
within 1e-6 relative), and one [tokens, 1] all-reduce in forward."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from mx_dtensor.testing import spawn

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")
WIDTH, TOKENS = 256, (2, 16)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _worker(rank: int, world: int) -> dict:
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    from mx_nn.plan.norms import HeadShardedNorm

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    ref = Olmo2RMSNorm(WIDTH, eps=1e-6)
    with torch.no_grad():
        ref.weight.normal_()
    x = torch.randn(*TOKENS, WIDTH, requires_grad=True)
    grad = torch.randn(*TOKENS, WIDTH)
    ref(x).backward(grad)
    par = parallelize_module(copy.deepcopy(ref), mesh, HeadShardedNorm())
    mine = slice(rank * WIDTH // world, (rank + 1) * WIDTH // world)
    x_local = x.detach()[..., mine].clone().requires_grad_()
    with CommDebugMode() as forward:
        y = par(x_local)
    y.backward(grad[..., mine])
    return {
        "plain output": type(y) is torch.Tensor,
        "out": _rel(y, ref(x).detach()[..., mine]),
        "grad input": _rel(x_local.grad, x.grad[..., mine]),
        "grad weight": _rel(par.weight.grad.full_tensor(), ref.weight.grad),
        "weight placements": par.weight.placements,
        "forward comms": {str(k): v for k, v in forward.get_comm_counts().items()},
    }


def test_norm_over_all_heads_matches_one_process_with_its_gradients():
    for r in spawn(_worker, 2):
        assert r["plain output"], r
        for key in ("out", "grad input", "grad weight"):
            assert r[key] <= 1e-6, (key, r)
        assert str(r["weight placements"]) == "(Shard(dim=0),)", r
        assert r["forward comms"] == {"c10d_functional.all_reduce": 1}, r
