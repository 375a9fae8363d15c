"""mxstack's linears under torchtitan 0.3's own tensor parallelism: the model converted
by ``MXStackConverter``, its sharding configs set as torchtitan's trainer sets them
(``set_llama3_sharding_config``), then ``Module.parallelize`` with the default
``spmd_types`` backend, which hands each linear its local shards as plain tensors.
Against the same converted model on one process, on 2 gloo ranks.

The ``full_dtensor`` and ``partial_dtensor`` backends are not run here: torchtitan 0.3
initialises CUDA on those paths (``Torch not compiled with CUDA enabled`` on CPU).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchtitan")

sys.path.insert(0, str(Path(__file__).parent))
from real_models import BATCH, SEQ, VOCAB, titan_llama3  # noqa: E402
from torchtitan.distributed import utils as dist_utils  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402
from torchtitan.distributed.spmd_types import annotate_input_spmd_types  # noqa: E402
from torchtitan.models.llama3.sharding import set_llama3_sharding_config  # noqa: E402

from mx_dtensor.testing import spawn  # noqa: E402
from mx_nn.plan.torchtitan import MXStackConverter, TitanMXLinear  # noqa: E402

LOGITS_TOLERANCE = 1e-4  # max |difference| / max |logits|, as the other real-model tests
LOSS_TOLERANCE = 5e-3  # the documented training tolerance (docs/parallelism.md)


def _model(fuse_qkv: bool, sequence_parallel: bool, recipe: str) -> torch.nn.Module:
    config = copy.deepcopy(titan_llama3(fuse_qkv).config)
    config = MXStackConverter.Config(recipe=recipe).build().convert(config)
    set_llama3_sharding_config(config, enable_sp=sequence_parallel)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    model.init_states()
    return model


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _gather_vocab(logits: torch.Tensor, world: int) -> torch.Tensor:
    """torchtitan's head leaves the logits split along the vocabulary (its loss is
    vocabulary-parallel): all-gather them for the comparison."""
    parts = [torch.empty_like(logits) for _ in range(world)]
    dist.all_gather(parts, logits.detach().contiguous())
    return torch.cat(parts, dim=-1)


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def _run(rank: int, world: int, fuse_qkv: bool, sequence_parallel: bool, recipe: str):
    ref = _model(fuse_qkv, sequence_parallel, recipe)
    par = copy.deepcopy(ref)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=world, pp=1, ep=1,
                        world_size=world, spmd_backend="spmd_types")  # fmt: skip
    dims.build_mesh()
    dist_utils.set_spmd_backend("spmd_types")
    par.parallelize(dims)
    mx = [m for m in par.modules() if isinstance(m, TitanMXLinear)]
    assert mx and all(m.weight.shape != (m.out_features, m.in_features) for m in mx), (
        "torchtitan handed the full weights: nothing was sharded"
    )
    context = dist_utils.get_spmd_context(parallel_dims=dims)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    par_opt = torch.optim.SGD(par.parameters(), lr=0.5)
    logits_err, losses = None, []
    for step in range(2):
        tokens, labels = _tokens(step), _tokens(10 + step)
        want = ref(tokens)
        ref_loss = _loss(want, labels)
        with context():
            inputs, _, _ = annotate_input_spmd_types(dims, tokens.clone(), labels.clone(), {})
            local = par(inputs)
        full = _gather_vocab(local, world)
        if step == 0:
            logits_err = ((full - want).abs().max() / want.abs().max()).item()
        # The loss of the gathered logits, backpropagated through this rank's shard:
        # cross entropy's gradient with respect to the local columns.
        full = full.requires_grad_()
        loss = _loss(full, labels)
        (grad,) = torch.autograd.grad(loss, full)
        local.backward(grad.chunk(world, dim=-1)[rank])
        ref_loss.backward()
        ref_opt.step(), par_opt.step()
        ref_opt.zero_grad(), par_opt.zero_grad()
        losses.append(abs(loss.item() - ref_loss.item()))
    return logits_err, max(losses)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")
@pytest.mark.parametrize("recipe", ["mxfp8"])
@pytest.mark.parametrize("sequence_parallel", [True, False], ids=["sp", "no-sp"])
@pytest.mark.parametrize("fuse_qkv", [True, False], ids=["wqkv", "wq-wk-wv"])
def test_torchtitans_own_tp_runs_mx_linears(fuse_qkv, sequence_parallel, recipe):
    results = spawn(_run, 2, fuse_qkv, sequence_parallel, recipe)
    for logits_err, loss_err in results:
        assert logits_err < LOGITS_TOLERANCE, results
        assert loss_err < LOSS_TOLERANCE, results
