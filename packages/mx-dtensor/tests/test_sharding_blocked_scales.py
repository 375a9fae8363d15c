"""mx::scaled_mm on DTensors with scales in the blocked (cuBLAS) layout: an operand with
blocked scales runs replicated, its partner may be sharded (bit-exact, no collective);
a sharded operand or blocked scale is refused before any communication. Two ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import mx_dtensor
import mx_kernels as mk

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")


def _full():
    g = torch.Generator().manual_seed(0)
    a = mk.quantize_rowwise(torch.randn(128, 128, generator=g), "fp8_e4m3")
    b = mk.quantize_rowwise(torch.randn(64, 128, generator=g), "fp8_e4m3")
    return a, b


# (a's placement, b's, a's scale layout, b's, b_scale's placement, output placement or
# the words of the refusal)
CASES = [
    ("S0", "R", "plain", "blocked", "R", "Shard(dim=0)"),
    ("R", "S0", "blocked", "plain", "S0", "Shard(dim=1)"),
    ("R", "R", "blocked", "blocked", "R", "Replicate()"),
    ("R", "S0", "plain", "blocked", "R", "b_scale is in the 'blocked' layout"),
    ("R", "R", "plain", "blocked", "S0", "both must be Replicate"),
    ("S1", "S1", "blocked", "plain", "S1", "a_scale is in the 'blocked' layout"),
]


def _worker(rank: int, world: int) -> list:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    from mx_dtensor.testing import from_full, local_slice

    mesh = init_device_mesh("cpu", (world,))
    place = {"R": [Replicate()], "S0": [Shard(0)], "S1": [Shard(1)]}
    (a_q, a_s), (b_q, b_s) = _full()
    want = mk.scaled_mm(a_q, a_s, b_q, b_s, out_dtype=torch.float32)
    results = []
    for pa, pb, la, lb, psb, expected in CASES:
        sa = mk.swizzle_scales(a_s).flatten() if la == "blocked" else a_s
        sb = mk.swizzle_scales(b_s).flatten() if lb == "blocked" else b_s
        psa = "R" if la == "blocked" else pa
        dts = [
            from_full(t, mesh, place[p]) for t, p in ((a_q, pa), (sa, psa), (b_q, pb), (sb, psb))
        ]
        with CommDebugMode() as comm:
            try:
                y = mk.scaled_mm(*dts, out_dtype=torch.float32, scale_layout=(la, lb))
            except mx_dtensor.MXShardingError as e:
                results.append((expected, comm.get_total_counts(), str(e)))
                continue
        local = local_slice(want, mesh, y.placements)
        same = torch.equal(y.to_local(), local)
        results.append((expected, comm.get_total_counts(), f"{y.placements[0]!r} {same}"))
    return results


def test_blocked_scales_replicate_only():
    from mx_dtensor.testing import spawn

    for per_rank in spawn(_worker, 2):
        for expected, comms, got in per_rank:
            assert comms == 0, (expected, got)
            if expected.endswith(")"):
                assert got == f"{expected} True", (expected, got)
            else:
                assert expected in got and "mx::scaled_mm" in got, (expected, got)
