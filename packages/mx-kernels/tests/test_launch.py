"""The host-side launch path: op registration, the direct call of op bodies in plain
eager code, and the cached kernel launcher: its keys, and its launches run on CPU
through mx_kernels.testing (on the GPU, tools/bench/host_cost.py --check)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mx_core
import mx_kernels
from mx_core.testing import assert_same_bits
from mx_kernels import cast_launch, cast_plan, launch
from mx_kernels.launch import KernelLauncher, specialization_key
from mx_kernels.library import may_skip_dispatch
from mx_kernels.testing import cpu_cached_launches

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
    launcher = cast_launch.launch_config("rowwise", "fp8_e4m3", 32, "rceil", None, False, True)[1]
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


# The cached launch path (CUDA only on real hardware) run on CPU: mx_kernels.testing's
# stand-in for the compiled kernel checks each cached launch's specialization and runs
# the kernel in the interpreter on exactly the arguments the cached path passed.


def _inputs():
    base = torch.randn(65, 130, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    return {
        "contiguous": base[:64, :64].contiguous(),
        "row slice": base[:64, :64],
        "row slice (unaligned)": base[1:65, :64],  # 260-byte rows: data_ptr % 16 == 4
        "transposed": base[:64, :64].t(),
    }


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", CASTS)
def test_cached_launches_give_the_reference_bits(name):
    fn = getattr(mx_kernels, name)
    inputs = _inputs()
    want = {k: _as_tuple(fn(x, backend="reference")) for k, x in inputs.items()}
    with cpu_cached_launches() as counts:
        for _ in range(2):  # the JIT's launch (compiling), then the cached one
            for k, x in inputs.items():
                for got, ref in zip(_as_tuple(fn(x, backend="triton")), want[k], strict=True):
                    assert got.shape == ref.shape and got.stride() == ref.stride(), k
                    assert_same_bits(got, ref)
    # one compiled kernel per specialization: the unaligned slice has its own
    assert counts["compiled"] == 4 and counts["cached"] == 4


@pytest.mark.parametrize("name", CASTS)
def test_cached_op_launches_give_the_op_layout(name):
    """The op (what torch.compile's code calls) plans its own, contiguous, layout."""
    x = _inputs()["row slice (unaligned)"]
    op = getattr(torch.ops.mx, name).default
    want = _as_tuple(op(x, "fp8_e4m3", 32, "rceil", "reference"))
    with cpu_cached_launches() as counts:
        for _ in range(2):
            outs = _as_tuple(op(x, "fp8_e4m3", 32, "rceil", "triton"))
            for got, ref in zip(outs, want, strict=True):
                assert got.is_contiguous() and got.shape == ref.shape
                assert_same_bits(got, ref)
    assert counts["compiled"] == 1 and counts["cached"] == 1


@pytest.mark.parametrize("name", ["quantize_rowwise", "fake_quantize_rowwise"])
def test_cached_launches_of_higher_rank_inputs(name):
    """A 3-D x is read in place where it views as [M, K], else from a copy."""
    fn = getattr(mx_kernels, name)
    base = torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(1))
    for x in (base, base.permute(1, 0, 2)):  # viewable as [128, 64]; not viewable
        want = _as_tuple(fn(x, backend="reference"))
        with cpu_cached_launches() as counts:
            for _ in range(2):
                for got, ref in zip(_as_tuple(fn(x, backend="triton")), want, strict=True):
                    assert got.shape == ref.shape
                    assert_same_bits(got, ref)
        assert counts["cached"] == 1


def test_cached_both_fp4_of_k_strided_input_reads_a_copy():
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(2)).t()
    want = mx_kernels.quantize_both(x, "fp4_e2m1", backend="reference")
    with cpu_cached_launches() as counts:
        for _ in range(2):
            got = mx_kernels.quantize_both(x, "fp4_e2m1", backend="triton")
            for g, w in zip(got, want, strict=True):
                assert_same_bits(g, w)
    assert counts["cached"] == 1


def test_cached_generic_launch():
    """cast_launch.launch_cast (the benchmarks' entry) through KernelLauncher's own cache."""
    x = _inputs()["transposed"]
    f = mx_core.get_format("fp8_e4m3")
    want = mx_kernels.quantize_rowwise(x, backend="reference")
    with cpu_cached_launches() as counts:
        for _ in range(2):
            q, s = cast_launch.empty_cast(x.shape, f, 32, x.device)
            cast_launch.launch_cast(x, f, 32, "rceil", q, s, None, None)
            assert_same_bits(q, want[0])
            assert_same_bits(s, want[1])
    assert counts["compiled"] == 1 and counts["cached"] == 1


def test_launch_hooks_and_the_switch_bypass_the_cache(monkeypatch):
    from triton import knobs

    x = _inputs()["contiguous"]
    want = mx_kernels.quantize_rowwise(x, backend="reference")
    hook = knobs.runtime.launch_enter_hook
    with cpu_cached_launches() as counts:
        mx_kernels.quantize_rowwise(x, backend="triton")
        if hasattr(hook, "add"):
            hook.add(lambda metadata: None)
            undo = hook.calls.clear
        else:
            knobs.runtime.launch_enter_hook = lambda metadata: None
            undo = lambda: setattr(knobs.runtime, "launch_enter_hook", hook)  # noqa: E731
        try:
            got = mx_kernels.quantize_rowwise(x, backend="triton")
        finally:
            undo()
        assert counts["compiled"] == 1 and counts["cached"] == 0  # Triton's path ran
        assert_same_bits(got[0], want[0])
        mx_kernels.quantize_rowwise(x, backend="triton")
        assert counts["cached"] == 1
    monkeypatch.setenv("MX_KERNELS_CACHED_LAUNCH", "0")  # read on each launch
    with cpu_cached_launches() as counts:
        for _ in range(2):
            assert_same_bits(mx_kernels.quantize_rowwise(x, backend="triton")[0], want[0])
    assert counts["compiled"] == 0 and counts["cached"] == 0


def test_check_mode_catches_a_kernel_reused_for_another_specialization(monkeypatch):
    base = torch.randn(65, 130, dtype=torch.bfloat16)
    aligned, unaligned = base[:64, :64], base[1:, :64]  # one plan: same shape and strides
    monkeypatch.setenv("MX_KERNELS_CHECK_LAUNCH", "1")  # read on each cached launch
    with cpu_cached_launches() as counts:
        for _ in range(2):
            for x in (aligned, unaligned):
                mx_kernels.fake_quantize_rowwise(x, backend="triton")
        assert counts["compiled"] == 2 and counts["cached"] == 2  # checked, and equal
        plan = cast_plan.plan_for(
            "fake_quantize_rowwise", True, aligned, "fp8_e4m3", 32, "rceil", "triton"
        )
        compiled = plan.launch._compiled
        compiled[0] = compiled[unaligned.data_ptr() & 15]  # a wrong entry
        with pytest.raises(RuntimeError, match="the kernel compiled for"):
            mx_kernels.fake_quantize_rowwise(aligned, backend="triton")


def test_the_stream_is_the_drivers_current_one(monkeypatch):
    """Cached launches go to the stream Triton's JIT would pick: its driver's current
    stream of the current device (the getter is bound once, on the first launch)."""
    from triton.runtime import driver

    class Driver:
        def get_current_device(self):
            return 3

        def get_current_stream(self, device):
            return 100 + device

    monkeypatch.setattr(driver, "_active", Driver())
    monkeypatch.setattr(launch, "current_stream", launch._bind_current_stream)
    if hasattr(torch._C, "_cuda_getDevice"):  # a CUDA build asks torch for the device
        monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 3)
    assert launch.current_stream() == 103
    assert launch.current_stream is not launch._bind_current_stream
    assert launch.current_stream() == 103
