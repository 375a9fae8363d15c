"""The host-side launch path: op registration, the direct call of op bodies in plain
eager code, and the cached kernel launcher's keys (its CUDA launches are checked on the
GPU by tools/bench/host_cost.py --check)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mx_kernels
from mx_core.testing import assert_same_bits
from mx_kernels import cast_launch
from mx_kernels.launch import KernelLauncher, specialization_key
from mx_kernels.library import may_skip_dispatch

CASTS = [
    "quantize_rowwise", "quantize_colwise", "quantize_both",
    "fake_quantize_rowwise", "fake_quantize_colwise", "fake_quantize_both",
]  # fmt: skip


class _SeenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", CASTS)
def test_direct_call_equals_the_op_and_modes_still_see_the_op(name):
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    fn = getattr(mx_kernels, name)
    direct = fn(x, backend="triton")
    with _SeenOps() as mode:  # a dispatch mode must see the op: the call goes through it
        via_op = fn(x, backend="triton")
    assert f"mx.{name}.default" in mode.ops
    direct = direct if isinstance(direct, tuple) else (direct,)
    via_op = via_op if isinstance(via_op, tuple) else (via_op,)
    for got, want in zip(direct, via_op, strict=True):
        assert got.stride() == want.stride()
        assert_same_bits(got, want)


def test_may_skip_dispatch_only_for_plain_eager_tensors():
    x = torch.randn(4, 32)
    assert may_skip_dispatch(x)
    assert may_skip_dispatch(torch.nn.Parameter(x, requires_grad=False))
    assert not may_skip_dispatch(x.clone().requires_grad_())
    with torch.no_grad():
        assert may_skip_dispatch(x.clone().requires_grad_())
    with _SeenOps():
        assert not may_skip_dispatch(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not may_skip_dispatch(x)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as fake:
        assert not may_skip_dispatch(fake.from_tensor(x))


def test_compiled_public_function_calls_the_op():
    x = torch.randn(64, 128)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return gm

    out = torch.compile(mx_kernels.fake_quantize_rowwise, backend=backend, fullgraph=True)(x)
    assert "mx.fake_quantize_rowwise.default" in seen
    assert_same_bits(out, mx_kernels.fake_quantize_rowwise(x))


def test_specialization_key_separates_dtype_alignment_and_ints():
    base = torch.empty(64, dtype=torch.uint8)
    key = specialization_key((base, base[16:], 8, 1), tensors=2)
    assert key == ((torch.uint8, 0), (torch.uint8, 0), 8, 1)
    assert specialization_key((base[1:], base, 8, 1), 2) != key  # misaligned pointer
    assert specialization_key((base.view(torch.int8), base, 8, 1), 2) != key
    assert specialization_key((base, base, 16, 1), 2) != key


def test_launcher_needs_constexprs_last_and_counts_arguments():
    from mx_kernels.cast_triton import mx_cast_kernel

    with pytest.raises(ValueError, match="constexprs must come last"):
        KernelLauncher(mx_cast_kernel, {"BLOCK_M": 8, "M": 4}, tensors=5)
    launcher = cast_launch._launch_config(
        "rowwise", "fp8_e4m3", 32, "rceil", None, False, True
    )[1]
    assert launcher.n_runtime == 12 and launcher.tensors == 5
    with pytest.raises(TypeError, match="12 runtime arguments, got 1"):
        launcher((1,), torch.empty(1))


def test_launch_hooks_send_launches_through_triton():
    from triton import knobs

    from mx_kernels.launch import _hooked

    assert not _hooked(None)
    assert not _hooked(knobs.runtime.launch_enter_hook)  # nothing set: the cached path
    assert _hooked(lambda metadata: None)
    chain = type(knobs.runtime.launch_enter_hook)()
    chain.add(lambda metadata: None)
    assert _hooked(chain)
