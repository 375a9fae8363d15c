"""Layers that read one input (q/k/v, gate/up) share its casts: eager within one call of
their parent module (mx_nn.casts.scopes), compiled through the compiler's
common-subexpression elimination. A shared cast never outlives that call."""

import gc
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import mx_nn
import mx_nn.casts.scopes as cast_cache
from mx_kernels.testing import counting_casts

PATHS = ["fake_quant", "mx"]


class QKV(nn.Module):
    """Three linears reading one input, as attention's q, k and v do."""

    def __init__(self, path: str = "mx", config: mx_nn.MXLinearConfig | None = None) -> None:
        super().__init__()
        dim, out = 128, 64
        config = config or mx_nn.MXLinearConfig(compute_path=path)
        self.q, self.k, self.v = (
            mx_nn.MXLinear(dim, out, bias=False, config=config, dtype=torch.bfloat16)
            for _ in range(3)
        )

    def forward(self, x):
        return self.q(x), self.k(x), self.v(x)


def _qkv(path: str) -> QKV:
    torch.manual_seed(0)
    model = QKV(path)
    assert mx_nn.share_input_casts(model) == 1
    return model


def _step(model, x):
    x = x.detach().requires_grad_()
    y = sum((y.float() ** 2).sum() for y in model(x))
    y.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return y.detach(), x.grad, grads


@pytest.fixture
def casts():
    """The casts run (op name, input shape), however reached (mx_kernels.testing)."""
    with counting_casts() as calls:
        yield calls


def _count(calls, names, shape):
    """Casts run per op in ``names`` on inputs of ``shape``."""
    return {n: sum(1 for op, s in calls if op == n and s == shape) for n in names}


def _assert_equal(got, want):
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for g, w in zip(got[2], want[2], strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("path", PATHS)
def test_shared_input_is_cast_once_per_orientation_with_the_same_results(path, casts):
    model = _qkv(path)
    x = torch.randn(2, 48, 128, dtype=torch.bfloat16)  # [96, 128]: no weight or dY is
    unscoped = QKV(path)  # the same layers without a scope: each casts for itself
    unscoped.load_state_dict(model.state_dict())
    want = _step(unscoped, x)
    # Either path casts x both ways in forward, in one read: the MX path to codes; the
    # fused path to values along K and, kept for backward, to MX codes along M
    # (save_mx_activations)
    x_casts = ["fake_quantize_rowwise_quantize_colwise" if path == "fake_quant" else
               "quantize_both"]  # fmt: skip
    names = [*x_casts, "fake_quantize_both", "fake_quantize_colwise", "quantize_rowwise",
             "fake_quantize_rowwise", "quantize_colwise"]  # fmt: skip
    assert _count(casts, names, (96, 128)) == {n: 3 * (n in x_casts) for n in names}
    casts.clear()
    got = _step(model, x)
    # once for the three layers
    assert _count(casts, names, (96, 128)) == {n: int(n in x_casts) for n in names}
    _assert_equal(got, want)
    assert cast_cache._STATE.scopes == []  # closed with the call


@pytest.mark.parametrize("path", PATHS)
def test_an_input_written_without_a_version_bump_is_cast_again(path):
    """The reported defect: a numpy-backed input rewritten between two calls kept its
    version counter, and the old global cache returned the first batch's output."""
    torch.manual_seed(0)
    ref = nn.Linear(64, 32)
    head = mx_nn.convert(nn.Linear(64, 32), mx_nn.MXLinearConfig(compute_path=path))
    head.load_state_dict(ref.state_dict())
    pair = mx_nn.convert(nn.ModuleDict({"a": nn.Linear(64, 32), "b": nn.Linear(64, 32)}))
    assert mx_nn.share_input_casts(pair) == 1
    arr = np.zeros((8, 64), np.float32)
    x = torch.from_numpy(arr)
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for layer in (head, pair["a"], pair["b"]):
            outs, wants = [], []
            for _ in range(2):
                arr[:] = rng.standard_normal((8, 64))
                assert x._version == 0  # numpy writes are not seen by torch
                with mx_nn.shared_casts():  # a scope per call, as a parent module opens
                    outs.append(layer(x).clone())
                wants.append(layer(x.clone()))  # a fresh tensor: nothing to share
            assert not torch.equal(outs[0], outs[1])
            for out, want in zip(outs, wants, strict=True):
                assert torch.equal(out, want)


def test_a_changed_or_different_tensor_is_cast_again_inside_one_scope():
    calls = []

    def cast(x, scale):
        calls.append(1)
        return x * scale

    x = torch.randn(4, 32)
    assert cast_cache.cast_shared("site", cast, x, 2.0) is not None and len(calls) == 1
    assert len(calls) == 1 and cast_cache.cast_shared("site", cast, x, 2.0) is not None
    assert len(calls) == 2  # outside a scope every call casts
    with mx_nn.shared_casts():
        first = cast_cache.cast_shared("site", cast, x, 2.0)
        assert cast_cache.cast_shared("site", cast, x, 2.0) is first and len(calls) == 3
        assert cast_cache.cast_shared("site", cast, x, 3.0) is not first  # other arguments
        x.add_(1.0)  # an in-place change bumps the version counter
        assert torch.equal(cast_cache.cast_shared("site", cast, x, 3.0), x * 3.0)
        assert torch.equal(cast_cache.cast_shared("site", cast, x.clone(), 3.0), x * 3.0)
        assert torch.equal(cast_cache.cast_shared("site", cast, x[1:], 3.0), x[1:] * 3.0)
        assert len(calls) == 7
    assert cast_cache._STATE.scopes == []


def test_nothing_outlives_the_call_and_a_raising_forward_closes_its_scope():
    model = _qkv("fake_quant")
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    ref = weakref.ref(x)
    with torch.no_grad():
        model(x)
    del x
    gc.collect()
    assert ref() is None  # no cast or input kept after the call
    with pytest.raises(ValueError, match="in_features=128"):
        model(torch.randn(64, 96, dtype=torch.bfloat16))
    assert cast_cache._STATE.scopes == []


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp8_hp_wgrad", "mxfp6", "mxfp4"])
def test_inference_mode(recipe, path):
    """Inference tensors track no version counter: MXLinear casts them per call, with
    the same outputs as under no_grad, inside the context and outside it."""
    if path == "fake_quant" and recipe == "mxfp6":
        path = "mx"
    config = mx_nn.MXLinearConfig.from_recipe(recipe, compute_path=path)
    torch.manual_seed(0)
    model = QKV(config=config)
    mx_nn.share_input_casts(model)
    x = torch.randn(2, 32, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
    with torch.inference_mode():
        got = model(x)
        x_inf = x.clone()  # an inference tensor
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    with torch.no_grad():  # an inference tensor used outside the context
        for g, w in zip(model(x_inf), want, strict=True):
            assert torch.equal(g, w)


@pytest.mark.parametrize("path", PATHS)
def test_kept_weight_casts_inside_keep_weight_casts_only(path, casts):
    torch.manual_seed(0)
    config = mx_nn.MXLinearConfig(compute_path=path)
    layer = mx_nn.MXLinear(128, 64, bias=False, config=config, dtype=torch.bfloat16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)

    def weight_casts():  # the weight's casts only
        return sum(1 for _, shape in casts if shape == (64, 128))

    # outside keep_weight_casts each call casts W once: both ways (MX path) or along K
    # (fused path, whose cast along N, made in backward, is for dX: x needs no grad here)
    xs = [torch.randn(32, 128, dtype=torch.bfloat16) for _ in range(3)]
    with mx_nn.keep_weight_casts():
        for x in xs:  # three micro-batches: the weight's casts are made once
            layer(x).sum().backward()
        assert weight_casts() == 1
        with torch.no_grad():
            layer.weight.mul_(0.5)  # an in-place write inside: cast again
            plain = mx_nn.MXLinear(128, 64, bias=False, config=config, dtype=torch.bfloat16)
            plain.weight.copy_(layer.weight)  # another Parameter: nothing kept for it
            assert torch.equal(layer(xs[0]), plain(xs[0]))
        assert weight_casts() == 3  # after the write, and the other layer's
    opt.step()
    before = weight_casts()
    for x in xs:  # outside: every call casts
        layer(x).sum().backward()
    assert weight_casts() == before + 3
    assert cast_cache._STATE.weights is None


def test_reuse_weight_casts_is_deprecated():
    with pytest.warns(FutureWarning, match="keep_weight_casts"):
        mx_nn.MXLinearConfig(reuse_weight_casts=True)


def test_compiled_layers_sharing_an_input_hold_one_cast_per_orientation():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    model = _qkv("fake_quant")
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
    loss = torch.compile(lambda x: sum((y.float() ** 2).sum() for y in model(x)),
                         backend=backend, fullgraph=True)  # fmt: skip
    loss(x).backward()
    assert len(graphs) == 2  # forward, backward
    ops = graphs[0] + graphs[1]
    # x's cast (along K to values and along M to codes, in forward, one op) once for the
    # three layers, and the decode of its codes in backward once too; three weights
    # (along K in forward, along N in backward: save_mx_activations) and three dY through
    # the inline overload (on CPU an op: the CUDA kernel it becomes on a GPU is not
    # merged); the partitioner may recompute weight casts rather than save them.
    assert ops.count("mx.fake_quantize_rowwise_quantize_colwise.default") == 1
    assert "mx.fake_quantize_rowwise.default" not in ops
    assert "mx.quantize_colwise.default" not in ops
    assert ops.count("mx.dequantize_rowwise.default") == 1
    assert ops.count("mx.fake_quantize_rowwise.inline") in (3, 6)
    assert ops.count("mx.fake_quantize_colwise.inline") == 3
    assert ops.count("mx.fake_quantize_both.inline") == 3
    assert not {
        "mx.quantize_both.default",
        "mx.quantize_rowwise.default",
        "mx.fake_quantize_both.default",
    } & set(ops)
    assert cast_cache._STATE.scopes == []


@pytest.mark.parametrize("frozen", [False, True], ids=["no_grad", "frozen weight"])
def test_forward_casts_x_along_m_only_when_backward_computes_dw(frozen, casts):
    layer = _qkv("fake_quant").q
    x = torch.randn(96, 128, dtype=torch.bfloat16, requires_grad=True)
    names = ["fake_quantize_both", "fake_quantize_rowwise", "fake_quantize_colwise"]
    if frozen:  # dX only: x along K in forward, nothing along M
        layer.weight.requires_grad_(False)
        layer(x).sum().backward()
        assert x.grad is not None and layer.weight.grad is None
    else:
        with torch.no_grad():
            layer(x)
    assert _count(casts, names, (96, 128)) == {"fake_quantize_both": 0, "fake_quantize_rowwise": 1,
                     "fake_quantize_colwise": 0}  # fmt: skip
