"""At the top of the input dtype's range the Triton casts saturate as mx-core does
(mx_core.scale: the floor exponent where amax would round past 2^T): bit-exact with the
reference in every format, scale mode and input dtype, and nothing decodes to inf."""

from __future__ import annotations

import pytest
import torch

import mx_core
import mx_kernels
from mx_core.testing import assert_same_bits

MODES = ["floor", "ceil", "even", "rceil"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _top_of_range(dtype: torch.dtype) -> torch.Tensor:
    """x [32, 64] whose rows and columns hold blocks with amax in the dtype's top binade
    (its max, 2^T, mantissas that do and do not round up to 2^(T+1)) and smaller ones."""
    top = mx_core.top_exponent(dtype)
    g = torch.Generator().manual_seed(0)
    mantissa = 1 + torch.rand(32, 64, generator=g, dtype=torch.float64)
    down = torch.tensor([0, 0, 0, 1, 5, 30], dtype=torch.float64)
    exponent = top - down[torch.randint(0, len(down), (32, 64), generator=g)]
    sign = torch.randint(0, 2, (32, 64), generator=g) * 2 - 1
    x = sign * mantissa * torch.exp2(exponent)
    fmax = torch.finfo(dtype).max
    edges = torch.tensor([fmax, 1.9375, 1.875, 1.75, 1.5, 1.0], dtype=torch.float64)
    edges[1:] *= 2.0**top
    x[: len(edges), 0] = edges  # rows 0..5 carry them in block 0, column 0 too
    x[-1, 32 : 32 + len(edges)] = -edges  # row 31's block 1, and columns 32..37
    return x.clamp(-fmax, fmax).to(dtype)


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", mx_core.FORMAT_NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_casts_saturate_at_the_top_of_the_dtype_as_mx_core_does(dtype, fmt, mode):
    x = _top_of_range(dtype)
    row = mx_core.quantize(x, fmt, scale_mode=mode)
    col = mx_core.quantize(x.t().contiguous(), fmt, scale_mode=mode)
    for t in (row, col):
        assert t.dequantize().isfinite().all()
    kw = dict(scale_mode=mode, backend="triton")
    got = [
        *mx_kernels.quantize_rowwise(x, fmt, **kw),
        *mx_kernels.quantize_colwise(x, fmt, **kw),
        *mx_kernels.quantize_both(x, fmt, **kw),
    ]
    want = [row.qdata, row.scale, col.qdata, col.scale] * 2  # rowwise, colwise, both
    for g, w in zip(got, want, strict=True):
        assert_same_bits(_u8(g), _u8(w))
    fake_row, fake_col = row.dequantize(dtype), col.dequantize(dtype).t()
    assert_same_bits(mx_kernels.fake_quantize_rowwise(x, fmt, **kw), fake_row)
    assert_same_bits(mx_kernels.fake_quantize_colwise(x, fmt, **kw), fake_col)
    both = mx_kernels.fake_quantize_both(x, fmt, **kw)
    assert_same_bits(both[0], fake_row)
    assert_same_bits(both[1], fake_col)
