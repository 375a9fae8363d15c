"""Every MX GEMM of every recipe (forward Y, dX, dW of an MXLinear step), as it would run
on a B200: the operands MXLinear hands to scaled_mm are prepared for cuBLAS and passed to
PyTorch's own ops on meta tensors (torch._scaled_mm for MXFP8,
torch.nn.functional.scaled_mm for MXFP4), routed as "auto" routes them on a (mocked)
sm100, and what cuBLAS computes from them equals the emulated GEMM bit for bit."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import mx_kernels
from mx_core import MXTensor
from mx_kernels import backend as backend_mod
from mx_kernels import capability, unswizzle_scales
from mx_kernels.cublas import CublasArgs, cublas_unsupported_reason, prepare_cublas_args, run_cublas
from mx_nn import MXLinear
from mx_nn.config import MXLinearConfig, MXRecipe

# M (tokens), K (in_features), N (out_features): M not a multiple of 128 (nor of 32,
# so dW's K is padded), M != N so that the backward GEMMs are told apart by shape.
SHAPES = [(133, 256, 160), (1, 64, 96), (300, 96, 128)]
GEMMS = {  # recipe -> GEMMs scaled_mm runs (fp6 has none: it multiplies in fp32)
    "mxfp8": ("Y", "dX", "dW"), "mxfp8_floor": ("Y", "dX", "dW"),
    "mxfp8_e5m2_grads": ("Y", "dX", "dW"), "mxfp8_hp_wgrad": ("Y", "dX"), "mxfp6": (),
    "mxfp4": ("Y", "dX", "dW"),
}  # fmt: skip
MIXED = "PyTorch tests its MX GEMM on e4m3 x e4m3 and fp4 x fp4 only"


def _gemms(recipe: str, m: int, k: int, n: int, dtype: torch.dtype, monkeypatch) -> dict:
    """name -> (a_q, a_scale, b_q, b_scale, out_dtype) of each scaled_mm call of one
    MXLinear forward and backward."""
    calls = []
    real = mx_kernels.scaled_mm

    def recording(a_q, a_scale, b_q, b_scale, *, out_dtype, backend, scale_layout="plain"):
        assert scale_layout in ("plain", ("plain", "plain"))  # CPU tensors: plain casts
        calls.append((a_q, a_scale, b_q, b_scale, out_dtype))
        return real(a_q, a_scale, b_q, b_scale, out_dtype=out_dtype, backend=backend)

    monkeypatch.setattr(mx_kernels, "scaled_mm", recording)
    config = MXLinearConfig.from_recipe(recipe, compute_path="mx")
    g = torch.Generator().manual_seed(0)
    layer = MXLinear(k, n, bias=False, dtype=dtype, config=config)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=g))
    x = torch.randn(m, k, generator=g, dtype=dtype, requires_grad=True)
    y = layer(x)
    y.backward(torch.randn(m, n, generator=g, dtype=dtype))
    named = {}
    for a_q, a_scale, b_q, b_scale, out in calls:
        rows = (a_q.shape[0], b_q.shape[0])
        name = {(m, n): "Y", (m, k): "dX", (n, k): "dW"}[rows]
        named[name] = (a_q, a_scale, b_q, b_scale, out)
    assert len(named) == len(calls)
    return named


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def _meta_count_fp4(rows: int, packed_k: int) -> int:
    """The fp4 scale count torch 2.13's scaled_mm meta function expects (see below)."""
    return _ceil(rows, 128) * _ceil(-(-packed_k // 32), 4)


def _call_meta(args: CublasArgs) -> torch.Tensor:
    """run_cublas on meta tensors. torch 2.13's meta registration for scaled_mm counts fp4
    scale elements from the packed K (``_check_scaled_mm_sizes_v2`` in
    ``torch/_meta_registrations.py``): where that count differs from the right one, and
    only then, the meta function is given the prefix it expects (the right count is
    checked against torch._scaled_mm's meta function, which counts from the unpacked K)."""
    try:
        return run_cublas(args)
    except RuntimeError as e:
        if not args.fp4 or "for MX scaling scale_a must have" not in str(e):
            raise
        (m, packed_k), n = args.mat_a.shape, args.mat_b.shape[1]
        out = torch._scaled_mm(args.mat_a, args.mat_b, args.scale_a, args.scale_b,
                               out_dtype=args.out_dtype)  # fmt: skip
        assert out.shape == (m, n)  # the right count, by the other meta function
        want_a, want_b = (_meta_count_fp4(rows, packed_k) for rows in (m, n))
        return run_cublas(
            dataclasses.replace(args, scale_a=args.scale_a[:want_a], scale_b=args.scale_b[:want_b])
        )


@pytest.fixture
def sm100(monkeypatch):
    """A (mocked) B200 with a torch built with MSLK."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(capability, "mxfp4_build_gap", lambda: None)
    monkeypatch.setattr(backend_mod, "triton_available", lambda: True)
    capability.cuda_capability.cache_clear()
    yield torch.device("cuda", 0)
    capability.cuda_capability.cache_clear()


def test_every_recipe_is_covered():
    assert set(GEMMS) == {r.value for r in MXRecipe}


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("recipe", list(GEMMS))
def test_recipe_gemms_on_blackwell(recipe, m, k, n, monkeypatch, sm100):
    gemms = _gemms(recipe, m, k, n, torch.bfloat16, monkeypatch)
    assert tuple(sorted(gemms)) == tuple(sorted(GEMMS[recipe]))
    for name, (a_q, a_scale, b_q, b_scale, out) in gemms.items():
        assert out == torch.bfloat16
        reason = cublas_unsupported_reason(a_q.dtype, b_q.dtype, b_q.shape[0], out)
        fp4 = a_q.dtype == b_q.dtype == torch.uint8
        chosen = backend_mod.resolve_matmul_backend(
            "scaled_mm", "auto", sm100, cublas_unsupported=reason, fp4=fp4, log=False
        )
        if recipe == "mxfp8_e5m2_grads" and name != "Y":  # e5m2 x e4m3: not tested by PyTorch
            assert MIXED in reason and chosen == "triton", (name, reason)
            continue
        assert reason is None and chosen == "cublas", (name, reason)
        meta = [t.to("meta") for t in (a_q, a_scale, b_q, b_scale)]
        y = _call_meta(prepare_cublas_args(*meta, out_dtype=out))
        assert y.shape == (a_q.shape[0], b_q.shape[0]) and y.dtype == torch.bfloat16
        _check_model(a_q, a_scale, b_q, b_scale, recipe, name)


def _check_model(a_q, a_scale, b_q, b_scale, recipe, name):
    """What cuBLAS computes from the prepared operands (elements times the scales it
    reads, unswizzled; fp32) is the emulated GEMM, bit for bit."""
    args = prepare_cublas_args(a_q, a_scale, b_q, b_scale)
    k = a_scale.shape[1] * 32
    fmt = "fp4_e2m1" if args.fp4 else "fp8_e4m3"
    qa = args.mat_a.view(torch.uint8) if args.fp4 else args.mat_a
    qb = args.mat_b.t().view(torch.uint8) if args.fp4 else args.mat_b.t()
    sa = unswizzle_scales(args.scale_a, (a_q.shape[0], k // 32))
    sb = unswizzle_scales(args.scale_b, (b_q.shape[0], k // 32))
    a_hp = MXTensor(qa, sa, fmt, 32, 1, torch.float32).dequantize(torch.float32)
    b_hp = MXTensor(qb, sb, fmt, 32, 1, torch.float32).dequantize(torch.float32)
    emulated = mx_kernels.scaled_mm(a_q, a_scale, b_q, b_scale, out_dtype=torch.float32,
                                    backend="emulated")  # fmt: skip
    assert torch.equal(a_hp @ b_hp.t(), emulated), (recipe, name)


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4", "mxfp8_e5m2_grads"])
def test_fp32_layers_run_triton_on_blackwell(recipe, monkeypatch, sm100):
    """An fp32 layer's GEMMs have fp32 results: auto sends them to Triton, not to a bf16
    cuBLAS result cast up."""
    gemms = _gemms(recipe, 133, 256, 160, torch.float32, monkeypatch)
    for name, (a_q, _, b_q, _, out) in gemms.items():
        reason = cublas_unsupported_reason(a_q.dtype, b_q.dtype, b_q.shape[0], out)
        fp4 = a_q.dtype == b_q.dtype == torch.uint8
        chosen = backend_mod.resolve_matmul_backend(
            "scaled_mm", "auto", sm100, cublas_unsupported=reason, fp4=fp4, log=False
        )
        assert out == torch.float32 and chosen == "triton", (name, reason)
        assert "out_dtype=torch.float32" in reason or MIXED in reason, (name, reason)


def _step(recipe: str, blocked: bool, monkeypatch):
    """(scaled_mm calls as (a_q, a_scale, b_q, b_scale, layouts), y, dX, dW) of one
    MXLinear step whose casts write blocked scales where ``blocked`` (as they do where the
    forward GEMM runs on cuBLAS), run on CPU (the emulated GEMM unswizzles them)."""
    import mx_nn.linear_gemms

    calls = []
    real = mx_kernels.scaled_mm

    def recording(a_q, a_scale, b_q, b_scale, *, out_dtype, backend, scale_layout):
        calls.append((a_q, a_scale, b_q, b_scale, scale_layout))
        return real(a_q, a_scale, b_q, b_scale, out_dtype=out_dtype, backend=backend,
                    scale_layout=scale_layout)  # fmt: skip

    monkeypatch.setattr(mx_kernels, "scaled_mm", recording)
    monkeypatch.setattr(mx_nn.linear_gemms, "blocked_scales", lambda *args: blocked)
    config = MXLinearConfig.from_recipe(recipe, compute_path="mx")
    g = torch.Generator().manual_seed(0)
    layer = MXLinear(256, 160, bias=False, dtype=torch.bfloat16, config=config)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(160, 256, generator=g))
    x = torch.randn(133, 256, generator=g, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.backward(torch.randn(133, 160, generator=g, dtype=torch.bfloat16))
    monkeypatch.undo()
    return calls, y, x.grad, layer.weight.grad


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp8_e5m2_grads", "mxfp8_hp_wgrad", "mxfp4"])
def test_casts_write_blocked_scales_for_cublas(recipe, monkeypatch, sm100):
    """Where the forward GEMM runs on cuBLAS, every cast of the step writes its scales in
    cuBLAS's blocked layout: the same scales as the plain casts once unswizzled (rows
    padded to whole blocks hold their own scales there, which no output row reads), the
    same codes, the same result and gradients bit for bit; and each blocked GEMM's
    operands pass PyTorch's op on meta tensors with no swizzle of their own."""
    plain, y0, dx0, dw0 = _step(recipe, False, monkeypatch)
    blocked, y1, dx1, dw1 = _step(recipe, True, monkeypatch)
    assert torch.equal(y0, y1) and torch.equal(dx0, dx1) and torch.equal(dw0, dw1)
    assert len(plain) == len(blocked) == len(GEMMS[recipe])
    for (a_q, a_s, b_q, b_s, lay0), (a_q1, a_s1, b_q1, b_s1, lay1) in zip(
        plain, blocked, strict=True
    ):
        assert lay0 == ("plain", "plain") and lay1 == ("blocked", "blocked")
        assert torch.equal(a_q.view(torch.uint8), a_q1.view(torch.uint8))
        assert torch.equal(b_q.view(torch.uint8), b_q1.view(torch.uint8))
        for s, s1 in ((a_s, a_s1), (b_s, b_s1)):
            assert s1.dim() == 1 and s1.is_contiguous()
            assert torch.equal(unswizzle_scales(s1, tuple(s.shape)).view(torch.uint8),
                               s.view(torch.uint8))  # fmt: skip
        fp4 = a_q.dtype == b_q.dtype == torch.uint8
        if fp4 or (a_q.dtype == b_q.dtype == torch.float8_e4m3fn):
            meta = [t.to("meta") for t in (a_q1, a_s1, b_q1, b_s1)]
            blocked_kw = {"a_scale_layout": "blocked", "b_scale_layout": "blocked"}
            args = prepare_cublas_args(*meta, out_dtype=torch.bfloat16, **blocked_kw)
            assert _call_meta(args).shape == (a_q.shape[0], b_q.shape[0])


def test_kept_weight_casts_keep_their_blocked_scales(monkeypatch):
    """Inside keep_weight_casts(), the weight's blocked cast is made once for two
    micro-batches and handed to both forward GEMMs as it is (no swizzle per GEMM)."""
    import mx_nn
    import mx_nn.linear_gemms

    monkeypatch.setattr(mx_nn.linear_gemms, "blocked_scales", lambda *args: True)
    weight_casts, scales = [], []
    real_cast, real_mm = mx_kernels.quantize_both, mx_kernels.scaled_mm

    def cast(x, *args, **kwargs):
        if isinstance(x, torch.nn.Parameter):
            weight_casts.append(kwargs.get("scale_layout"))
        return real_cast(x, *args, **kwargs)

    def mm(a_q, a_s, b_q, b_s, **kwargs):
        if b_q.shape == (160, 256):  # the forward GEMM: b is the weight
            scales.append(b_s)
        return real_mm(a_q, a_s, b_q, b_s, **kwargs)

    monkeypatch.setattr(mx_kernels, "quantize_both", cast)
    monkeypatch.setattr(mx_kernels, "scaled_mm", mm)
    layer = MXLinear(256, 160, bias=False, dtype=torch.bfloat16,
                     config=MXLinearConfig(compute_path="mx"))  # fmt: skip
    with mx_nn.keep_weight_casts():
        for seed in (0, 1):
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(64, 256, generator=g, dtype=torch.bfloat16, requires_grad=True)
            layer(x).sum().backward()
    assert weight_casts == ["blocked"]
    assert len(scales) == 2 and scales[0] is scales[1] and scales[0].dim() == 1


@pytest.mark.parametrize(
    "recipe,dtype,blocked",
    [("mxfp8", torch.bfloat16, True), ("mxfp4", torch.bfloat16, True),
     ("mxfp8_e5m2_grads", torch.bfloat16, True), ("mxfp8", torch.float32, False),
     ("mxfp6", torch.bfloat16, False)],
)  # fmt: skip
def test_blocked_scales_where_the_forward_gemm_runs_on_cublas(recipe, dtype, blocked, sm100):
    """The decision on a (mocked) sm100: blocked for the recipes whose forward GEMM auto
    sends to cuBLAS; not for fp32 layers (Triton, the fused path) nor fp6 (no MX GEMM)."""
    from mx_nn.casts import compute_path

    compute_path.clear_decisions()
    config = MXLinearConfig.from_recipe(recipe)
    assert compute_path.blocked_scales(sm100, config, dtype) is blocked
    compute_path.clear_decisions()


def test_no_blocked_scales_on_sm90(monkeypatch, sm100):
    from mx_nn.casts import compute_path

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    capability.cuda_capability.cache_clear()
    compute_path.clear_decisions()
    assert not compute_path.blocked_scales(sm100, MXLinearConfig(), torch.bfloat16)
    compute_path.clear_decisions()


def test_convert_refuses_a_gemm_backend_the_device_cannot_run():
    """An explicit cuBLAS backend on a device without it fails at convert, before any
    layer is swapped, naming the GEMM, the device and what is missing."""
    import mx_nn

    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    config = MXLinearConfig(gemm_backend="cublas")
    with pytest.raises(
        ValueError, match=r"gemm_backend='cublas' cannot run the Y GEMM .*cpu.*10\.x"
    ):
        mx_nn.convert(model, config)
    assert type(model[0]) is torch.nn.Linear
    meta = torch.nn.Sequential(torch.nn.Linear(64, 64, device="meta"))
    assert type(mx_nn.convert(meta, config)[0]).__name__ == "MXLinear"  # moved before it runs


def test_mxfp4_on_cublas_without_the_blockwise_api_is_refused_at_config_time(monkeypatch, sm100):
    from mx_nn.casts.compute_path import check_gemm_backends

    missing = "torch.nn.functional.scaled_mm with ScalingType.BlockWise1x32 is missing"
    monkeypatch.setattr(capability, "blockwise_api_gap", lambda: missing)
    config = MXLinearConfig.from_recipe("mxfp4", gemm_backend="cublas")
    with pytest.raises(ValueError, match="BlockWise1x32 is missing"):
        check_gemm_backends(config, sm100, "mx_nn.convert")
    # auto has another backend there (Triton's dot_scaled, logged) and is not refused
    check_gemm_backends(MXLinearConfig.from_recipe("mxfp4"), sm100, "mx_nn.convert")
    mixed = MXLinearConfig.from_recipe("mxfp8_e5m2_grads", gemm_backend="cublas")
    with pytest.raises(ValueError, match=r"the dX GEMM \(fp8_e5m2 x fp8_e4m3\)"):
        check_gemm_backends(mixed, sm100, "mx_nn.convert")
