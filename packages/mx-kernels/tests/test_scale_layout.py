"""scaled_mm's ``scale_layout="blocked"``: scales already in cuBLAS's blocked layout give
the same result, bit for bit, on the backends that unswizzle them (emulated, Triton);
sizes and contiguity are checked; the op takes the layouts (opcheck, torch.compile).
cuBLAS's side (passed on without a copy): test_cublas_meta.py."""

from __future__ import annotations

import pytest
import torch

from mx_core import quantize
from mx_kernels import scaled_mm, swizzle_scales

IMPLS = [("emulated", None), ("triton", "dequant_bf16"), ("triton", "dot_scaled")]
IMPL_IDS = ["emulated", "triton-dequant_bf16", "triton-dot_scaled"]
LAYOUTS = ["blocked", ("plain", "blocked"), ("blocked", "plain")]


def _operands(m, k, n, a_fmt, b_fmt):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-8, 9, (m, 1), generator=g))
    w = torch.randn(n, k, generator=g)
    return quantize(x, a_fmt), quantize(w, b_fmt)


def _scales(a, b, layout, flat=True):
    pair = (layout, layout) if isinstance(layout, str) else layout
    out = []
    for scale, kind in zip((a.scale, b.scale), pair, strict=True):
        blocked = swizzle_scales(scale)
        out.append(scale if kind == "plain" else blocked.flatten() if flat else blocked)
    return out


@pytest.mark.parametrize(
    "impl", IMPLS, ids=["emulated", "triton-dequant_bf16", "triton-dot_scaled"]
)
@pytest.mark.parametrize("layout", LAYOUTS, ids=["both", "b", "a"])
@pytest.mark.parametrize(
    "a_fmt,b_fmt", [("fp8_e4m3", "fp8_e4m3"), ("fp4_e2m1", "fp4_e2m1"), ("fp8_e4m3", "fp8_e5m2")]
)
def test_blocked_scales_give_the_same_result(a_fmt, b_fmt, layout, impl, monkeypatch):
    backend, design = impl
    if design is not None:
        monkeypatch.setenv("MX_KERNELS_MM_DESIGN", design)
    a, b = _operands(133, 96, 48, a_fmt, b_fmt)  # 133 rows: padded to 256; 3 blocks: to 4
    kwargs = dict(out_dtype=torch.float32, backend=backend)
    plain = scaled_mm(a.qdata, a.scale, b.qdata, b.scale, **kwargs)
    sa, sb = _scales(a, b, layout)
    blocked = scaled_mm(a.qdata, sa, b.qdata, sb, scale_layout=layout, **kwargs)
    torch.testing.assert_close(blocked, plain, rtol=0, atol=0)
    sa, sb = _scales(a, b, layout, flat=False)  # any shape: only the memory order counts
    again = scaled_mm(a.qdata, sa, b.qdata, sb, scale_layout=layout, **kwargs)
    torch.testing.assert_close(again, plain, rtol=0, atol=0)


def test_blocked_scale_checks():
    a, b = _operands(5, 64, 16, "fp8_e4m3", "fp8_e4m3")
    sa, sb = swizzle_scales(a.scale), swizzle_scales(b.scale)  # [128, 4] each
    with pytest.raises(ValueError, match=r"a_scale \(blocked layout\) has 5 elements?; expected "
                       r"512 = ceil128\(M=5\) \* ceil4\(K // 32=2\)"):  # fmt: skip
        scaled_mm(a.qdata, sa.flatten()[:5], b.qdata, sb, scale_layout="blocked")
    with pytest.raises(ValueError, match=r"b_scale \(blocked layout\) has 256 elements"):
        scaled_mm(a.qdata, sa, b.qdata, sb[:64], scale_layout="blocked")
    with pytest.raises(ValueError, match=r"b_scale \(blocked layout\) must be contiguous"):
        scaled_mm(a.qdata, sa, b.qdata, sb.t(), scale_layout="blocked")
    with pytest.raises(ValueError, match=r"b_scale has shape \(128, 4\); expected \(16, 2\)"):
        scaled_mm(a.qdata, sa, b.qdata, sb, scale_layout=("blocked", "plain"))
    with pytest.raises(TypeError, match="b_scale has dtype torch.uint8"):
        scaled_mm(a.qdata, sa, b.qdata, sb.view(torch.uint8), scale_layout="blocked")


@pytest.mark.parametrize(
    "layout,error,match",
    [("swizzled", ValueError, "'swizzled' \\(of a\\) is not one of plain, blocked"),
     (("plain", "tiled"), ValueError, "'tiled' \\(of b\\)"),
     (("plain",), TypeError, "a str or a pair"),
     (None, TypeError, "a str or a pair"),
     (("plain", 1), TypeError, "scale_layout of b must be a str")],
)  # fmt: skip
def test_bad_scale_layout(layout, error, match):
    a, b = _operands(4, 64, 16, "fp8_e4m3", "fp8_e4m3")
    with pytest.raises(error, match=match):
        scaled_mm(a.qdata, a.scale, b.qdata, b.scale, scale_layout=layout)


def _op_args(layouts, backend):
    a, b = _operands(17, 64, 32, "fp8_e4m3", "fp4_e2m1")
    sa, sb = _scales(a, b, layouts)
    u8 = torch.uint8
    return (a.qdata.view(u8), sa.view(u8), "fp8_e4m3", b.qdata.view(u8), sb.view(u8),
            "fp4_e2m1", torch.float32, backend, *layouts)  # fmt: skip


@pytest.mark.parametrize("layouts", [("blocked", "blocked"), ("plain", "blocked")])
@pytest.mark.parametrize("backend", ["emulated", "triton"])
def test_opcheck_with_blocked_scales(layouts, backend):
    torch.library.opcheck(torch.ops.mx.scaled_mm.default, _op_args(layouts, backend))


def test_op_defaults_to_plain_scales():
    args = _op_args(("plain", "plain"), "emulated")
    eight = torch.ops.mx.scaled_mm.default(*args[:8])
    torch.testing.assert_close(eight, torch.ops.mx.scaled_mm.default(*args), rtol=0, atol=0)


def test_compile_with_blocked_scales():
    a, b = _operands(16, 64, 32, "fp8_e4m3", "fp8_e4m3")
    sa, sb = _scales(a, b, "blocked")

    def f(a_q, a_scale, b_q, b_scale):
        return scaled_mm(a_q, a_scale, b_q, b_scale, out_dtype=torch.float32,
                         scale_layout="blocked")  # fmt: skip

    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    want = scaled_mm(a.qdata, a.scale, b.qdata, b.scale, out_dtype=torch.float32)
    torch.testing.assert_close(compiled(a.qdata, sa, b.qdata, sb), want, rtol=0, atol=0)
