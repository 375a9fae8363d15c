"""The cuBLAS backend without a B200: what ``prepare_cublas_args`` makes is passed to
PyTorch's own ops on meta tensors (``torch._scaled_mm`` for MXFP8,
``torch.nn.functional.scaled_mm`` for MXFP4), whose meta functions check layouts, sizes,
dtypes and scale counts as the CUDA ops do; perturbed operands must be refused there
(the checks are live); and what cuBLAS computes from those operands, modelled from the
cuBLAS documentation's scale layout, equals the emulated GEMM bit for bit.

What only a B200 can show: that cuBLAS itself computes that (packages/mx-kernels/README.md,
"Blackwell readiness")."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mx_core import MXTensor, quantize
from mx_kernels import scaled_mm, swizzle_scales
from mx_kernels.cublas import CublasArgs, prepare_cublas_args, run_cublas

E8, FP4 = torch.float8_e8m0fnu, torch.float4_e2m1fn_x2
F = torch.nn.functional
# M, K, N: rows not multiples of 128 (1, 5, 17, 133, 300), K // 32 not a multiple of 4
# (1, 3), N a multiple of 16 only.
SHAPES = [(133, 512, 528), (1, 32, 32), (17, 96, 48), (256, 1024, 512), (5, 96, 16),
          (300, 64, 272)]  # fmt: skip
FORMATS = ["fp8_e4m3", "fp4_e2m1"]


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def _operands(m, k, n, fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-20, 21, (m + n, 1), generator=g).float())
    x = torch.randn(m + n, k, generator=g) * scale
    return quantize(x[:m], fmt), quantize(x[m:], fmt)


def _on_meta(a: MXTensor, b: MXTensor, **kwargs) -> CublasArgs:
    """prepare_cublas_args run on the meta device (it is pure torch)."""
    meta = [t.to("meta") for t in (a.qdata, a.scale, b.qdata, b.scale)]
    return prepare_cublas_args(*meta, **kwargs)


def _meta_scale_count_fp4(rows: int, packed_k: int) -> int:
    return _ceil(rows, 128) * _ceil(-(-packed_k // 32), 4)


def call_meta(args: CublasArgs) -> torch.Tensor:
    """run_cublas on meta operands: PyTorch's own meta functions check them.

    torch 2.13's meta registration for scaled_mm counts fp4 scale elements from the
    packed K (``_check_scaled_mm_sizes_v2`` in ``torch/_meta_registrations.py``: its
    BlockWise1x32 branch takes ``self.shape[1]``, K // 2 bytes, as K), so for fp4 with
    ceil4(K // 64) != ceil4(K // 32) it refuses the correct count; only here is it given
    the count it expects (a prefix of the real scales), after checking that this is the
    one refusal. The correct count is checked against ``torch._scaled_mm``'s meta
    function, which counts fp4 from the unpacked K (test_fp4_scale_count_is_right)."""
    try:
        return run_cublas(args)
    except RuntimeError as e:
        if not args.fp4 or "for MX scaling scale_a must have" not in str(e):
            raise
        (m, packed_k), n = args.mat_a.shape, args.mat_b.shape[1]
        right = [_ceil(rows, 128) * _ceil(2 * packed_k // 32, 4) for rows in (m, n)]
        if [args.scale_a.numel(), args.scale_b.numel()] != right:
            raise  # not the miscount: a real refusal
        want_a, want_b = (_meta_scale_count_fp4(rows, packed_k) for rows in (m, n))
        assert f"scale_a must have {want_a} (got: {right[0]})" in str(e), str(e)
        return run_cublas(
            dataclasses.replace(args, scale_a=args.scale_a[:want_a], scale_b=args.scale_b[:want_b])
        )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_prepared_operands_pass_the_real_op(m, k, n, fmt):
    a, b = _operands(m, k, n, fmt)
    args = _on_meta(a, b)
    pack = 2 if fmt == "fp4_e2m1" else 1
    assert args.mat_a.device.type == "meta" and args.entry == (
        "torch.nn.functional.scaled_mm" if pack == 2 else "torch._scaled_mm"
    )
    # mat_a row-major [M, K], mat_b column-major [K, N]; fp4 as float4_e2m1fn_x2 bytes.
    assert args.mat_a.shape == (m, k // pack) and args.mat_a.stride() == (k // pack, 1)
    assert args.mat_b.shape == (k // pack, n) and args.mat_b.stride() == (1, k // pack)
    # Scales: 1-D e8m0 of ceil128(rows) * ceil4(K // 32) elements, what cuBLAS reads for
    # the unpacked K (fp4 included: its scales cover 32 elements, 16 bytes, each).
    assert args.scale_a.numel() == _ceil(m, 128) * _ceil(k // 32, 4)
    assert args.scale_b.numel() == _ceil(n, 128) * _ceil(k // 32, 4)
    out = call_meta(args)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16 and out.device.type == "meta"


TORCH_2_13 = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.xfail(
    not TORCH_2_13,
    strict=False,
    reason="torch 2.11's torch._scaled_mm meta function refuses fp4 operands at 133x512x528 "
    "and 256x1024x512 (seen on 2.11.0+cu130); run_cublas never sends fp4 to it",
)
def test_fp4_scale_count_is_right(m, k, n):
    """torch 2.13's torch._scaled_mm meta function counts fp4 scales from the unpacked K
    (the CUDA op takes fp4 only under ROCm, which is why run_cublas calls F.scaled_mm)."""
    args = _on_meta(*_operands(m, k, n, "fp4_e2m1"))
    out = torch._scaled_mm(args.mat_a, args.mat_b, args.scale_a, args.scale_b,
                           out_dtype=torch.bfloat16)  # fmt: skip
    assert out.shape == (m, n)


def test_fp4_meta_miscount_is_reproduced():
    """The one refusal call_meta works around, at the shape it was seen at."""
    args = _on_meta(*_operands(133, 512, 528, "fp4_e2m1"))
    with pytest.raises(RuntimeError, match=r"scale_a must have 2048 \(got: 4096\)"):
        run_cublas(args)


def _perturbed(args: CublasArgs):
    """(what changed, the meta function's words, perturbed args)."""
    replace = dataclasses.replace
    doubled = torch.cat([args.scale_b, args.scale_b])
    yield "row-major mat_b", "mat2 must be col_major", replace(args, mat_b=args.mat_b.contiguous())
    yield (
        "column-major mat_a",
        "self must be row_major",
        replace(args, mat_a=args.mat_a.t().contiguous().t()),
    )
    yield (
        "scale_a one element short",
        "scale_a (should|must) have",
        replace(args, scale_a=args.scale_a[:-1]),
    )
    yield "scale_b twice as long", "scale_b (should|must) have", replace(args, scale_b=doubled)
    yield "N not a multiple of 16", "divisible by 16", replace(args, mat_b=args.mat_b[:, :-8])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,k,n", [(133, 256, 528), (300, 64, 272)])
def test_meta_checks_are_live(m, k, n, fmt):
    """Drift in the preparation shows: the meta op refuses each perturbation."""
    args = _on_meta(*_operands(m, k, n, fmt))
    for what, words, bad in _perturbed(args):
        with pytest.raises(RuntimeError, match=words):
            call_meta(bad)
            pytest.fail(f"{fmt} {what}: accepted by the meta function")


def test_meta_refuses_plain_scales_and_the_wrong_swizzle():
    """Unswizzled [rows, K // 32] scales have too few elements for rows % 128 != 0, and
    F.scaled_mm checks the swizzle enum."""
    a, b = _operands(133, 256, 528, "fp8_e4m3")
    args = _on_meta(a, b)
    plain = dataclasses.replace(args, scale_a=a.scale.to("meta").flatten())
    with pytest.raises(RuntimeError, match="scale_a should have 2048 elements, got 1064"):
        run_cublas(plain)
    mx = F.ScalingType.BlockWise1x32
    with pytest.raises(RuntimeError, match="Must have swizzle type"):
        F.scaled_mm(args.mat_a, args.mat_b, args.scale_a, mx, args.scale_b, mx,
                    swizzle_a=F.SwizzleType.NO_SWIZZLE, swizzle_b=F.SwizzleType.NO_SWIZZLE,
                    output_dtype=torch.bfloat16)  # fmt: skip


def _blocked_offset(r: torch.Tensor, c: torch.Tensor, cols: int) -> torch.Tensor:
    """Where scale [r, c] lies in the blocked layout, as the cuBLAS documentation
    ("1D Block Scaling Factors Layout") writes it: 128x4 tiles in row-major tile order,
    512 bytes each, tile row 32 * r0 + r1 at byte 16 * r1 + 4 * r0 + c % 4."""
    tile = (r // 128) * (_ceil(cols, 4) // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def _scales_as_cublas_reads(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return blocked.view(torch.uint8)[_blocked_offset(r, c, cols)].view(E8)


def _cublas_model(args: CublasArgs, k: int) -> torch.Tensor:
    """What cuBLAS computes from the operands it is given (fp32 result): every element
    times the scale it reads for it, an exact fp32 accumulation (the emulated GEMM's
    matmul, so that the order of the sums is the same)."""
    fmt = "fp4_e2m1" if args.fp4 else "fp8_e4m3"
    a_q = args.mat_a.view(torch.uint8) if args.fp4 else args.mat_a
    b_q = args.mat_b.t().view(torch.uint8) if args.fp4 else args.mat_b.t()
    m, n = args.mat_a.shape[0], args.mat_b.shape[1]
    sa = _scales_as_cublas_reads(args.scale_a, m, k // 32)
    sb = _scales_as_cublas_reads(args.scale_b, n, k // 32)
    a_hp = MXTensor(a_q, sa, fmt, 32, 1, torch.float32).dequantize(torch.float32)
    b_hp = MXTensor(b_q, sb, fmt, 32, 1, torch.float32).dequantize(torch.float32)
    return a_hp @ b_hp.t()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_what_cublas_computes_is_the_emulated_gemm(m, k, n, fmt):
    a, b = _operands(m, k, n, fmt)
    args = prepare_cublas_args(a.qdata, a.scale, b.qdata, b.scale)
    assert torch.equal(args.mat_a.view(torch.uint8), a.qdata.view(torch.uint8))
    assert torch.equal(args.mat_b.t().view(torch.uint8), b.qdata.view(torch.uint8))
    emulated = scaled_mm(a.qdata, a.scale, b.qdata, b.scale, out_dtype=torch.float32,
                         backend="emulated")  # fmt: skip
    assert torch.equal(_cublas_model(args, k), emulated)


def test_blocked_scales_are_passed_on_without_a_copy():
    a, b = _operands(133, 256, 528, "fp8_e4m3")
    a_blocked, b_blocked = swizzle_scales(a.scale).flatten(), swizzle_scales(b.scale)
    args = prepare_cublas_args(a.qdata, a_blocked, b.qdata, b_blocked,
                               a_scale_layout="blocked", b_scale_layout="blocked")  # fmt: skip
    assert args.scale_a.data_ptr() == a_blocked.data_ptr()
    assert args.scale_b.data_ptr() == b_blocked.data_ptr() and args.scale_b.dim() == 1
    plain = prepare_cublas_args(a.qdata, a.scale, b.qdata, b.scale)
    assert torch.equal(args.scale_a.view(torch.uint8), plain.scale_a.view(torch.uint8))
    assert torch.equal(args.scale_b.view(torch.uint8), plain.scale_b.view(torch.uint8))
    meta = CublasArgs(
        mat_a=args.mat_a.to("meta"), mat_b=args.mat_b.to("meta"),
        scale_a=args.scale_a.to("meta"), scale_b=args.scale_b.to("meta"),
    )  # fmt: skip
    assert meta.mat_b.stride() == (1, 256)  # .to keeps the column-major strides
    assert call_meta(meta).shape == (133, 528)


def test_cublas_args_refuse_bad_scales():
    a, b = _operands(4, 64, 16, "fp8_e4m3")
    args = prepare_cublas_args(a.qdata, a.scale, b.qdata, b.scale)
    with pytest.raises(ValueError, match="scale_a must be 1-D float8_e8m0fnu"):
        dataclasses.replace(args, scale_a=a.scale)
    with pytest.raises(ValueError, match="mat_b must be 2-D"):
        dataclasses.replace(args, mat_b=args.mat_b.flatten())
    with pytest.raises(ValueError, match="a_scale_layout='swizzled'"):
        prepare_cublas_args(a.qdata, a.scale, b.qdata, b.scale, a_scale_layout="swizzled")


@pytest.mark.parametrize(
    "a_fmt,b_fmt,n,out,match",
    [("fp8_e4m3", "fp8_e4m3", 33, torch.bfloat16, "b_q has N=33 rows; cuBLAS needs N % 16"),
     ("fp8_e5m2", "fp8_e5m2", 32, torch.bfloat16, "both float8_e5m2"),
     ("fp8_e4m3", "fp8_e5m2", 32, torch.bfloat16, "e4m3 x e4m3 and fp4 x fp4 only"),
     ("fp8_e4m3", "fp8_e4m3", 32, torch.float32, "bf16 result only"),
     ("fp4_e2m1", "fp8_e4m3", 32, torch.bfloat16, "mix fp4 and fp8")],
)  # fmt: skip
def test_preparation_refuses_what_cublas_is_not_sent(a_fmt, b_fmt, n, out, match):
    g = torch.Generator().manual_seed(0)
    a, b = quantize(torch.randn(8, 64, generator=g), a_fmt), quantize(torch.randn(n, 64), b_fmt)
    with pytest.raises(ValueError, match=match):
        prepare_cublas_args(a.qdata, a.scale, b.qdata, b.scale, out_dtype=out)
