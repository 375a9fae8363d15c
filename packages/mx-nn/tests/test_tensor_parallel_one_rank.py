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

import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))  # the spawned rank imports it by name
from tp_block import PATHS, _config, one_rank_results  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")


def _differences(mesh, config, sp_norms: bool, compiled: bool) -> set[str]:
    """Names of the results (out, grad_input, parameter grads) of the parallelized
    block that are not bit-identical to the plain block's."""
    named = one_rank_results(mesh, config, "cpu", sp_norms, compiled)
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
