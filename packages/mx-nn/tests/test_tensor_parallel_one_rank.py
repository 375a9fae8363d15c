"""The Llama-style block under torchtitan's plan on a one-rank mesh against the same
block on plain tensors, in bf16: where the arithmetic is the same, bit for bit.

On one rank no collective changes a value, so every difference comes from the order of
operations. Eager, PyTorch's SequenceParallel norms are the one such source: the norm
reads its input through a separate autograd node (``DTensor.from_local``), so the
norm's two gradient contributions (through ``x.pow(2)`` and through ``x * ...``) are
summed before the residual's, where on plain tensors the three arrive at the residual
in another order; bf16 addition is not associative, so the gradients upstream of the
norms (the input's, the attention's) differ in the last bits, for nn.Linear as for
MXLinear. Without SequenceParallel norms the eager block is bit-exact, and compiled
(where the compiler orders the sums the same way in both graphs) it is bit-exact with
them. The H200 check of the same block: ``tools/bench/dtensor_overhead.py``.
"""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))  # the spawned rank imports it by name
from tp_block import DIM, PATHS, Block, _config, _plan  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")

SP_NORMS = ("attention_norm", "ffn_norm")


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    # Parameters the plan leaves out (the norms, without SequenceParallel) stay plain.
    return t.full_tensor() if isinstance(t, DTensor) else t


def _differences(mesh, config, sp_norms: bool, compiled: bool) -> set[str]:
    """Names of the results (out, grad_input, parameter grads) of the parallelized
    block that are not bit-identical to the plain block's."""
    from torch.distributed.tensor.parallel import parallelize_module

    import mx_nn

    torch.manual_seed(0)
    block = Block().to(torch.bfloat16)
    plain = mx_nn.convert(copy.deepcopy(block), config) if config else copy.deepcopy(block)
    tp = mx_nn.convert(copy.deepcopy(block), config) if config else copy.deepcopy(block)
    plan = {k: v for k, v in _plan().items() if sp_norms or k not in SP_NORMS}
    tp = parallelize_module(tp, mesh, plan)
    params, tp_params = dict(plain.named_parameters()), dict(tp.named_parameters())
    if compiled:
        plain, tp = torch.compile(plain, fullgraph=True), torch.compile(tp, fullgraph=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, DIM, generator=g).to(torch.bfloat16)
    grad = torch.randn(2, 64, DIM, generator=g).to(torch.bfloat16)
    results = []
    for module in (plain, tp):
        xx = x.clone().requires_grad_()
        y = module(xx)
        y.backward(grad)
        results.append((y, xx.grad))
    named = {"out": (results[0][0], results[1][0]), "grad_input": (results[0][1], results[1][1])}
    named |= {n: (params[n].grad, _full(p.grad)) for n, p in tp_params.items()}
    return {n for n, (a, b) in named.items() if not torch.equal(a, b)}


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    out = {}
    for path in (None, *PATHS):
        config = _config("mxfp8", path) if path else None
        for sp_norms in (False, True):
            out[(path, sp_norms, False)] = _differences(mesh, config, sp_norms, compiled=False)
        if path:
            out[(path, True, True)] = _differences(mesh, config, True, compiled=True)
    return out


@functools.cache
def _results() -> dict:
    from mx_dtensor.testing import spawn

    return spawn(_worker, 1)[0]


@pytest.mark.parametrize("path", [None, *PATHS], ids=["nn.Linear", *PATHS])
def test_eager_bit_exact_without_sequence_parallel_norms(path):
    assert _results()[(path, False, False)] == set()


@pytest.mark.parametrize("path", PATHS)
def test_eager_differs_only_where_the_nn_linear_block_does(path):
    control = _results()[(None, True, False)]
    assert control, "the SequenceParallel norms no longer change the gradient sums: update"
    assert _results()[(path, True, False)] <= control


@pytest.mark.parametrize("path", PATHS)
def test_compiled_bit_exact(path):
    assert _results()[(path, True, True)] == set()
