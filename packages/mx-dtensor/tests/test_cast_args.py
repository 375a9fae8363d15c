"""The MX styles and gathers take one ``cast=CastSettings(...)`` or, for one more
release, its four settings as keywords (a FutureWarning naming ``cast=``): both forms
build the same style, passing both is refused, and the old attributes still read back,
without a warning (construction only: the runs of both forms are in
test_styles_parallel.py and test_styles_mx.py)."""

from __future__ import annotations

import re
import warnings

import pytest
from torch.distributed.tensor import Replicate, Shard

import mx_kernels
from mx_core import CastBackend, CastSettings, MatmulBackend, ScaleMode
from mx_dtensor import GatheredCast, MXColwiseParallel, PrepareMXModuleInput, mx_all_gather
from mx_dtensor.cast_args import cast_from_args
from mx_dtensor.gather import gather_replicated

GATHER = {"input_layouts": Shard(1), "desired_input_layouts": Replicate()}
STYLES = {
    "MXColwiseParallel": lambda **kw: MXColwiseParallel(input_layouts=Shard(1), **kw),
    "PrepareMXModuleInput": lambda **kw: PrepareMXModuleInput(**GATHER, **kw),
}
OLD = {"fmt": "fp8_e5m2", "block_size": 64, "scale_mode": "floor", "backend": "reference"}


def _deprecated(who: str, *keywords: str):
    """pytest.warns of the one FutureWarning that passing ``keywords`` to ``who`` gives."""
    form = ", ".join(f"{k}=..." for k in keywords)
    message = (f"{who}({form}) is deprecated and will be removed in the next release: "
               f"pass cast=mx_core.CastSettings({form})")  # fmt: skip
    return pytest.warns(FutureWarning, match=f"^{re.escape(message)}$")


def test_the_backends_are_mx_kernels_lists():
    assert CastBackend.choices() == mx_kernels.backend.BACKENDS
    assert MatmulBackend.choices() == mx_kernels.backend.MATMUL_BACKENDS


@pytest.mark.parametrize("name", STYLES)
def test_cast_and_the_four_keywords_build_the_same_style(name):
    make = STYLES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cast= form warns of nothing
        new = make(cast=CastSettings(**OLD))
    with _deprecated(name, *OLD) as record:
        old = make(**OLD)
    assert len(record) == 1  # one warning for the four keywords
    assert record[0].filename == __file__  # attributed to the caller of the style
    assert new.cast == old.cast == CastSettings(**OLD)
    assert repr(new) == repr(old)
    assert repr(new).endswith(
        "cast=CastSettings(fmt='fp8_e5m2', block_size=64, scale_mode='floor', backend='reference'))"
    )
    # The attributes the styles had before, as plain strings and an int, read back
    # without a warning.
    for style in (new, old):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = (style.fmt, style.block_size, style.scale_mode, style.backend)
        assert got == tuple(OLD.values()) and all(type(v) in (str, int) for v in got)
    # Some keywords only: the others keep the defaults, as before.
    with _deprecated(name, "scale_mode"):
        assert make(scale_mode=ScaleMode.FLOOR).cast == CastSettings(scale_mode="floor")
    assert make().cast == CastSettings()


@pytest.mark.parametrize("name", STYLES)
def test_the_settings_are_read_only(name):
    style = STYLES[name]()
    for attr in OLD:
        with pytest.raises(AttributeError):
            setattr(style, attr, OLD[attr])
    assert style.cast == CastSettings()


@pytest.mark.parametrize("name", STYLES)
def test_refusals_name_the_style(name):
    make = STYLES[name]
    with pytest.raises(TypeError) as e:
        make(cast=CastSettings(), fmt="fp8_e4m3", backend="auto")
    assert str(e.value) == (
        f"{name}: pass either cast=CastSettings(...) or the keywords fmt, backend, not both"
    )
    with pytest.raises(
        TypeError, match=rf"^{name}: cast must be an mx_core.CastSettings, got dict"
    ):
        make(cast={"fmt": "fp8_e4m3"})
    with (
        pytest.raises(ValueError, match=rf"^{name}: scale_mode='up' is not a scale mode; allowed"),
        _deprecated(name, "scale_mode"),
    ):
        make(scale_mode="up")
    with (
        pytest.raises(ValueError, match=rf"^{name}: block_size=3 must be a positive multiple of 2"),
        _deprecated(name, "block_size"),
    ):
        make(block_size=3)


def test_the_gathers_refuse_both_forms_before_communicating():
    import torch

    x = torch.zeros(2, 4, 32)
    for fn, args in ((mx_all_gather, (x, None, 1)), (gather_replicated, (x, None, 1))):
        kwargs = {"who": "caller"} if fn is gather_replicated else {}
        with pytest.raises(TypeError, match="pass either cast=CastSettings"):
            fn(*args, cast=CastSettings(), block_size=32, **kwargs)


def test_cast_from_args():
    cast = CastSettings(fmt="fp4_e2m1")
    assert cast_from_args("f", cast) is cast
    assert cast_from_args("f", None) == CastSettings()
    with _deprecated("f", "fmt"):
        assert cast_from_args("f", None, fmt="fp4_e2m1") == cast


def test_the_gathers_warn_of_the_old_keywords():
    import torch

    x = torch.zeros(2, 4, 32)
    # The warning comes before the gather's own checks: mesh None fails after it.
    for fn, who, kwargs in ((mx_all_gather, "mx_all_gather", {}),
                            (gather_replicated, "caller", {"who": "caller"})):  # fmt: skip
        with pytest.raises(AttributeError), _deprecated(who, "fmt", "backend"):
            fn(x, None, 1, fmt="fp8_e4m3", backend="auto", **kwargs)


def test_gathered_cast_reads_its_cast_as_the_old_fields():
    cast = CastSettings(fmt="fp8_e5m2", scale_mode="floor")
    g = GatheredCast(None, None, None, cast)
    assert g.cast is cast
    assert (g.fmt, g.block_size, g.scale_mode, g.backend) == ("fp8_e5m2", 32, "floor", "auto")
    assert type(g.fmt) is str and type(g.scale_mode) is str and type(g.backend) is str
