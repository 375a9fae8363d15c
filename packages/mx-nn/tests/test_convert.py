import logging

import pytest
import torch
from torch import nn

import mx_nn
from mx_nn import MXLinear
from mx_nn.convert import convertible


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mx_nn"]


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 128),
        nn.ReLU(),
        nn.Sequential(nn.Linear(128, 96, bias=False), nn.Linear(96, 10)),
    ).to(torch.bfloat16)


def test_swaps_in_place_keeping_parameters_and_logs_skips(caplog):
    model = _model()
    params = {name: p for name, p in model.named_parameters()}
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        out = mx_nn.convert(model, "mxfp8")
    assert out is model
    assert isinstance(model[0], MXLinear) and isinstance(model[2][0], MXLinear)
    assert type(model[2][1]) is nn.Linear  # 10 outputs: not a multiple of 32
    assert _messages(caplog) == [
        "mx_nn.convert: 2.1 left alone: features not multiples of the block size (in_features=96, "
        "out_features=10, block size 32)",
        "mx_nn.convert: 2 of 3 linears converted to MX (mxfp8); 1 left alone (see above)",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records)
    assert model[2][0].fqn == "2.0" and "MXLinear '2.0' (in_features=128" in model[2][0].layer_name
    for name, p in model.named_parameters():
        assert p is params[name]


def test_state_dict_round_trip_bf16_mx_bf16():
    plain = _model()
    sd = plain.state_dict()
    mx_model = mx_nn.convert(_model())
    mx_model.load_state_dict(sd)
    sd_mx = mx_model.state_dict()
    assert list(sd_mx) == list(sd)
    assert all(sd_mx[k].dtype == sd[k].dtype and torch.equal(sd_mx[k], sd[k]) for k in sd)
    back = _model()
    back.load_state_dict(sd_mx)
    assert all(torch.equal(back.state_dict()[k], sd[k]) for k in sd)


def test_converting_twice_is_a_no_op_and_filter_fn_selects():
    model = mx_nn.convert(_model(), filter_fn=lambda module, fqn: fqn != "0")
    assert type(model[0]) is nn.Linear and isinstance(model[2][0], MXLinear)
    first = model[2][0]
    mx_nn.convert(model, filter_fn=lambda module, fqn: fqn != "0")
    assert model[2][0] is first


def test_root_linear_and_config_objects():
    config = mx_nn.MXLinearConfig.from_recipe("mxfp8_floor")
    lin = nn.Linear(64, 64)
    new = mx_nn.convert(lin, config)
    assert isinstance(new, MXLinear) and new.config is config and new.weight is lin.weight


def _snapshot(model: nn.Module) -> tuple:
    """Module types by fqn and the state_dict, to compare a model before and after."""
    types = [(fqn, type(m)) for fqn, m in model.named_modules()]
    return types, {k: v.clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, snapshot: tuple) -> bool:
    types, sd = _snapshot(model)
    return types == snapshot[0] and all(torch.equal(sd[k], snapshot[1][k]) for k in sd)


@pytest.mark.parametrize("model", ["hello", None, 3, torch.zeros(2)])
def test_model_not_a_module_is_a_type_error(model):
    with pytest.raises(
        TypeError, match=r"model must be a torch.nn.Module, got .*\((str|NoneType|int|Tensor)\)"
    ):
        mx_nn.convert(model)


@pytest.mark.parametrize("recipe", [8, None, ("mxfp8",), mx_nn.MXLinearConfig])
def test_recipe_of_another_type_is_a_type_error(recipe):
    model = _model()
    before = _snapshot(model)
    with pytest.raises(TypeError, match="recipe_or_config must be a recipe name .* got "):
        mx_nn.convert(model, recipe)
    assert _unchanged(model, before)


def test_unknown_recipe_lists_the_recipes():
    with pytest.raises(ValueError, match="recipe='mxfp9' is not a recipe; allowed: mxfp8, "):
        mx_nn.convert(_model(), "mxfp9")


def test_filter_fn_not_callable_or_not_returning_a_bool_is_refused_before_any_swap():
    model = _model()
    before = _snapshot(model)
    with pytest.raises(TypeError, match="filter_fn must be a callable .* got '0'"):
        mx_nn.convert(model, filter_fn="0")
    # A filter that forgets to return would keep every layer without a word.
    with pytest.raises(TypeError, match="filter_fn must return a bool, returned None for '0'"):
        mx_nn.convert(model, filter_fn=lambda module, fqn: None)
    assert _unchanged(model, before)


def test_converting_again_with_another_config_is_refused_naming_layers_and_configs():
    model = mx_nn.convert(_model(), "mxfp8")
    first = model[0]
    before = _snapshot(model)
    with pytest.raises(ValueError) as info:
        mx_nn.convert(model, "mxfp8_floor")
    msg = str(info.value)
    assert "2 layer(s) are already MXLinear with another config" in msg
    assert "'0', '2.0' have MXLinearConfig(" in msg
    assert "scale_mode='rceil' (requested 'floor')" in msg
    assert "requested MXLinearConfig(" in msg and "scale_mode='floor'" in msg
    assert _unchanged(model, before) and model[0] is first
    assert model[0].config == mx_nn.MXLinearConfig.from_recipe("mxfp8")
    # The same config again (as a recipe or as an equal object) changes nothing.
    mx_nn.convert(model, "mxfp8")
    mx_nn.convert(model, mx_nn.MXLinearConfig())
    assert model[0] is first and _unchanged(model, before)


def test_converting_again_leaves_out_the_layers_filter_fn_keeps():
    model = mx_nn.convert(_model(), "mxfp8", filter_fn=lambda module, fqn: fqn != "0")
    first = model[2][0]
    mx_nn.convert(model, "mxfp4", filter_fn=lambda module, fqn: fqn != "2.0")
    assert model[0].config == mx_nn.MXLinearConfig.from_recipe("mxfp4")
    assert model[2][0] is first and first.config == mx_nn.MXLinearConfig.from_recipe("mxfp8")


def test_refused_root_mxlinear_of_another_config():
    layer = mx_nn.convert(nn.Linear(64, 64), "mxfp8")
    with pytest.raises(ValueError, match="'<root>' have MXLinearConfig"):
        mx_nn.convert(layer, "mxfp6")
    assert mx_nn.convert(layer, "mxfp8") is layer


def test_linear_with_hooks_is_refused_before_any_swap():
    model = _model()
    model[2][0].register_forward_hook(lambda module, args, out: out * 2)
    before = _snapshot(model)
    with pytest.raises(ValueError, match="cannot swap 2.0: it has forward hooks"):
        mx_nn.convert(model)
    assert _unchanged(model, before)  # model[0] (no hooks) was not swapped either
    mx_nn.convert(model, filter_fn=lambda module, fqn: fqn != "2.0")
    assert isinstance(model[0], MXLinear) and type(model[2][0]) is nn.Linear


def test_a_linear_reached_twice_becomes_one_mxlinear():
    shared = nn.Linear(64, 64)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    mx_nn.convert(model)
    assert isinstance(model[0], MXLinear) and model[0] is model[2]


class _Plain(nn.Linear):
    """A subclass that adds a method and an attribute, but keeps nn.Linear's forward."""

    tag = "plain"

    def describe(self) -> str:
        return f"{self.in_features}->{self.out_features}"


class _Doubled(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


class _DoubledAgain(_Doubled):
    """Overrides forward through its parent, not itself."""


def test_subclass_with_nn_linears_forward_is_converted_sharing_its_parameters(caplog):
    torch.manual_seed(0)
    plain = nn.Linear(64, 96)
    sub = _Plain(64, 96)
    sub.load_state_dict(plain.state_dict())
    sub.extra = 1.0
    weight, bias = sub.weight, sub.bias
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        model = mx_nn.convert(nn.Sequential(sub))
    new = model[0]
    assert type(new) is MXLinear and new.weight is weight and new.bias is bias
    # A plain MXLinear: the subclass's attributes and methods stay behind.
    assert not hasattr(new, "describe") and not hasattr(new, "extra")
    assert _messages(caplog) == [
        f"mx_nn.convert: 1 {__name__}._Plain layer(s) became plain MXLinear, without that class's "
        "other attributes and methods (initialise weights before convert)",
        "mx_nn.convert: 1 of 1 linears converted to MX (mxfp8); 0 left alone",
    ]
    x = torch.randn(4, 64)
    assert torch.equal(new(x), MXLinear.from_linear(plain)(x))


@pytest.mark.parametrize("cls", [_Doubled, _DoubledAgain])
def test_subclass_overriding_forward_is_left_alone_and_named(cls, caplog):
    model = nn.Sequential(nn.Linear(64, 64), cls(64, 64))
    layer = model[1]
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        mx_nn.convert(model)
    assert isinstance(model[0], MXLinear) and model[1] is layer
    assert _messages(caplog) == [
        f"mx_nn.convert: 1 left alone: overrides forward ({cls.__qualname__})",
        "mx_nn.convert: 1 of 2 linears converted to MX (mxfp8); 1 left alone (see above)",
    ]
    assert not convertible(layer, mx_nn.MXLinearConfig())


def test_forward_set_on_the_instance_or_extra_state_is_left_alone(caplog):
    from torch.nn.utils import parametrize

    wrapped, extra, parametrized = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64)
    wrapped.forward = lambda x: nn.Linear.forward(wrapped, x) + 1  # as wrapping frameworks do
    extra.register_buffer("amax", torch.zeros(()))
    parametrize.register_parametrization(parametrized, "weight", nn.Identity())
    model = nn.Sequential(wrapped, extra, parametrized)
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        mx_nn.convert(model)
    assert model[0] is wrapped and model[1] is extra and model[2] is parametrized
    assert _messages(caplog) == [
        "mx_nn.convert: 0 left alone: overrides forward (set on the Linear instance)",
        "mx_nn.convert: 1 left alone: holds more than weight and bias (amax)",
        "mx_nn.convert: 2 left alone: holds more than weight and bias (parametrizations)",
        "mx_nn.convert: 0 of 3 linears converted to MX (mxfp8); 3 left alone (see above)",
    ]


def test_multihead_attention_out_proj_is_left_alone(caplog):
    """nn.MultiheadAttention reads out_proj.weight and never calls out_proj: an MXLinear
    there would be reported as MX and still compute in high precision."""
    model = nn.Sequential(nn.MultiheadAttention(64, 4), nn.Linear(64, 64))
    out_proj = model[0].out_proj
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        mx_nn.convert(model)
    assert model[0].out_proj is out_proj and isinstance(model[1], mx_nn.MXLinear)
    assert _messages(caplog) == [
        "mx_nn.convert: 0.out_proj left alone: never called (nn.MultiheadAttention reads "
        "its weight directly)",
        "mx_nn.convert: 1 of 2 linears converted to MX (mxfp8); 1 left alone (see above)",
    ]


def test_filter_fn_and_the_summary_count_each_linear_once(caplog):
    shared = nn.Linear(64, 64)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(64, 32), nn.Linear(64, 64))
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        mx_nn.convert(model, "mxfp8_floor", filter_fn=lambda module, fqn: fqn != "4")
    assert _messages(caplog) == [
        "mx_nn.convert: 4 left alone: filter_fn",
        "mx_nn.convert: 2 of 3 linears converted to MX (mxfp8_floor); 1 left alone (see above)",
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        mx_nn.convert(model, mx_nn.MXLinearConfig.from_recipe("mxfp8_floor"))
    # A config object equal to a recipe's is named by the recipe.
    assert _messages(caplog) == [
        "mx_nn.convert: 3 of 3 linears converted to MX (mxfp8_floor), 2 of them before this "
        "call; 0 left alone",
    ]


def test_a_config_of_no_recipe_is_named_by_the_nearest_recipe_and_its_changes(caplog):
    config = mx_nn.MXLinearConfig(weight_fmt="fp4_e2m1", hp_weight_grad=True)
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        mx_nn.convert(nn.Linear(64, 64), config)
    assert _messages(caplog) == [
        "mx_nn.convert: 1 of 1 linears converted to MX (mxfp8_hp_wgrad, weight_fmt='fp4_e2m1'); "
        "0 left alone",
    ]


def test_a_refused_call_logs_nothing(caplog):
    model = mx_nn.convert(_model(), "mxfp8")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mx_nn"), pytest.raises(ValueError):
        mx_nn.convert(model, "mxfp4")
    assert _messages(caplog) == []


def test_convertible_says_what_convert_would_swap():
    config = mx_nn.MXLinearConfig()
    assert convertible(nn.Linear(64, 64), config) and convertible(_Plain(64, 32), config)
    assert not convertible(_Doubled(64, 64), config)
    assert not convertible(nn.Linear(64, 10), config)
    assert not convertible(MXLinear(64, 64), config) and not convertible(nn.ReLU(), config)
