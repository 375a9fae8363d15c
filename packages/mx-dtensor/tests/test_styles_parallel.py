"""MXColwiseParallel, MXRowwiseParallel and MXSequenceParallel against PyTorch's own
styles under parallelize_module (2 gloo ranks), on a tiny MX-like linear: ``FakeMXLinear``
multiplies the fake-quantized (cast then decoded) input and weight, with straight-through
gradients, so forward and backward are the same arithmetic under either style and must
agree bit for bit. Also: the MX gather's bytes and its hook, the refusals at apply time
and at run time, and each style's repr.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate

import mx_kernels as mk
from mx_dtensor.testing import spawn

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")

K, N = 128, 64  # in and out features: 32 per rank at tp=2 on either split
BATCH, SEQ = 2, 64  # 32 tokens per rank


def _fake_mx(t: torch.Tensor) -> torch.Tensor:
    """t with the values of its rowwise MXFP8 cast; gradient straight through."""
    return t + (mk.fake_quantize_rowwise(t.detach(), "fp8_e4m3") - t.detach())


class FakeMXLinear(nn.Linear):
    """An nn.Linear whose GEMM reads the MX values of its input and weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_fake_mx(x), _fake_mx(self.weight), self.bias)


class Payload(torch.utils._python_dispatch.TorchDispatchMode):
    """The (collective, dtype, bytes) of each functional collective run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "_c10d_functional" and func.__name__.startswith(
            ("all_gather", "reduce_scatter", "all_reduce")
        ):
            self.sent.append((func.__name__.split(".")[0], args[0].dtype, args[0].nbytes))
        return func(*args, **(kwargs or {}))


def _run(style, module, mesh, x_local, grad_local):
    """(output, grad of the local input, full weight grad, forward and backward payloads)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    model = parallelize_module(copy.deepcopy(module), mesh, style)
    x = x_local.detach().clone().requires_grad_()
    with Payload() as fwd:
        y = model(x)
    local = y.to_local() if isinstance(y, DTensor) else y
    with Payload() as bwd:
        local.backward(grad_local)
    dx = x.grad.to_local() if isinstance(x.grad, DTensor) else x.grad
    return local.detach(), dx, model.weight.grad.full_tensor(), fwd.sent, bwd.sent


def _same(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a[:3], b[:3], strict=True))


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, NotImplementedError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from mx_core import CastSettings
    from mx_dtensor import (
        MXColwiseParallel,
        MXRowwiseParallel,
        MXSequenceParallel,
        register_gather_hook,
    )

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    linear = FakeMXLinear(K, N).to(torch.bfloat16)
    x = torch.randn(BATCH, SEQ, K, generator=g).to(torch.bfloat16)
    dy = torch.randn(BATCH, SEQ, N, generator=g).to(torch.bfloat16)
    out = {}

    # Colwise, replicated input: the same layouts and arithmetic as ColwiseParallel.
    dy_col = dy.chunk(world, dim=-1)[rank]
    mx = _run(MXColwiseParallel(), linear, mesh, x, dy_col)
    hp = _run(ColwiseParallel(), linear, mesh, x, dy_col)
    out["colwise replicated"] = _same(mx, hp) and mx[3] == hp[3] == []

    # Colwise from a sequence shard: the gather moves the MX cast, the module recasts the
    # decoded values to themselves, so output and every gradient match the bf16 gather.
    x_seq = x.chunk(world, dim=1)[rank]
    kw = {"input_layouts": Shard(1)}
    mx = _run(MXColwiseParallel(**kw), linear, mesh, x_seq, dy_col)
    hp = _run(ColwiseParallel(**kw), linear, mesh, x_seq, dy_col)
    out["colwise gathered exact"] = _same(mx, hp)
    # The same cast given as one CastSettings or as its four keywords: the same run.
    settings = {"fmt": "fp8_e4m3", "block_size": 32, "scale_mode": "rceil", "backend": "auto"}
    by_cast = MXColwiseParallel(**kw, cast=CastSettings(**settings))
    with pytest.warns(FutureWarning, match=r"^MXColwiseParallel\(fmt=..., block_size=..."):
        by_keywords = MXColwiseParallel(**kw, **settings)

    # parallelize_module itself sets each style's src_data_rank; the style sets nothing.
    def fields(style):
        return {k: v for k, v in vars(style).items() if k != "src_data_rank"}

    before = (fields(by_cast), fields(by_keywords))
    out["colwise cast forms"] = [
        _same(_run(style, linear, mesh, x_seq, dy_col), mx) for style in (by_cast, by_keywords)
    ]
    out["styles unchanged by apply"] = before == (fields(by_cast), fields(by_keywords))
    out["colwise gathered payload"] = (mx[3], hp[3])
    out["colwise gathered backward"] = mx[4] == hp[4]
    # A gather hook sees the gathered cast the module's input decodes (then is removed).
    seen = []
    handle = register_gather_hook(seen.append)
    _run(MXColwiseParallel(**kw), linear, mesh, x_seq, dy_col)
    handle.remove()
    _run(MXColwiseParallel(**kw), linear, mesh, x_seq, dy_col)
    (got,) = seen
    decoded = mk.dequantize_rowwise(got.qdata, got.scale, got.fmt, out_dtype=torch.bfloat16)
    out["hook"] = (
        len(seen),
        (type(got.decoded).__name__, got.decoded.placements, tuple(got.decoded.shape)),
        torch.equal(decoded, got.decoded.to_local()),
        (got.fmt, got.block_size, got.scale_mode, got.backend),
        got.cast == CastSettings(),
    )
    # The same from a DTensor input, as a sequence-parallel region hands it over.
    dt = DTensor.from_local(x_seq, mesh, (Shard(1),))
    out["colwise DTensor input"] = _same(
        _run(MXColwiseParallel(**kw), linear, mesh, dt, dy_col), hp
    )
    # Shard(-1), the blocked dim: PyTorch's high-precision gather, logged.
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logger = logging.getLogger("mx_dtensor")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    x_k = x.chunk(world, dim=-1)[rank]
    kw = {"input_layouts": Shard(-1), "output_layouts": Replicate()}
    mx = _run(MXColwiseParallel(**kw), linear, mesh, x_k, dy)
    out["colwise Shard(-1)"] = (_same(mx, _run(ColwiseParallel(**kw), linear, mesh, x_k, dy)),
                                records)  # fmt: skip
    logger.removeHandler(handler)

    # Rowwise: RowwiseParallel's layouts, the Partial output reduced in bf16.
    for name, layouts in (("rowwise", {}), ("rowwise to Shard(1)", {"output_layouts": Shard(1)})):
        grad = dy.chunk(world, dim=1)[rank] if layouts else dy
        mx = _run(MXRowwiseParallel(**layouts), linear, mesh, x_k, grad)
        hp = _run(RowwiseParallel(**layouts), linear, mesh, x_k, grad)
        out[name] = _same(mx, hp) and mx[3] == hp[3] and mx[3][0][1] == torch.bfloat16

    # Sequence parallel over a replicated MX linear on the sequence shard.
    seq_mx = _run(MXSequenceParallel(), linear, mesh, x_seq, dy.chunk(world, dim=1)[rank])
    seq_hp = _run(SequenceParallel(), linear, mesh, x_seq, dy.chunk(world, dim=1)[rank])
    out["sequence"] = _same(seq_mx, seq_hp)
    model = parallelize_module(copy.deepcopy(linear), mesh, MXSequenceParallel())
    model.fqn = "layers.0.mlp"
    out["tokens, local shard"] = _error(lambda: model(x[:, :16]))
    odd = DTensor.from_local(x[:, :24], mesh, (Shard(1),))  # 48 tokens: 24 per rank
    out["tokens, DTensor"] = _error(lambda: model(odd))

    # Refusals when applied.
    def apply(style, module):
        return lambda: parallelize_module(module, mesh, style)

    named = FakeMXLinear(K, 96)
    named.fqn = "layers.0.attention.wq"
    out["colwise out_features"] = _error(apply(MXColwiseParallel(), named))
    out["colwise in_features"] = _error(apply(MXColwiseParallel(), nn.Linear(48, N)))
    out["rowwise in_features"] = _error(apply(MXRowwiseParallel(), nn.Linear(96, N)))
    out["rowwise embedding"] = _error(apply(MXRowwiseParallel(), nn.Embedding(64, 64)))
    bs64 = MXColwiseParallel(cast=CastSettings(block_size=64))
    out["colwise block_size=64"] = _error(apply(bs64, linear))
    out["reprs"] = [
        repr(MXColwiseParallel(input_layouts=Shard(1))),
        repr(MXRowwiseParallel(output_layouts=Shard(1))),
        repr(MXSequenceParallel()),
    ]
    return out


def test_styles_against_pytorch_two_ranks():
    for r in spawn(_worker, 2):
        assert r["colwise replicated"]
        assert r["colwise gathered exact"] and r["colwise DTensor input"]
        mx_sent, hp_sent = r["colwise gathered payload"]
        assert [(op, dt) for op, dt, _ in mx_sent] == [("all_gather_into_tensor", torch.uint8)] * 2
        assert [(op, dt) for op, dt, _ in hp_sent] == [("all_gather_into_tensor", torch.bfloat16)]
        ratio = sum(n for *_, n in mx_sent) / sum(n for *_, n in hp_sent)
        assert ratio <= 0.55 and ratio == pytest.approx((1 + 1 / 32) / 2)
        assert r["colwise gathered backward"]  # one reduce-scatter of dX, in bf16
        assert r["colwise cast forms"] == [True, True] and r["styles unchanged by apply"]
        n_calls, decoded, exact, cast, settings = r["hook"]
        assert n_calls == 1 and exact  # called once, not after its handle's remove()
        assert decoded == ("DTensor", (Replicate(),), (BATCH, SEQ, K))
        assert cast == ("fp8_e4m3", 32, "rceil", "auto") and settings
        same, log = r["colwise Shard(-1)"]
        assert same and log == [
            "mx_dtensor.MXColwiseParallel: Shard(dim=-1) -> Replicate() gathers in high "
            "precision (the MX blocks run along the last dim)"
        ]
        assert r["rowwise"] and r["rowwise to Shard(1)"]
        assert r["sequence"]
        assert r["tokens, local shard"] == (
            "ValueError: MXSequenceParallel: FakeMXLinear 'layers.0.mlp' (in_features=128, "
            "out_features=64): tokens per rank along dim 1 must be a multiple of block_size=32 "
            "(the MX columnwise casts of the linears' inputs block along the tokens); this "
            "rank's shard (2, 16, 128) has 16 tokens (32 in all) at tp=2. Pad the sequence by "
            "32 to 64 tokens (a multiple of 32 x 2)"
        )
        assert "input shape (2, 48, 128) gives [24] tokens per rank" in r["tokens, DTensor"]
        assert "Pad the sequence by 16 to 64 tokens" in r["tokens, DTensor"]
        assert r["colwise out_features"] == (
            "ValueError: MXColwiseParallel: FakeMXLinear 'layers.0.attention.wq' "
            "(in_features=128, out_features=96): out_features=96 splits into [48] per rank at "
            "tp=2, not a multiple of block_size=32: MX casts need whole blocks on every rank"
        )
        assert (
            "Linear (in_features=48, out_features=64): in_features=48 is unsplit"
            in r["colwise in_features"]
        )
        assert "in_features=96 splits into [48] per rank at tp=2" in r["rowwise in_features"]
        assert r["rowwise embedding"].startswith(
            "NotImplementedError: MXRowwiseParallel shards linears"
        )
        assert "use RowwiseParallel for other modules" in r["rowwise embedding"]
        assert (
            "out_features=64 splits into [32] per rank at tp=2, not a multiple of "
            "block_size=64" in r["colwise block_size=64"]
        )
        col, row, seq = r["reprs"]
        assert col == (
            "MXColwiseParallel(input_layouts=(Shard(dim=1),), output_layouts=(Shard(dim=-1),), "
            "use_local_output=True, cast=CastSettings(fmt='fp8_e4m3', block_size=32, "
            "scale_mode='rceil', backend='auto'))"
        )
        assert row == (
            "MXRowwiseParallel(input_layouts=(Shard(dim=-1),), output_layouts=(Shard(dim=1),), "
            "use_local_output=True, block_size=32)"
        )
        assert seq == "MXSequenceParallel(sequence_dim=1, use_local_output=False, block_size=32)"
