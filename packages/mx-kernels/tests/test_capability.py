"""Which CUDA device runs which MX GEMM backend (mx_kernels.capability and
resolve_matmul_backend), on mocked capabilities: sm90, the Blackwell families (sm100,
sm103, sm101/sm110 Thor, sm120/sm121), the torch API and build feature the MXFP4 GEMM
needs, and the combinations cuBLAS is not sent (fp32 results, e4m3 x e5m2)."""

from __future__ import annotations

import logging

import pytest
import torch

import mx_kernels
from mx_kernels import backend as backend_mod
from mx_kernels import capability
from mx_kernels.cublas import cublas_unsupported_reason, scaled_mm_cublas
from mx_kernels.matmul import bf16_gemm_design

E4, E5, FP4 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2
CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Returns set(capability): CUDA device queries answer that capability; the queries
    made are recorded in the list it returns; the capability cache is fresh."""
    queries: list[int] = []
    state = {"capability": (9, 0)}

    def get_device_capability(device=None):
        queries.append(device)
        return state["capability"]

    monkeypatch.setattr(torch.cuda, "get_device_capability", get_device_capability)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(backend_mod, "triton_available", lambda: True)
    monkeypatch.setattr(backend_mod, "LOGGED", set())
    capability.cuda_capability.cache_clear()

    def set_capability(cap: tuple[int, int]) -> list[int]:
        state["capability"] = cap
        capability.cuda_capability.cache_clear()
        return queries

    yield set_capability
    capability.cuda_capability.cache_clear()


@pytest.fixture
def mslk_build(monkeypatch):
    """A torch built with MSLK (MXFP4 on CUDA): the CPU build here has none."""
    monkeypatch.setattr(capability, "mxfp4_build_gap", lambda: None)


def _choose(backend: str, fp4: bool, unsupported: str | None = None) -> str:
    return backend_mod.resolve_matmul_backend(
        "scaled_mm", backend, CUDA, cublas_unsupported=unsupported, fp4=fp4
    )


# (capability, fp4, auto's choice, words of auto's logged reason, explicit cublas: "cublas"
# or words of its RuntimeError)
ROUTES = [
    ((9, 0), False, "triton", "sm90 has no block-scaled MMA", "sm90 has no block-scaled MMA"),
    ((9, 0), True, "triton", "sm90 has no block-scaled MMA", "compute capability 10.x"),
    ((10, 0), False, "cublas", "auto: sm100, MXFP8, torch._scaled_mm", "cublas"),
    ((10, 0), True, "cublas", "auto: sm100, MXFP4, torch.nn.functional.scaled_mm", "cublas"),
    ((10, 3), False, "cublas", "auto: sm103, MXFP8", "cublas"),
    ((10, 3), True, "cublas", "auto: sm103, MXFP4", "cublas"),
    ((10, 1), False, "triton", "sm101: the cuBLAS MX GEMM is not tested", "cublas"),
    ((10, 1), True, "triton", "sm101: the cuBLAS MX GEMM is not tested", "cublas"),
    ((11, 0), False, "triton", "sm110: the cuBLAS MX GEMM is not tested", "cublas"),
    ((11, 0), True, "triton", "MXFP4 on sm110", "MXFP4 on sm110: PyTorch's MXFP4 GEMM needs"),
    ((12, 0), False, "triton", "sm120: PyTorch's MX GEMM tests do not cover it", "cublas"),
    ((12, 0), True, "triton", "MXFP4 on sm120", "major 10 \\(_check_mxfp4_support\\)"),
    ((12, 1), False, "triton", "sm121: PyTorch's MX GEMM tests do not cover it", "cublas"),
    ((12, 1), True, "triton", "MXFP4 on sm121", "major 10 \\(_check_mxfp4_support\\)"),
]


@pytest.mark.parametrize("cap,fp4,auto,why,explicit", ROUTES)
def test_routing_per_family(cap, fp4, auto, why, explicit, fake_cuda, mslk_build, caplog):
    fake_cuda(cap)
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        assert _choose("auto", fp4) == auto
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and f"{auto} backend on cuda" in lines[0] and why in lines[0], lines
    if explicit == "cublas":
        assert _choose("cublas", fp4) == "cublas"
    else:
        with pytest.raises(RuntimeError, match=f"backend='cublas'.*cannot run: .*{explicit}"):
            _choose("cublas", fp4)


def test_older_gpus_have_no_mx_gemm_but_emulated(fake_cuda):
    fake_cuda((8, 0))
    with pytest.raises(RuntimeError, match="compute capability >= 9.0, got sm80"):
        _choose("auto", False)
    assert _choose("emulated", False) == "emulated"


def test_auto_logs_each_choice_once(fake_cuda, caplog):
    fake_cuda((10, 0))
    fp32 = cublas_unsupported_reason(E4, E4, 64, torch.float32)
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        for _ in range(3):
            assert _choose("auto", False) == "cublas"
            assert _choose("auto", False, fp32) == "triton"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "mx_kernels.scaled_mm: cublas backend on cuda (auto: sm100, MXFP8, torch._scaled_mm)",
        f"mx_kernels.scaled_mm: triton backend on cuda (auto: {fp32})",
    ]


def test_one_capability_query_per_device(fake_cuda):
    queries = fake_cuda((10, 0))
    for _ in range(3):
        for device in (torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda")):
            assert capability.device_capability(device) == (10, 0)
            _choose("auto", False)
    assert queries == [0, 1]  # "cuda" is the current device, 0
    assert capability.device_capability(torch.device("cpu")) is None


@pytest.mark.parametrize(
    "a,b,out,words",
    [(E4, E5, torch.bfloat16, "a_q is torch.float8_e4m3fn and b_q torch.float8_e5m2"),
     (E5, E4, torch.bfloat16, "e4m3 x e4m3 and fp4 x fp4 only"),
     (E4, E4, torch.float32, "out_dtype=torch.float32: PyTorch tests its MX GEMM with a bf16"),
     (E4, E4, torch.float16, "out_dtype=torch.float16"),
     (FP4, FP4, torch.float32, "out_dtype=torch.float32"),
     (E5, E5, torch.bfloat16, "both float8_e5m2"),
     (FP4, E4, torch.bfloat16, "mix fp4 and fp8")],
)  # fmt: skip
def test_untested_combinations_go_to_triton(a, b, out, words, fake_cuda, mslk_build, caplog):
    """e4m3 x e5m2 (mxfp8_e5m2_grads' dX and dW) and fp16/fp32 results: auto runs Triton
    and logs why; an explicit backend='cublas' refuses, naming the combination."""
    fake_cuda((10, 0))
    reason = cublas_unsupported_reason(a, b, 64, out)
    assert reason is not None and words in reason
    fp4 = a == b == FP4
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        assert _choose("auto", fp4, reason) == "triton"
    assert words in caplog.text
    with pytest.raises(ValueError, match="backend='cublas' cannot run these arguments"):
        _choose("cublas", fp4, reason)


def test_tested_combinations_go_to_cublas():
    for dtype in (E4, FP4, torch.uint8):
        assert cublas_unsupported_reason(dtype, dtype, 48, torch.bfloat16) is None
    assert "N % 16" in cublas_unsupported_reason(E4, E4, 40, torch.bfloat16)


def test_mxfp4_needs_the_build_feature(fake_cuda, monkeypatch):
    fake_cuda((10, 0))
    monkeypatch.setattr(capability, "mxfp4_build_gap", lambda: "no MSLK here")
    assert _choose("auto", True) == "triton"
    with pytest.raises(RuntimeError, match="cannot run: no MSLK here"):
        _choose("cublas", True)
    assert _choose("auto", False) == "cublas"  # MXFP8 needs neither


def test_mxfp4_needs_the_api(fake_cuda, mslk_build, monkeypatch):
    fake_cuda((10, 0))
    monkeypatch.delattr(torch.nn.functional, "scaled_mm")
    assert _choose("auto", True) == "triton"
    with pytest.raises(RuntimeError, match="this torch has no torch.nn.functional.scaled_mm"):
        _choose("cublas", True)


def test_api_found_by_feature_detection(monkeypatch):
    assert capability.blockwise_api_gap() is None  # torch 2.13 has it
    monkeypatch.setattr(torch.nn.functional, "SwizzleType", object())
    assert "SWIZZLE_32_4_4" in capability.blockwise_api_gap()
    monkeypatch.setattr(torch.nn.functional, "ScalingType", object())
    assert "BlockWise1x32" in capability.blockwise_api_gap()


@pytest.mark.parametrize(
    "config,built",
    [("USE_CUDA=1, USE_MSLK=ON, USE_NCCL=1", True), ("USE_FBGEMM_GENAI=1,", True),
     ("CXX_FLAGS= -DUSE_MSLK -O2", True), ("USE_MSLK=OFF, USE_FBGEMM=ON", False),
     ("CXX_FLAGS= -DUSE_FBGEMM -O2, USE_FBGEMM_GENAI=0", False), ("", False)],
)  # fmt: skip
def test_build_feature_read_from_the_config(config, built, monkeypatch):
    monkeypatch.setattr(torch.__config__, "show", lambda: config)
    capability.mxfp4_build_gap.cache_clear()
    try:
        assert (capability.mxfp4_build_gap() is None) == built
    finally:
        capability.mxfp4_build_gap.cache_clear()


def test_cublas_off_cuda_raises():
    a = torch.zeros(4, 64, dtype=E4)
    s = torch.zeros(4, 2, dtype=torch.float8_e8m0fnu)
    b, t = torch.zeros(16, 64, dtype=E4), torch.zeros(16, 2, dtype=torch.float8_e8m0fnu)
    match = "compute capability 10.x, got a cpu tensor"
    with pytest.raises(RuntimeError, match=f"backend='cublas' .*cannot run: .*{match}"):
        mx_kernels.scaled_mm(a, s, b, t, backend="cublas")
    with pytest.raises(RuntimeError, match=match):
        scaled_mm_cublas(a, s, b, t, torch.bfloat16)


@pytest.mark.parametrize(
    "cap,out,fused", [((9, 0), torch.bfloat16, True), ((10, 0), torch.bfloat16, False),
                      ((10, 0), torch.float32, True), ((12, 0), torch.bfloat16, True)],
)  # fmt: skip
def test_bf16_gemm_design_follows_the_routing(cap, out, fused, fake_cuda, monkeypatch):
    """Where auto runs Triton (its default design), MXLinear may fuse casts and GEMMs."""
    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    fake_cuda(cap)
    assert bf16_gemm_design(CUDA, "fp8_e4m3", "fp8_e4m3", out_dtype=out) is fused
