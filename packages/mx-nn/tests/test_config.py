import dataclasses

import pytest

from mx_nn import MXLinearConfig, MXRecipe


def test_frozen_keyword_only_and_documented_fields():
    c = MXLinearConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.block_size = 16
    with pytest.raises(TypeError):
        MXLinearConfig("fp8_e4m3")  # keyword-only
    assert dataclasses.fields(c)


@pytest.mark.parametrize(
    "recipe, fields",
    [
        ("mxfp8", dict(input_fmt="fp8_e4m3", grad_output_fmt="fp8_e4m3", scale_mode="rceil")),
        ("mxfp8_floor", dict(scale_mode="floor")),
        ("mxfp8_e5m2_grads", dict(input_fmt="fp8_e4m3", grad_output_fmt="fp8_e5m2")),
        ("mxfp8_hp_wgrad", dict(hp_weight_grad=True)),
        ("mxfp6", dict(input_fmt="fp6_e2m3", weight_fmt="fp6_e2m3", grad_output_fmt="fp6_e3m2")),
        ("mxfp4", dict(input_fmt="fp4_e2m1", weight_fmt="fp4_e2m1", grad_output_fmt="fp4_e2m1")),
    ],
)
def test_recipes(recipe, fields):
    c = MXLinearConfig.from_recipe(recipe)
    assert c == MXLinearConfig.from_recipe(MXRecipe(recipe))
    for name, value in fields.items():
        assert getattr(c, name) == value


def test_recipe_overrides_and_derived_properties():
    c = MXLinearConfig.from_recipe("mxfp8", gemm_backend="emulated", scale_mode="FLOOR".lower())
    assert c.gemm_backend == "emulated" and c.scale_mode_name == "floor"
    assert MXLinearConfig().needs_colwise_input
    assert not MXLinearConfig.from_recipe("mxfp8_hp_wgrad").needs_colwise_input


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(input_fmt="fp8"), ValueError, "input_fmt='fp8' is not an MX element format"),
        (dict(grad_output_fmt="int4"), ValueError, "grad_output_fmt='int4'"),
        (dict(scale_mode="nearest"), ValueError, "scale_mode='nearest' is not a scale mode"),
        (dict(block_size=0), ValueError, "block_size=0 must be a positive multiple of 2"),
        (dict(block_size=32.0), TypeError, "block_size must be an int"),
        (dict(gemm_backend="cudnn"), ValueError, "gemm_backend='cudnn' is not one of"),
        (dict(cast_backend="cuda"), ValueError, "cast_backend='cuda' is not one of"),
        (dict(hp_weight_grad=1), TypeError, "hp_weight_grad must be a bool"),
        (dict(compute_path="bf16"), ValueError, "compute_path='bf16' is not one of auto, mx"),
        (
            dict(compute_path="fake_quant", save_mx_activations=True),
            ValueError,
            "keeps no MX casts",
        ),
    ],
)
def test_bad_configs(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        MXLinearConfig(**kwargs)


def test_unknown_recipe_lists_the_recipes():
    with pytest.raises(ValueError, match="recipe='fp8' is not a recipe; allowed: mxfp8, "):
        MXLinearConfig.from_recipe("fp8")
