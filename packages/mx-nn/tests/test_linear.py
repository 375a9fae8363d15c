import copy

import pytest
import torch
from torch import nn

import mx_core
import mx_kernels
import mx_nn
from mx_core.testing import sqnr_db
from mx_nn import MXLinear, MXLinearConfig

M, K, N = 1024, 1024, 2048


def _pair(k=K, n=N, dtype=torch.float32, config=None, bias=True, seed=0):
    torch.manual_seed(seed)
    ref = nn.Linear(k, n, bias=bias, dtype=dtype)
    mx = MXLinear.from_linear(copy.deepcopy(ref), config or MXLinearConfig())
    return ref, mx


def _run(module, x, grad):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(grad)
    return y, x.grad, module.weight.grad, None if module.bias is None else module.bias.grad


@pytest.mark.parametrize("hp_wgrad", [False, True])
def test_numerics_against_high_precision(hp_wgrad):
    config = MXLinearConfig(hp_weight_grad=hp_wgrad)
    ref, mx = _pair(config=config)
    x, grad = torch.randn(M, K), torch.randn(M, N)
    want, got = _run(ref, x, grad), _run(mx, x, grad)
    out, gx, gw, gb = (sqnr_db(w, g) for w, g in zip(want, got, strict=True))
    print(f"SQNR dB: out {out:.1f}, grad_input {gx:.1f}, grad_weight {gw:.1f}, bias {gb:.1f}")
    assert out >= 27 and gx >= 25 and gb >= 40
    assert gw >= (34 if hp_wgrad else 24)


def test_bit_exact_with_hand_composed_casts_and_emulated_gemms():
    ref, mx = _pair(k=128, n=96, bias=False)
    x, grad = torch.randn(64, 128), torch.randn(64, 96)
    y, gx, gw, _ = _run(mx, x, grad)
    w = ref.weight.detach()

    def cast(t):
        q = mx_core.quantize(t.contiguous(), "fp8_e4m3")
        return q.qdata, q.scale

    def mm(a, b, dtype=torch.float32):
        return mx_kernels.scaled_mm(*a, *b, out_dtype=dtype, backend="emulated")

    assert torch.equal(y, mm(cast(x), cast(w)))
    assert torch.equal(gx, mm(cast(grad), cast(w.t())))
    assert torch.equal(gw, mm(cast(grad.t()), cast(x.t())))


@pytest.mark.parametrize("shape", [(64, 128), (2, 32, 128), (2, 3, 16, 128), (128,)], ids=str)
def test_input_ranks(shape):
    ref, mx = _pair(k=128, n=64)
    x = torch.randn(shape)
    grad = torch.randn(*shape[:-1], 64)
    y, gx, gw, gb = _run(mx, x, grad)
    y_ref, gx_ref, _, _ = _run(ref, x, grad)
    assert y.shape == y_ref.shape and gx.shape == x.shape
    assert sqnr_db(y_ref, y) > 25 and sqnr_db(gx_ref, gx) > 25


def test_rows_not_multiple_of_block_size_and_non_contiguous_grad():
    ref, mx = _pair(k=64, n=96)
    x = torch.randn(45, 64)  # 45 tokens: the columnwise casts pad rows with zeros
    grad = torch.randn(96, 45).t()  # non-contiguous grad_output
    got, want = _run(mx, x, grad), _run(ref, x, grad)
    for w, g in zip(want, got, strict=True):
        assert sqnr_db(w, g) > 24


def _saved(module, x) -> list[torch.Tensor]:
    """The tensors autograd keeps from ``module(x)`` for backward."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x.detach().clone().requires_grad_())
    return saved


@pytest.mark.parametrize("hp_wgrad", [False, True])
def test_mx_path_keeps_the_columnwise_cast_of_x_instead_of_x(hp_wgrad):
    _, mx = _pair(k=64, n=96, bias=False, config=MXLinearConfig(hp_weight_grad=hp_wgrad))
    x = torch.randn(40, 64)  # 40 rows: the columnwise cast pads them to 64
    fp32 = [tuple(t.shape) for t in _saved(mx, x) if t.dtype == torch.float32]
    one_byte = [tuple(t.shape) for t in _saved(mx, x) if t.element_size() == 1]
    if hp_wgrad:  # dW in high precision needs X itself
        assert (40, 64) in fp32 and (64, 64) not in one_byte
    else:  # X cast along M (codes [K, M padded], scales) instead of X; W's along N
        assert (40, 64) not in fp32 and sorted(one_byte) == [(64, 2), (64, 3), (64, 64), (64, 96)]


def test_save_mx_activations_gives_identical_gradients():
    ref, plain = _pair(k=64, n=64)
    saving = MXLinear.from_linear(copy.deepcopy(ref), MXLinearConfig(save_mx_activations=True))
    x, grad = torch.randn(40, 64), torch.randn(40, 64)
    for a, b in zip(_run(plain, x, grad), _run(saving, x, grad), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe", ["mxfp8_floor", "mxfp8_e5m2_grads", "mxfp6", "mxfp4"])
def test_other_recipes_run(recipe):
    ref, mx = _pair(k=128, n=64, config=MXLinearConfig.from_recipe(recipe))
    x, grad = torch.randn(32, 128), torch.randn(32, 64)
    y, gx, gw, _ = _run(mx, x, grad)
    y_ref, gx_ref, gw_ref, _ = _run(ref, x, grad)
    floor = 12 if recipe == "mxfp4" else 20
    assert sqnr_db(y_ref, y) > floor and sqnr_db(gw_ref, gw) > floor - 4


def test_bf16_parameters_and_autocast():
    ref, mx = _pair(k=64, n=64, dtype=torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    y, gx, gw, _ = _run(mx, x, torch.randn(32, 64, dtype=torch.bfloat16))
    assert y.dtype == gx.dtype == gw.dtype == torch.bfloat16
    ref32, mx32 = _pair(k=64, n=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mx32(torch.randn(32, 64))
        out_ref = ref32(torch.randn(32, 64))
    assert out.dtype == out_ref.dtype == torch.bfloat16


def test_checkpoint_and_deepcopy():
    _, mx = _pair(k=64, n=64)
    x = torch.randn(32, 64, requires_grad=True)
    y = torch.utils.checkpoint.checkpoint(mx, x, use_reentrant=False)
    y.sum().backward()
    g_ckpt = x.grad.clone()
    x.grad = None
    mx(x).sum().backward()
    assert torch.equal(g_ckpt, x.grad)
    twin = copy.deepcopy(mx)
    assert isinstance(twin, MXLinear) and twin.config == mx.config
    assert twin.weight is not mx.weight and torch.equal(twin.weight, mx.weight)


def test_compiled_mlp_forward_and_backward_match_eager():
    torch.manual_seed(0)
    mlp = nn.Sequential(MXLinear(64, 128), nn.GELU(), MXLinear(128, 64))
    x, grad = torch.randn(32, 64), torch.randn(32, 64)

    def run(module):
        xx = x.clone().requires_grad_()
        y = module(xx)
        y.backward(grad)
        grads = [p.grad.clone() for p in mlp.parameters()]
        mlp.zero_grad()
        return [y, xx.grad, *grads]

    eager = run(mlp)
    torch._dynamo.reset()
    got = run(torch.compile(mlp, fullgraph=True))
    for a, b in zip(eager, got, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_dims_must_be_multiples_of_block_size():
    with pytest.raises(ValueError, match="in_features=48, out_features=64"):
        MXLinear(48, 64)
    with pytest.raises(ValueError, match="block_size=32"):
        MXLinear.from_linear(nn.Linear(64, 40))


@pytest.mark.parametrize(
    ("shape", "dtype", "error", "match"),
    [
        (
            (4, 33),
            torch.float32,
            ValueError,
            r"input of shape \(4, 33\) must be \[\.\.\., in_features=64\]",
        ),
        ((4, 96), torch.float32, ValueError, r"input of shape \(4, 96\)"),
        ((), torch.float32, ValueError, r"input of shape \(\)"),
        ((4, 64), torch.int64, TypeError, "input dtype torch.int64"),
        ((4, 64), torch.float64, TypeError, "input dtype torch.float64"),
    ],
)
def test_bad_input_is_refused_naming_the_layer(shape, dtype, error, match):
    model = mx_nn.convert(nn.Sequential(nn.Linear(64, 64)), "mxfp8")
    x = torch.zeros(shape, dtype=dtype)
    with pytest.raises(error, match=match) as info:
        model(x)
    assert "MXLinear '0' (in_features=64, out_features=64)" in str(info.value)


def test_config_takes_a_recipe_name_or_refuses_other_types():
    assert mx_nn.MXLinear(64, 64, config="mxfp4").config == MXLinearConfig.from_recipe("mxfp4")
    layer = mx_nn.MXLinear.from_linear(nn.Linear(64, 64), config="mxfp8_floor")
    assert layer.config.scale_mode == "floor"
    with pytest.raises(ValueError, match="recipe='hello' is not a recipe"):
        mx_nn.MXLinear(64, 64, config="hello")
    with pytest.raises(
        TypeError, match="config must be an MXLinearConfig or a recipe name, got int 3"
    ):
        mx_nn.MXLinear(64, 64, config=3)
