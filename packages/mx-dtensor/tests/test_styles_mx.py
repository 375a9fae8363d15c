"""PrepareMXModuleInput and mx_all_gather: the MX sequence-parallel gather.

The claims the style rests on, checked here: (1) casting again the decoded values of an
MX cast along the same blocks gives the same values (every scale mode, fp8 and fp4), so
an MX linear after the gather sees what it would after a high-precision gather; (2) a
rowwise cast of a sequence shard equals the rows of the cast of the gathered tensor, so
the gather's output is bit-exact; (3) the payload is the codes and scales, <= 0.55x bf16.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate

import mx_kernels as mk
from mx_dtensor.testing import spawn

MODES = ("floor", "ceil", "even", "rceil")
FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1")


def _roundtrip(x: torch.Tensor, fmt: str, mode: str) -> torch.Tensor:
    q, s = mk.quantize_rowwise(x, fmt, scale_mode=mode, backend="reference")
    return mk.dequantize_rowwise(q, s, fmt, out_dtype=x.dtype, backend="reference")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_recasting_decoded_values_reproduces_them(fmt, mode, dtype):
    g = torch.Generator().manual_seed(0)
    # Wide magnitudes per block, plus blocks whose amax sits just above a power of two
    # and just above the format's half-max (where a scale could move by one).
    x = torch.randn(64, 256, generator=g) * torch.exp2(torch.randint(-20, 20, (64, 1), generator=g))
    x[:8, ::32] = torch.exp2(torch.arange(8.0))[:, None] * 1.0001
    x[8:16, ::32] = 232.0 * torch.exp2(torch.arange(8.0))[:, None]
    x = x.to(dtype)
    once = _roundtrip(x, fmt, mode)
    twice = _roundtrip(once, fmt, mode)
    assert torch.equal(once.view(torch.uint8), twice.view(torch.uint8))
    # And the fused fake cast MXLinear uses on CPU agrees.
    fake = mk.fake_quantize_rowwise(once, fmt, scale_mode=mode, backend="reference")
    assert torch.equal(fake.view(torch.uint8), once.view(torch.uint8))


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.utils._python_dispatch import TorchDispatchMode

    from mx_core import CastSettings
    from mx_dtensor import PrepareMXModuleInput, mx_all_gather

    class Payload(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sent: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "_c10d_functional" and func.__name__.startswith(
                ("all_gather", "reduce_scatter")
            ):
                self.sent.append((func.__name__.split(".")[0], args[0].nbytes))
            return func(*args, **(kwargs or {}))

    mesh = init_device_mesh("cpu", (world,))
    out = {}
    g = torch.Generator().manual_seed(1)
    full = torch.randn(2, 32 * world, 128, generator=g).to(torch.bfloat16)
    local = full.chunk(world, dim=1)[rank].clone().requires_grad_()
    with Payload() as fwd:
        gathered = mx_all_gather(local, mesh, 1)
    out["exact"] = torch.equal(
        gathered.view(torch.uint8), _roundtrip(full, "fp8_e4m3", "rceil").view(torch.uint8)
    )
    out["forward payload"] = fwd.sent
    # One CastSettings or its four keywords: the same gather.
    floor = _roundtrip(full, "fp8_e5m2", "floor").view(torch.uint8)
    by_cast = mx_all_gather(
        local.detach(), mesh, 1, cast=CastSettings(fmt="fp8_e5m2", scale_mode="floor")
    )
    with pytest.warns(FutureWarning, match=r"^mx_all_gather\(fmt=..., scale_mode=...\) is dep"):
        by_keywords = mx_all_gather(local.detach(), mesh, 1, fmt="fp8_e5m2", scale_mode="floor")
    out["cast forms"] = [torch.equal(g.view(torch.uint8), floor) for g in (by_cast, by_keywords)]
    out["bf16 bytes"] = local.nbytes
    grad_full = torch.randn(world, *full.shape, generator=g).to(torch.bfloat16)
    with Payload() as bwd:
        gathered.backward(grad_full[rank])
    want = grad_full.float().sum(0).to(torch.bfloat16).chunk(world, dim=1)[rank]
    out["backward is a reduce-scatter"] = (
        bwd.sent == [("reduce_scatter_tensor", full.nbytes)],
        (local.grad.float() - want.float()).abs().max().item(),
    )
    # The style on a module: a DTensor Shard(1) input comes out Replicate, MX-gathered,
    # and the partial gradients of its consumer are reduce-scattered once.
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        parallelize_module,
    )

    layouts = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
    style = PrepareMXModuleInput(**layouts)
    grads, seen = [], []
    by_cast = PrepareMXModuleInput(**layouts, cast=CastSettings(block_size=32))
    with pytest.warns(FutureWarning, match=r"^PrepareMXModuleInput\(block_size=...\) is dep"):
        by_keywords = PrepareMXModuleInput(**layouts, block_size=32)
    for prepare in (style, PrepareModuleInput(**layouts), by_cast, by_keywords):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False)).to(torch.bfloat16)
        model[0].register_forward_hook(lambda m, args, y: seen.append(args[0]) and None)
        parallelize_module(model, mesh, prepare)
        parallelize_module(model, mesh, {"0": ColwiseParallel()})
        leaf = local.detach().clone().requires_grad_()
        model(DTensor.from_local(leaf, mesh, (Shard(1),))).float().sum().backward()
        grads.append(leaf.grad)
    out["style output"] = (type(seen[0]).__name__, seen[0].placements)
    out["style exact"] = torch.equal(
        seen[0].to_local().view(torch.uint8), gathered.detach().view(torch.uint8)
    )
    # With dY = 1, dX = dY W reads no X: the same gradient as the bf16 gather, bit for bit.
    out["style grad"] = (grads[0].shape == local.shape, torch.equal(grads[0], grads[1]))
    out["style cast forms"] = [
        torch.equal(seen[i].to_local().view(torch.uint8), seen[0].to_local().view(torch.uint8))
        and torch.equal(grads[i], grads[0])
        for i in (2, 3)
    ]
    out["style repr"] = repr(style)
    try:
        PrepareMXModuleInput(
            input_layouts=Shard(1), desired_input_layouts=Replicate(), use_local_output=True
        )
        out["use_local_output"] = "no error"
    except ValueError as e:
        out["use_local_output"] = str(e)
    try:
        mx_all_gather(local, mesh, -1)
        out["last dim"] = "no error"
    except ValueError as e:
        out["last dim"] = str(e)
    return out


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is unavailable")
def test_mx_all_gather_two_ranks():
    for r in spawn(_worker, 2):
        assert r["exact"] and r["cast forms"] == [True, True]
        (codes, n_codes), (scales, n_scales) = r["forward payload"]
        assert codes == scales == "all_gather_into_tensor"
        ratio = (n_codes + n_scales) / r["bf16 bytes"]
        assert ratio <= 0.55 and ratio == pytest.approx((1 + 1 / 32) / 2)
        is_rs, err = r["backward is a reduce-scatter"]
        assert is_rs and err <= 2**-6  # bf16 partial sums of 2 ranks vs an fp32 sum
        assert r["style output"] == ("DTensor", (Replicate(),)) and r["style exact"]
        assert r["style grad"] == (True, True) and r["style cast forms"] == [True, True]
        assert r["style repr"].startswith("PrepareMXModuleInput(input_layouts=(Shard(dim=1),)")
        assert r["style repr"].endswith(
            "cast=CastSettings(fmt='fp8_e4m3', block_size=32, scale_mode='rceil', backend='auto'))"
        )
        assert "use_local_output=True is not supported" in r["use_local_output"]
        assert "is the blocked (last) dim" in r["last dim"]
