import dataclasses
import pickle
import re

import pytest

from mx_core import (
    CastBackend,
    CastSettings,
    ComputePath,
    ElementFormatName,
    MatmulBackend,
    ScaleMode,
    get_format,
)
from mx_nn import MXLinearConfig, MXRecipe
from mx_nn.config import COMPUTE_PATHS


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
        (
            dict(gemm_backend="cudnn"),
            ValueError,
            "gemm_backend='cudnn' is not a matmul backend; allowed: auto, emulated, cublas, triton",
        ),
        (
            dict(cast_backend="cuda"),
            ValueError,
            "cast_backend='cuda' is not a cast backend; allowed: auto, triton, reference",
        ),
        (dict(scale_mode=None), TypeError, "scale_mode must be a scale mode"),
        (dict(hp_weight_grad=1), TypeError, "hp_weight_grad must be a bool"),
        (
            dict(compute_path="bf16"),
            ValueError,
            "compute_path='bf16' is not a compute path; allowed: auto, mx, fake_quant",
        ),
    ],
)
def test_bad_configs(kwargs, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        MXLinearConfig(**kwargs)


def test_unknown_recipe_lists_the_recipes():
    with pytest.raises(ValueError, match="recipe='fp8' is not a recipe; allowed: mxfp8, "):
        MXLinearConfig.from_recipe("fp8")


def test_choices_are_stored_as_enum_members_equal_to_their_strings():
    c = MXLinearConfig(
        input_fmt="fp8_e5m2",
        weight_fmt=ElementFormatName.FP4_E2M1,
        grad_output_fmt=get_format("fp6_e3m2"),
        scale_mode="floor",
        gemm_backend="emulated",
        cast_backend="reference",
        compute_path="fake_quant",
    )
    assert c.input_fmt is ElementFormatName.FP8_E5M2 and c.input_fmt == "fp8_e5m2"
    assert c.weight_fmt is ElementFormatName.FP4_E2M1
    assert c.grad_output_fmt is ElementFormatName.FP6_E3M2
    assert c.scale_mode is ScaleMode.FLOOR and c.scale_mode_name == "floor"
    assert type(c.scale_mode_name) is str
    assert c.gemm_backend is MatmulBackend.EMULATED and c.cast_backend is CastBackend.REFERENCE
    assert c.compute_path is ComputePath.FAKE_QUANT and c.compute_path == "fake_quant"
    # Strings and members give equal configs, with equal hashes; replace() parses too.
    members = MXLinearConfig(input_fmt=ElementFormatName.FP8_E5M2, scale_mode=ScaleMode.RCEIL)
    strings = MXLinearConfig(input_fmt="fp8_e5m2", scale_mode="rceil")
    assert members == strings and hash(members) == hash(strings)
    assert dataclasses.replace(strings, cast_backend="triton").cast_backend is CastBackend.TRITON
    assert pickle.loads(pickle.dumps(c)) == c
    assert COMPUTE_PATHS == ComputePath.choices() == ("auto", "mx", "fake_quant")


def test_repr_shows_the_plain_values():
    assert repr(MXLinearConfig(scale_mode="floor")) == (
        "MXLinearConfig(input_fmt='fp8_e4m3', weight_fmt='fp8_e4m3', "
        "grad_output_fmt='fp8_e4m3', block_size=32, scale_mode='floor', gemm_backend='auto', "
        "cast_backend='auto', hp_weight_grad=False, save_mx_activations=True, "
        "compute_path='auto', reuse_weight_casts=False)"
    )


def test_operand_casts_share_block_size_scale_mode_and_cast_backend():
    c = MXLinearConfig.from_recipe(
        "mxfp8_e5m2_grads", block_size=16, scale_mode="even", cast_backend="reference"
    )
    shared = dict(block_size=16, scale_mode="even", backend="reference")
    assert c.input_cast == CastSettings(fmt="fp8_e4m3", **shared)
    assert c.weight_cast == CastSettings(fmt="fp8_e4m3", **shared)
    assert c.grad_output_cast == CastSettings(fmt="fp8_e5m2", **shared)
    assert c.grad_output_cast.as_kwargs() == {"fmt": "fp8_e5m2", **shared}
    # The GEMM backend is not a cast setting.
    assert c.input_cast == dataclasses.replace(c, gemm_backend="emulated").input_cast
