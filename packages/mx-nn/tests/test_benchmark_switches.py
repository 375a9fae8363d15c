"""The public switches the benchmarks use: ``mx_nn.dtensor.dispatch_per_op`` (each mx op
through DTensor instead of one op on the local shards: the same bits),
``mx_nn.linear.route_bf16_gemms`` (the fused path's GEMMs through a stand-in) and
``mx_nn.apply_tp(..., include_single_rank=True)`` (the plan applied on a one-rank mesh)."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))  # the spawned rank imports it by name

import mx_kernels  # noqa: E402
import mx_nn  # noqa: E402
from mx_nn.dtensor import dispatch_per_op, local_shards_enabled  # noqa: E402
from mx_nn.linear import route_bf16_gemms  # noqa: E402


def test_dispatch_per_op_nests_and_restores_on_exit_and_on_error():
    assert local_shards_enabled()
    with dispatch_per_op():
        assert not local_shards_enabled()
        with dispatch_per_op():
            assert not local_shards_enabled()
        assert not local_shards_enabled()
    assert local_shards_enabled()
    with pytest.raises(RuntimeError, match="inside"), dispatch_per_op():
        raise RuntimeError("inside")
    assert local_shards_enabled()


def _step(layer: mx_nn.MXLinear) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, 64, generator=g).requires_grad_()
    y = layer(x)
    y.backward(torch.randn(y.shape, generator=g))
    grads = [x.grad, layer.weight.grad]
    layer.weight.grad = None
    return [y.detach(), *grads]


def test_route_bf16_gemms_calls_the_stand_in_for_each_gemm():
    torch.manual_seed(0)
    config = mx_nn.MXLinearConfig(compute_path="fake_quant")
    layer = mx_nn.MXLinear(64, 96, bias=False, config=config)
    calls = []

    def stand_in(a, b, out_dtype):
        calls.append((tuple(a.shape), tuple(b.shape), out_dtype))
        return mx_kernels.bf16_gemm(a, b, out_dtype)

    plain = _step(layer)
    with route_bf16_gemms(stand_in):
        routed = _step(layer)
    # forward Y = X W^T, backward dW = dY^T X and dX = dY W, with M = 64 tokens
    assert calls == [((64, 64), (64, 96), torch.float32), ((96, 64), (64, 64), torch.float32),
                     ((64, 96), (96, 64), torch.float32)]  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(plain, routed, strict=True))
    _step(layer)
    assert len(calls) == 3  # restored on exit


def test_route_bf16_gemms_refuses_a_non_callable_and_restores_on_error():
    with pytest.raises(TypeError, match="route_bf16_gemms: gemm must be callable, got int"):
        with route_bf16_gemms(3):
            pass
    layer = mx_nn.MXLinear(64, 64, config=mx_nn.MXLinearConfig(compute_path="fake_quant"))

    def failing(a, b, out_dtype):
        raise RuntimeError("stand-in")

    with pytest.raises(RuntimeError, match="stand-in"), route_bf16_gemms(failing):
        _step(layer)
    _step(layer)  # the real GEMM again


def _model() -> torch.nn.Module:
    from mx_nn.models import Llama, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=128,
                         vocab_size=64, max_seq_len=64)  # fmt: skip
    return mx_nn.convert(Llama(config), "mxfp8", filter_fn=lambda _m, fqn: fqn != "output")


def _run(model: torch.nn.Module) -> list[torch.Tensor]:
    """Logits, then every parameter's gradient, as full plain tensors."""
    from torch.distributed.tensor import DTensor

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    tokens = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(2))
    out = model(tokens)
    out.float().square().mean().backward()
    return [full(out).detach(), *(full(p.grad) for p in model.parameters())]


def _one_rank_worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    out = {}
    left_out = mx_nn.apply_tp(_model(), mesh)
    out["default"] = any(isinstance(p, DTensor) for p in left_out.parameters())
    applied = mx_nn.apply_tp(_model(), mesh, mx_comms=False, include_single_rank=True)
    out["weights"] = {
        n: type(m.weight).__name__ for n, m in applied.named_modules()
        if isinstance(m, mx_nn.MXLinear)
    }  # fmt: skip
    plain = _model()
    local = _run(copy.deepcopy(applied))
    with dispatch_per_op():
        dispatched = _run(applied)
    out["local == dispatched"] = [torch.equal(a, b) for a, b in zip(local, dispatched, strict=True)]
    out["local == plain logits"] = torch.equal(local[0], _run(plain)[0])
    tied = _model()
    tied.layers[0].ffn_norm.weight = tied.layers[0].attention_norm.weight
    try:
        mx_nn.apply_tp(tied, mesh, include_single_rank=True)
        out["tied"] = "no error"
    except ValueError as e:
        out["tied"] = str(e)
    try:
        mx_nn.apply_tp(_model(), mesh, include_single_rank=1)
        out["flag"] = "no error"
    except TypeError as e:
        out["flag"] = str(e)
    return out


@functools.cache
def _one_rank() -> dict:
    from mx_dtensor.testing import spawn

    return spawn(_one_rank_worker, 1)[0]


needs_dist = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")


@needs_dist
def test_apply_tp_include_single_rank_gives_dtensor_weights():
    r = _one_rank()
    assert r["default"] is False  # at tp=1 apply_tp leaves tensor parallelism out
    assert len(r["weights"]) == 7 and set(r["weights"].values()) == {"DTensor"}, r["weights"]


@needs_dist
def test_dispatch_per_op_gives_the_same_bits_on_a_one_rank_mesh():
    r = _one_rank()
    assert all(r["local == dispatched"]), r["local == dispatched"]
    assert r["local == plain logits"]


@needs_dist
def test_apply_tp_include_single_rank_refuses_ties_and_non_bools():
    r = _one_rank()
    assert r["tied"].startswith(
        "apply_tp(include_single_rank=True): model ties 'layers.0.attention_norm.weight' and "
        "'layers.0.ffn_norm.weight' (one Parameter)"
    ), r["tied"]
    assert r["flag"] == "include_single_rank must be a bool (True or False), got 1"
