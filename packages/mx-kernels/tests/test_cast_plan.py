"""Cast plans: a plan stands for arguments that passed the checks, and what may change
between calls of equal arguments is still seen on every call."""

import logging

import pytest
import torch

import mx_kernels
from mx_core.testing import assert_same_bits
from mx_kernels import backend, cast_plan


def test_a_plan_is_made_once_per_call_signature(monkeypatch):
    monkeypatch.setattr(cast_plan, "_PLANS", {})
    x = torch.randn(4, 64)
    for _ in range(3):
        mx_kernels.quantize_rowwise(x)
    mx_kernels.quantize_rowwise(x.t().contiguous().t())  # other strides: another plan
    mx_kernels.quantize_rowwise(x, "fp8_e5m2")
    torch.ops.mx.quantize_rowwise(x, "fp8_e4m3", 32, "rceil", "auto")  # the op's own layout
    assert len(cast_plan._PLANS) == 4


def test_plans_start_afresh_past_their_bound(monkeypatch):
    monkeypatch.setattr(cast_plan, "_PLANS", {})
    monkeypatch.setattr(cast_plan, "MAX_PLANS", 2)
    for k in (32, 64, 96):
        mx_kernels.quantize_rowwise(torch.zeros(2, k))
    assert len(cast_plan._PLANS) == 1


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (lambda x: mx_kernels.quantize_rowwise(x, block_size=32.0), TypeError, "got float"),
        (lambda x: mx_kernels.quantize_rowwise(x, block_size=True), TypeError, "got bool"),
        (lambda x: mx_kernels.quantize_rowwise(x, ["fp8"]), TypeError, "got list"),
        (lambda x: mx_kernels.quantize_colwise(x, scale_mode={}), ValueError, "not a scale mode"),
        (lambda x: mx_kernels.quantize_rowwise(x[:, :48]), ValueError, "not divisible"),
    ],
)
def test_arguments_equal_to_a_planned_call_are_still_checked(call, exc, message):
    """32.0 == 32 (and hashes alike), but a plan made for block_size=32 does not accept
    it; unhashable arguments get the checks' error, not the cache's."""
    x = torch.zeros(32, 64)
    mx_kernels.quantize_rowwise(x)  # plans for these shapes exist
    mx_kernels.quantize_colwise(x)
    for _ in range(2):
        with pytest.raises(exc, match=message):
            call(x)


def test_the_choice_is_logged_again_once_the_log_is_cleared(caplog):
    x = torch.zeros(4, 96)
    mx_kernels.fake_quantize_colwise(x.t().contiguous())  # planned
    backend.LOGGED.clear()
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        mx_kernels.fake_quantize_colwise(x.t().contiguous())
        mx_kernels.fake_quantize_colwise(x.t().contiguous())
    lines = [r.getMessage() for r in caplog.records if "fake_quantize_colwise" in r.getMessage()]
    assert lines == [
        "mx_kernels.fake_quantize_colwise: reference backend on cpu (auto: not a CUDA tensor)"
    ]


def test_triton_interpret_is_read_on_every_call_off_cuda(monkeypatch):
    x = torch.zeros(2, 32)
    mx_kernels.quantize_rowwise(x, backend="triton")  # planned under the interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="needs TRITON_INTERPRET=1"):
        mx_kernels.quantize_rowwise(x, backend="triton")


@pytest.mark.parametrize("backend_", ["triton", "reference"])
def test_public_layouts_from_the_plan_equal_the_ops_transposed(backend_):
    """The public functions' plans allocate the column-major scales directly; the ops
    return the contiguous buffers, which the public functions' other path transposes."""
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    for name in ("quantize_colwise", "quantize_both"):
        public = getattr(mx_kernels, name)(x, backend=backend_)
        buffers = getattr(torch.ops.mx, name)(x, "fp8_e4m3", 32, "rceil", backend_)
        assert all(b.is_contiguous() for b in buffers)
        views = cast_plan.public_layout(buffers)
        for got, want in zip(public, views, strict=True):
            assert got.shape == want.shape and got.stride() == want.stride()
            assert_same_bits(got, want)
