"""The fake-quantize ops' inline overloads: the default overloads' values, an op on CPU
(eager and compiled), and, traced as AOTAutograd traces them on CUDA tensors, the cast
kernel's launch in place of the op."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import mx_kernels
from mx_core.testing import assert_same_bits

OPS = ["fake_quantize_rowwise", "fake_quantize_colwise", "fake_quantize_both"]


def _x(shape=(64, 96), dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return torch.randn(shape, generator=g).to(dtype)


def _tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("op", OPS)
def test_inline_gives_the_default_values(op, backend):
    fn = getattr(mx_kernels, op)
    x = _x()
    want = _tuple(fn(x, backend=backend))
    got = _tuple(fn(x, backend=backend, inline=True))  # plain eager: the plan
    via_op = _tuple(fn(x.requires_grad_(), backend=backend, inline=True))  # dispatched
    for g, v, w in zip(got, via_op, want, strict=True):
        assert_same_bits(g, w)
        assert_same_bits(v.detach(), w)


def test_inline_must_be_a_bool():
    with pytest.raises(TypeError, match="fake_quantize_both: inline must be a bool, got 1"):
        mx_kernels.fake_quantize_both(_x(), inline=1)


def test_compiled_on_cpu_the_inline_overload_stays_an_op():
    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    from torch._dynamo.backends.common import aot_autograd

    def f(x):
        row, col = mx_kernels.fake_quantize_both(x, backend="triton", inline=True)
        return row * 2, col

    x = _x()
    torch._dynamo.reset()
    got = torch.compile(f, backend=aot_autograd(fw_compiler=backend), fullgraph=True)(x)
    assert "mx.fake_quantize_both.inline" in ops
    for g, w in zip(got, f(x), strict=True):
        assert_same_bits(g, w)


# Traced in a process without TRITON_INTERPRET (which the conftest sets), so that the
# kernel is a JIT function as on a GPU; the tensors are fake CUDA tensors. On this
# machine Triton cannot analyse which arguments the kernel writes (no GPU driver) and
# takes them all as written; on a GPU it finds the outputs.
_TRACE = r"""
import json, os, torch, mx_kernels
from torch.fx.experimental.proxy_tensor import make_fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

def trace(name, overload, shape, device, **kw):
    op = getattr(getattr(torch.ops.mx, name), overload)
    args = (kw.get("fmt", "fp8_e4m3"), kw.get("block_size", 32), "rceil", kw.get("backend", "auto"))
    with FakeTensorMode():
        x = torch.empty(shape, device=device, dtype=torch.bfloat16)
    gm = make_fx(dispatch_functionalize(lambda x: op(x, *args)), tracing_mode="fake")(x)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    launches = [n for n in nodes if "triton_kernel_wrapper" in str(n.target)]
    kernel = None
    if launches:
        k = kernel_side_table.get_kernel(launches[0].kwargs["kernel_idx"])
        kernel = getattr(getattr(k, "fn", k), "__name__", str(k))
        kw_ = launches[0].kwargs["kwargs"]
        flags = {f: kw_[f] for f in ("ROWWISE", "COLWISE", "DEQ", "M", "K")}
    else:
        flags = None
    out = gm.graph.output_node().args[0]
    outs = [list(o.meta["val"].shape) for o in (out if isinstance(out, (list, tuple)) else [out])]
    return {"mx_ops": [str(n.target) for n in nodes if str(n.target).startswith("mx.")],
            "launches": len(launches), "kernel": kernel, "flags": flags, "outs": outs}

cuda = "cuda"
print(json.dumps({
    "both": trace("fake_quantize_both", "inline", (64, 128), cuda),
    "colwise": trace("fake_quantize_colwise", "inline", (64, 128), cuda),
    "rowwise_3d": trace("fake_quantize_rowwise", "inline", (2, 64, 128), cuda),
    "default": trace("fake_quantize_both", "default", (64, 128), cuda),
    "cpu": trace("fake_quantize_both", "inline", (64, 128), "cpu", backend="triton"),
    "reference": trace("fake_quantize_both", "inline", (64, 128), cuda, backend="reference"),
    "no_triton_block": trace("fake_quantize_both", "inline", (256, 256), cuda, block_size=256),
}))
os.environ["MX_KERNELS_INLINE"] = "0"
print(json.dumps({"switched_off": trace("fake_quantize_both", "inline", (64, 128), cuda)}))
"""


@pytest.fixture(scope="module")
def traced():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", _TRACE], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    *_, cases, off = run.stdout.strip().splitlines()
    return {**json.loads(cases), **json.loads(off)}


def test_traced_on_cuda_the_inline_overload_is_the_kernel_launch(traced):
    both, col, row3 = traced["both"], traced["colwise"], traced["rowwise_3d"]
    for t in (both, col, row3):
        assert t["mx_ops"] == [] and t["launches"] == 1 and t["kernel"] == "mx_cast_kernel"
        assert t["flags"]["DEQ"] is True
    assert both["flags"] == {"ROWWISE": True, "COLWISE": True, "DEQ": True, "M": 64, "K": 128}
    assert both["outs"] == [[64, 128], [64, 128]]
    assert (col["flags"]["ROWWISE"], col["flags"]["COLWISE"]) == (False, True)
    assert (row3["flags"]["ROWWISE"], row3["flags"]["COLWISE"]) == (True, False)
    assert (row3["flags"]["M"], row3["outs"]) == (128, [[2, 64, 128]])  # [B, S, K] as rows


@pytest.mark.parametrize("case", ["default", "cpu", "reference", "no_triton_block", "switched_off"])
def test_traced_where_no_kernel_would_run_the_op_stays(traced, case):
    t = traced[case]
    assert t["launches"] == 0 and len(t["mx_ops"]) == 1
    overload = "default" if case == "default" else "inline"
    assert t["mx_ops"] == [f"mx.fake_quantize_both.{overload}"]
