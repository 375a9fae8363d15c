"""Layers that read one input (q/k/v, gate/up) share its casts: eager through
mx_nn.cast_cache, compiled through the compiler's common-subexpression elimination."""

import pytest
import torch
from torch import nn

import mx_nn
from mx_kernels.testing import counting_casts
from mx_nn.cast_cache import cast_shared, clear_cast_cache

PATHS = ["fake_quant", "mx"]


def _layers(path: str, n: int = 3) -> nn.ModuleList:
    torch.manual_seed(0)
    config = mx_nn.MXLinearConfig(compute_path=path)
    return nn.ModuleList(
        mx_nn.MXLinear(128, 64, bias=False, config=config, dtype=torch.bfloat16) for _ in range(n)
    )


def _step(layers, x):
    x = x.detach().requires_grad_()
    y = sum((layer(x).float() ** 2).sum() for layer in layers)
    y.backward()
    return y.detach(), x.grad, [layer.weight.grad for layer in layers]


@pytest.fixture
def casts():
    """The casts run (op name, input shape), however reached (mx_kernels.testing)."""
    with counting_casts() as calls:
        yield calls


def _count(calls, names, shape):
    """Casts run per op in ``names`` on inputs of ``shape``."""
    return {n: sum(1 for op, s in calls if op == n and s == shape) for n in names}


@pytest.mark.parametrize("path", PATHS)
def test_shared_input_is_cast_once_per_orientation_with_the_same_results(path, monkeypatch, casts):
    layers = _layers(path)
    x = torch.randn(2, 48, 128, dtype=torch.bfloat16)  # [96, 128]: no weight or dY is
    with monkeypatch.context() as m:  # every layer casts for itself
        m.setattr("mx_nn.layer_casts.cast_shared", lambda site, cast, x, *a, **k: cast(x, *a, **k))
        m.setattr("mx_nn.fused_casts.cast_shared_plan", lambda site, plan, x: plan(x))
        want = _step(layers, x)
    both = "fake_quantize_both" if path == "fake_quant" else "quantize_both"
    assert _count(casts, [both], (96, 128))[both] == 3  # unshared: once per layer
    for layer in layers:
        layer.weight.grad = None
    # Either path casts x both ways in forward (one read), once for the three layers.
    prefix = "fake_" if path == "fake_quant" else ""
    once = {f"{prefix}quantize_{way}": int(way == "both") for way in ("both", "rowwise", "colwise")}
    clear_cast_cache()
    casts.clear()
    got = _step(layers, x)
    assert _count(casts, once, (96, 128)) == once
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for gw, want_gw in zip(got[2], want[2], strict=True):
        assert torch.equal(gw, want_gw)


def test_a_changed_or_different_tensor_is_cast_again():
    calls = []

    def cast(x, scale):
        calls.append(1)
        return x * scale

    clear_cast_cache()
    x = torch.randn(4, 32)
    first = cast_shared("site", cast, x, 2.0)
    assert cast_shared("site", cast, x, 2.0) is first and len(calls) == 1
    assert cast_shared("site", cast, x, 3.0) is not first  # other arguments
    x.add_(1.0)  # an in-place change bumps the version counter
    assert torch.equal(cast_shared("site", cast, x, 3.0), x * 3.0)
    assert torch.equal(cast_shared("site", cast, x.clone(), 3.0), x * 3.0)
    assert torch.equal(cast_shared("site", cast, x[1:], 3.0), x[1:] * 3.0)  # another view
    assert len(calls) == 5
    clear_cast_cache()


def test_compiled_layers_sharing_an_input_hold_one_cast_per_orientation():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    layers = _layers("fake_quant")
    graphs = []

    def record(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return make_boxed_func(gm)

    def backend(gm, example_inputs):
        # Inductor's partitioner, which runs the common-subexpression elimination.
        return aot_module_simplified(
            gm, example_inputs, fw_compiler=record, bw_compiler=record,
            partition_fn=min_cut_rematerialization_partition,
        )  # fmt: skip

    x = torch.randn(64, 128, dtype=torch.bfloat16, requires_grad=True)
    loss = torch.compile(lambda x: sum((layer(x).float() ** 2).sum() for layer in layers),
                         backend=backend, fullgraph=True)  # fmt: skip
    loss(x).backward()
    assert len(graphs) == 2  # forward, backward
    ops = graphs[0] + graphs[1]
    # x's cast (both ways, in forward) once for the three layers; three weights and
    # three dY through the inline overload (on CPU an op: the CUDA kernel it becomes on
    # a GPU is not merged); the partitioner may recompute weight casts rather than save
    # them.
    assert not [op for op in ops if "fake_quantize_rowwise" in op or "colwise" in op]
    assert ops.count("mx.fake_quantize_both.default") == 1
    assert ops.count("mx.fake_quantize_both.inline") in (6, 9)


@pytest.mark.parametrize("path", PATHS)
def test_reused_weight_casts_until_a_step_or_a_load_changes_the_weight(path, casts):
    torch.manual_seed(0)
    config = mx_nn.MXLinearConfig(compute_path=path, reuse_weight_casts=True)
    layer = mx_nn.MXLinear(128, 64, bias=False, config=config, dtype=torch.bfloat16)
    plain = mx_nn.MXLinear.from_linear(layer, mx_nn.MXLinearConfig(compute_path=path))
    name = "fake_quantize_both" if path == "fake_quant" else "quantize_both"
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    clear_cast_cache()
    casts.clear()

    def weight_casts():  # the weight's casts only
        return _count(casts, [name], (64, 128))[name]

    xs = [torch.randn(32, 128, dtype=torch.bfloat16) for _ in range(3)]
    for x in xs:  # three micro-batches: the weight's casts are made once
        layer(x).sum().backward()
    assert weight_casts() == 1
    for change in (
        opt.step,  # an in-place update: cast again, and the output follows the new weight
        lambda: layer.load_state_dict({"weight": torch.randn(64, 128, dtype=torch.bfloat16)}),
    ):
        change()
        with torch.no_grad():
            want = plain(xs[0])  # never reuses: casts the weight as it is now
            before = weight_casts()
            assert torch.equal(layer(xs[0]), want)
            assert weight_casts() == before + 1
    clear_cast_cache()


@pytest.mark.parametrize("frozen", [False, True], ids=["no_grad", "frozen weight"])
def test_forward_casts_x_along_m_only_when_backward_computes_dw(frozen, casts):
    layers = _layers("fake_quant", n=1)
    x = torch.randn(96, 128, dtype=torch.bfloat16, requires_grad=True)
    names = ["fake_quantize_both", "fake_quantize_rowwise", "fake_quantize_colwise"]
    clear_cast_cache()
    casts.clear()
    if frozen:  # dX only: x along K in forward, nothing along M
        layers[0].weight.requires_grad_(False)
        layers[0](x).sum().backward()
        assert x.grad is not None and layers[0].weight.grad is None
    else:
        with torch.no_grad():
            layers[0](x)
    assert _count(casts, names, (96, 128)) == {"fake_quantize_both": 0, "fake_quantize_rowwise": 1,
                     "fake_quantize_colwise": 0}  # fmt: skip
    clear_cast_cache()
