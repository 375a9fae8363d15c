"""The string enums of mx_core.choices and CastSettings: every string accepted today
parses, errors name the argument, the value and the allowed values, and CastSettings is
a frozen, keyword-only, hashable value."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

import mx_core
from mx_core import (
    FORMAT_NAMES,
    CastBackend,
    CastSettings,
    ComputePath,
    ElementFormatName,
    MatmulBackend,
    ScaleMode,
    get_format,
    get_scale_mode,
)

# The strings each choice accepts today, in the order they are listed.
ACCEPTED = {
    ElementFormatName: ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1"),
    ScaleMode: ("floor", "ceil", "even", "rceil"),
    CastBackend: ("auto", "triton", "reference"),
    MatmulBackend: ("auto", "emulated", "cublas", "triton"),
    ComputePath: ("auto", "mx", "fake_quant"),
}
PARAMS = [(cls, v) for cls, values in ACCEPTED.items() for v in values]


def test_choices_are_the_names_accepted_today():
    for cls, values in ACCEPTED.items():
        assert cls.choices() == values
    assert ElementFormatName.choices() == FORMAT_NAMES


@pytest.mark.parametrize(("cls", "value"), PARAMS, ids=lambda p: getattr(p, "__name__", p))
def test_parse_takes_the_string_and_the_member(cls, value):
    member = cls.parse(value)
    assert type(member) is cls and member.value == value
    assert cls.parse(member) is member
    # A str: equal to, hashed and formatted as its value.
    assert member == value and hash(member) == hash(value)
    assert str(member) == f"{member}" == f"{member:>0}" == value
    assert {value: 1}[member] == 1


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_format_names_and_format_objects(name):
    member = ElementFormatName.parse(get_format(name))
    assert member is ElementFormatName(name)
    assert member.format is get_format(name)
    # mx-core's lookups take the members as they take the strings.
    assert get_format(member) is get_format(name)


def test_scale_mode_is_mx_cores_and_get_scale_mode_is_unchanged():
    assert mx_core.ScaleMode is ScaleMode
    for mode in ACCEPTED[ScaleMode]:
        assert get_scale_mode(mode) is ScaleMode.parse(mode)
    with pytest.raises(ValueError, match=r"scale_mode='round'.*allowed: floor, ceil, even, rceil"):
        get_scale_mode("round")


@pytest.mark.parametrize(
    ("cls", "value", "arg", "err", "msg"),
    [
        (ElementFormatName, "fp8", None, ValueError,
         "fmt='fp8' is not an MX element format; allowed: fp8_e4m3, fp8_e5m2, fp6_e2m3, "
         "fp6_e3m2, fp4_e2m1"),
        (ElementFormatName, "FP8_E4M3", "input_fmt", ValueError,
         "input_fmt='FP8_E4M3' is not an MX element format; allowed: fp8_e4m3, "),
        (ElementFormatName, 8, None, TypeError,
         "fmt must be an MX element format (a str), got int 8; allowed: fp8_e4m3, "),
        (ScaleMode, "nearest", None, ValueError,
         "scale_mode='nearest' is not a scale mode; allowed: floor, ceil, even, rceil"),
        (ScaleMode, None, "mode", TypeError,
         "mode must be a scale mode (a str), got NoneType None; allowed: floor, ceil, even, "
         "rceil"),
        (CastBackend, "cublas", None, ValueError,
         "backend='cublas' is not a cast backend; allowed: auto, triton, reference"),
        (MatmulBackend, "reference", "gemm_backend", ValueError,
         "gemm_backend='reference' is not a matmul backend; allowed: auto, emulated, cublas, "
         "triton"),
        (ComputePath, "fake-quant", None, ValueError,
         "compute_path='fake-quant' is not a compute path; allowed: auto, mx, fake_quant"),
    ],
)  # fmt: skip
def test_parse_errors_name_the_argument_the_value_and_the_allowed(cls, value, arg, err, msg):
    with pytest.raises(err) as e:
        cls.parse(value, arg=arg)
    assert str(e.value).startswith(msg)


def test_an_element_format_not_mx_cores_is_refused():
    fake = dataclasses.replace(get_format("fp8_e4m3"), max_normal=240.0)
    with pytest.raises(ValueError, match=r"fmt=ElementFormat\(name='fp8_e4m3'.* is not an MX "):
        ElementFormatName.parse(fake)


def test_cast_settings_defaults_normalise_and_repr():
    s = CastSettings()
    assert (s.fmt, s.block_size, s.scale_mode, s.backend) == ("fp8_e4m3", 32, "rceil", "auto")
    given = CastSettings(fmt="fp4_e2m1", block_size=16, scale_mode="floor", backend="reference")
    assert given.fmt is ElementFormatName.FP4_E2M1
    assert given.scale_mode is ScaleMode.FLOOR and given.backend is CastBackend.REFERENCE
    assert given.format is get_format("fp4_e2m1")
    assert CastSettings(fmt=get_format("fp4_e2m1")).fmt is ElementFormatName.FP4_E2M1
    assert repr(given) == (
        "CastSettings(fmt='fp4_e2m1', block_size=16, scale_mode='floor', backend='reference')"
    )
    assert given.as_kwargs() == {
        "fmt": "fp4_e2m1", "block_size": 16, "scale_mode": "floor", "backend": "reference",
    }  # fmt: skip
    assert all(type(v) in (str, int) for v in given.as_kwargs().values())


def test_cast_settings_is_frozen_keyword_only_and_hashable():
    s = CastSettings(fmt="fp8_e5m2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.fmt = "fp8_e4m3"
    with pytest.raises(TypeError):
        CastSettings("fp8_e4m3")
    # Strings and members give equal settings, with equal hashes.
    members = CastSettings(fmt=ElementFormatName.FP8_E5M2, scale_mode=ScaleMode.RCEIL)
    assert s == members and hash(s) == hash(members) and len({s, members}) == 1
    assert s != CastSettings(fmt="fp8_e5m2", scale_mode="floor")
    assert pickle.loads(pickle.dumps(s)) == s
    # replace() validates as the constructor does.
    assert dataclasses.replace(s, backend="triton").backend is CastBackend.TRITON
    with pytest.raises(ValueError, match="backend='cuda' is not a cast backend"):
        dataclasses.replace(s, backend="cuda")


def test_same_values_ignores_only_the_backend():
    auto = CastSettings(fmt="fp8_e4m3", backend="auto")
    triton = CastSettings(fmt="fp8_e4m3", backend="triton")
    assert auto != triton and auto.same_values(triton) and triton.same_values(auto)
    for change in ({"fmt": "fp8_e5m2"}, {"block_size": 64}, {"scale_mode": "floor"}):
        assert not auto.same_values(dataclasses.replace(auto, **change))
    with pytest.raises(TypeError, match="other must be a CastSettings, got dict"):
        auto.same_values(auto.as_kwargs())


@pytest.mark.parametrize(
    ("kwargs", "err", "msg"),
    [
        ({"fmt": "int8"}, ValueError, "fmt='int8' is not an MX element format; allowed: "),
        ({"fmt": None}, TypeError, "fmt must be an MX element format (a str), got NoneType"),
        ({"block_size": True}, TypeError, "block_size must be an int, got bool True"),
        ({"block_size": 32.0}, TypeError, "block_size must be an int, got float 32.0"),
        ({"block_size": 0}, ValueError, "block_size=0 must be a positive multiple of 2"),
        ({"block_size": 33}, ValueError, "block_size=33 must be a positive multiple of 2"),
        ({"scale_mode": "up"}, ValueError, "scale_mode='up' is not a scale mode; allowed: "),
        ({"backend": "cublas"}, ValueError, "backend='cublas' is not a cast backend; allowed"),
    ],
)
def test_cast_settings_errors(kwargs, err, msg):
    with pytest.raises(err) as e:
        CastSettings(**kwargs)
    assert str(e.value).startswith(msg)
