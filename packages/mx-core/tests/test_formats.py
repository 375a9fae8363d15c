import math

import ml_dtypes
import numpy as np
import pytest
import torch

import mx_core
from mx_core.formats import ElementFormat

# name: (ebits, mbits, emax, max normal, min normal, min subnormal, ml_dtypes type)
SPEC = {
    "fp8_e4m3": (4, 3, 8, 448.0, 2.0**-6, 2.0**-9, ml_dtypes.float8_e4m3fn),
    "fp8_e5m2": (5, 2, 15, 57344.0, 2.0**-14, 2.0**-16, ml_dtypes.float8_e5m2),
    "fp6_e2m3": (2, 3, 2, 7.5, 1.0, 0.125, ml_dtypes.float6_e2m3fn),
    "fp6_e3m2": (3, 2, 4, 28.0, 0.25, 0.0625, ml_dtypes.float6_e3m2fn),
    "fp4_e2m1": (2, 1, 2, 6.0, 1.0, 0.5, ml_dtypes.float4_e2m1fn),
}


def test_every_format_is_specified():
    assert set(mx_core.FORMAT_NAMES) == set(SPEC)


@pytest.mark.parametrize("name", list(SPEC))
def test_format_properties(name):
    ebits, mbits, emax, max_normal, min_normal, min_sub, _ = SPEC[name]
    f = mx_core.get_format(name)
    assert (f.ebits, f.mbits, f.emax) == (ebits, mbits, emax)
    assert (f.max_normal, f.min_normal, f.min_subnormal) == (max_normal, min_normal, min_sub)
    assert f.bits == 1 + ebits + mbits
    assert f.has_inf == (name == "fp8_e5m2")
    assert f.has_nan == name.startswith("fp8")


@pytest.mark.parametrize("name", list(SPEC))
def test_code_values_match_ml_dtypes(name):
    f = mx_core.get_format(name)
    oracle = np.arange(1 << f.bits, dtype=np.uint8).view(SPEC[name][6]).astype(np.float32)
    ours = f.code_values.numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(oracle))
    finite = ~np.isnan(oracle)
    np.testing.assert_array_equal(ours[finite], oracle[finite])
    assert np.nanmax(ours[np.isfinite(ours)]) == f.max_normal


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_nan_code_decodes_to_nan(name):
    f = mx_core.get_format(name)
    assert math.isnan(f.code_values[f.nan_code].item())
    assert torch.tensor([f.nan_code], dtype=torch.uint8).view(f.storage_dtype).float().isnan()


def test_unknown_format_names_the_argument_and_the_choices():
    with pytest.raises(ValueError, match=r"fmt='fp8'.*allowed: fp8_e4m3, fp8_e5m2"):
        mx_core.get_format("fp8")
    with pytest.raises(TypeError, match="fmt must be a format name"):
        mx_core.get_format(8)


def test_formats_are_frozen_and_keyword_only():
    f = mx_core.get_format("fp8_e4m3")
    with pytest.raises(AttributeError):
        f.mbits = 2
    with pytest.raises(TypeError):
        ElementFormat("x", 1, 1, 1.0, False, False, torch.uint8)
