"""The casts' ``scale_layout="blocked"`` on DTensors: a Replicate x gives Replicate
outputs bit-identical to the cast of the full tensor, with no collective; a sharded x is
refused before any communication (a blocked scale of a shard is not a shard of the
blocked scale). Two ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import mx_dtensor
import mx_kernels as mk

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")

CASTS = ["quantize_rowwise", "quantize_colwise", "quantize_both"]


def _worker(rank: int, world: int) -> list:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    from mx_dtensor.testing import from_full

    mesh = init_device_mesh("cpu", (world,))
    full = torch.randn(160, 96, generator=torch.Generator().manual_seed(0))
    results = []
    for cast in CASTS:
        fn = getattr(mk, cast)
        want = fn(full, scale_layout="blocked")
        for placement in (Replicate(), Shard(0), Shard(1)):
            x = from_full(full, mesh, [placement])
            with CommDebugMode() as comm:
                try:
                    outs = fn(x, scale_layout="blocked")
                except mx_dtensor.MXShardingError as e:
                    results.append((cast, repr(placement), comm.get_total_counts(), str(e)))
                    continue
            same = all(
                o.placements == (Replicate(),)
                and torch.equal(o.to_local().view(torch.uint8), w.view(torch.uint8))
                for o, w in zip(outs, want, strict=True)
            )
            results.append((cast, repr(placement), comm.get_total_counts(), f"same {same}"))
    # The op called directly, the layout as a keyword: the rule sees it all the same.
    x = from_full(full, mesh, [Shard(0)])
    try:
        torch.ops.mx.quantize_rowwise(x, "fp8_e4m3", 32, "rceil", "auto", scale_layout="blocked")
        results.append(("op", "S(0)", 0, "no error"))
    except mx_dtensor.MXShardingError as e:
        results.append(("op", "S(0)", 0, str(e)))
    return results


def test_blocked_casts_take_only_a_replicate_x():
    from mx_dtensor.testing import spawn

    for per_rank in spawn(_worker, 2):
        assert len(per_rank) == 3 * 3 + 1
        for cast, placement, comms, got in per_rank:
            assert comms == 0, (cast, placement, got)
            if placement == "Replicate()":
                assert got == "same True", (cast, placement, got)
            else:
                op = "quantize_rowwise" if cast == "op" else cast
                assert got.startswith(f"mx::{op}:"), (cast, placement, got)
                assert "scale_layout='blocked'" in got and "only for a Replicate x" in got, got
