"""mx_kernels.settings: the environment variables, read at call time and checked, each one
documented in the README; no other module reads the environment."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

import mx_kernels
from mx_kernels import inline_casts, settings
from mx_kernels.testing import cpu_cached_launches

PACKAGE = pathlib.Path(__file__).resolve().parents[1]
FLAGS = {
    "MX_KERNELS_CACHED_LAUNCH": (settings.cached_launch, True),
    "MX_KERNELS_CHECK_LAUNCH": (settings.check_launch, False),
    "MX_KERNELS_INLINE": (settings.inline_casts, True),
}
VARIABLES = [*FLAGS, "MX_KERNELS_MM_DESIGN", "TRITON_INTERPRET"]


def test_only_settings_reads_the_environment():
    for path in (PACKAGE / "src" / "mx_kernels").glob("*.py"):
        if path.name != "settings.py":
            text = path.read_text()
            assert not re.search(r"os\.environ|getenv|os\.getenv", text), path.name
    names = set(
        re.findall(
            r'"((?:MX_KERNELS|TRITON)_[A-Z_]+)"',
            (PACKAGE / "src" / "mx_kernels" / "settings.py").read_text(),
        )
    )
    assert names == set(VARIABLES)


def test_every_variable_is_documented_in_the_readme():
    readme = (PACKAGE / "README.md").read_text()
    rows = {m[0]: m for m in re.findall(r"^\| `([A-Z_]+)` \|(.*)\|(.*)\|(.*)\|$", readme, re.M)}
    assert set(rows) == set(VARIABLES)
    for name, (_, values, default, when) in rows.items():
        assert values.strip() and default.strip() and when.strip(), name
    for name, (_, default) in FLAGS.items():
        assert f"`{int(default)}`" in rows[name][2], name


@pytest.mark.parametrize("name", FLAGS)
def test_flags_take_0_and_1_and_refuse_anything_else(name, monkeypatch):
    read, default = FLAGS[name]
    monkeypatch.delenv(name, raising=False)
    assert read() is default
    for raw, value in (("0", False), ("1", True)):
        monkeypatch.setenv(name, raw)
        assert read() is value  # read at call time: set after import
    for raw in ("", "2", "true", "off", " 1"):
        monkeypatch.setenv(name, raw)
        with pytest.raises(ValueError, match=rf"{name}={raw!r} .* allowed: '0' \(off\) and '1'"):
            read()


def test_mm_design_is_checked_where_it_is_read(monkeypatch):
    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    assert settings.mm_design() == settings.DEFAULT_DESIGN == "dequant_bf16"
    for design in settings.DESIGNS:
        monkeypatch.setenv("MX_KERNELS_MM_DESIGN", design)
        assert settings.mm_design() == design
    monkeypatch.setenv("MX_KERNELS_MM_DESIGN", "fp8")
    message = r"MX_KERNELS_MM_DESIGN='fp8' is not a design .* allowed: dot_scaled, fp8_mma"
    with pytest.raises(ValueError, match=message):
        mx_kernels.bf16_gemm_design(torch.device("cpu"), "fp8_e4m3", "fp8_e4m3", backend="triton")


@pytest.mark.parametrize("raw", ["1", "0", "", "true", "TRUE", "yes", "On", "y", "2", "false"])
def test_triton_interpret_is_read_as_triton_reads_it(raw, monkeypatch):
    libtriton = pytest.importorskip("triton._C.libtriton")
    monkeypatch.setenv("TRITON_INTERPRET", raw)
    assert settings.triton_interpret() is libtriton.getenv_bool("TRITON_INTERPRET", False)
    assert mx_kernels.backend.interpreter_enabled() is settings.triton_interpret()


def test_inline_switch_is_checked_when_a_graph_is_traced(monkeypatch):
    monkeypatch.setenv("MX_KERNELS_INLINE", "no")
    with pytest.raises(ValueError, match="MX_KERNELS_INLINE='no'"):
        inline_casts._off()
    monkeypatch.setenv("MX_KERNELS_INLINE", "0")
    assert inline_casts._off()


def test_launch_switches_are_read_on_each_launch(monkeypatch):
    """A value set after import, and after the cast's plan exists, takes effect on the
    next launch; a bad one is an error there, not a silent "off"."""
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    with cpu_cached_launches() as counts:
        for _ in range(2):
            mx_kernels.quantize_rowwise(x, backend="triton")
        assert counts["cached"] == 1
        monkeypatch.setenv("MX_KERNELS_CHECK_LAUNCH", "yes")
        with pytest.raises(ValueError, match="MX_KERNELS_CHECK_LAUNCH='yes'"):
            mx_kernels.quantize_rowwise(x, backend="triton")
        monkeypatch.setenv("MX_KERNELS_CHECK_LAUNCH", "0")
        monkeypatch.setenv("MX_KERNELS_CACHED_LAUNCH", "false")
        with pytest.raises(ValueError, match="MX_KERNELS_CACHED_LAUNCH='false'"):
            mx_kernels.quantize_rowwise(x, backend="triton")
        monkeypatch.setenv("MX_KERNELS_CACHED_LAUNCH", "0")
        mx_kernels.quantize_rowwise(x, backend="triton")
        assert counts["cached"] == 1 and counts["compiled"] == 1  # Triton's own path ran
