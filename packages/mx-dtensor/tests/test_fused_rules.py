"""The fused producers on DTensors (mx_dtensor.fused_rules): each supported placement
gives local outputs bit-identical to the op on the full tensor, sliced, with no
collective inside the op; the norm's weight gradient is a partial sum over the ranks
that split the rows; every placement without a rule is refused naming the op and the
argument. Two spawned ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import mx_dtensor
import mx_kernels as mk

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")

EPS = 1e-6
DW_TOL = 1e-4
"""rtol and atol of the norm's weight gradient summed over ranks against the one-process
one: the ranks' partial sums add the rows in another order (fp32)."""
# (op, input placements by argument, result: "ok" or the words of the refusal)
CASES = [
    ("norm", {"x": 1}, "ok"),  # sequence shards of [B, S, K]
    ("norm", {"x": 0}, "ok"),
    ("norm", {"x": 2}, "which the norm reduces over"),
    ("norm", {"x": 1, "weight": 0}, "weight must be Replicate"),
    ("norm_both", {"x": 0}, "ok"),  # [M, K] split along M: 64 rows, whole blocks
    ("norm_both_3d", {"x": 1}, "needs it 2-D"),
    ("norm_backward", {"x": 0}, "ok"),
    ("norm_backward", {"x": 1}, "which the norm reduces over"),
    ("swiglu", {"gate": 1, "up": 1}, "ok"),  # the intermediate dim, as under TP
    ("swiglu", {"gate": 0, "up": 0}, "ok"),
    ("swiglu", {"gate": 1, "up": 0}, "must have the shape and placements of gate"),
    ("swiglu_both", {"gate": 0, "up": 0}, "ok"),
    ("swiglu_both", {"gate": 1, "up": 1}, "ok"),
    ("swiglu_narrow", {"gate": 1, "up": 1}, "would split a block"),  # 48 per rank: splits blocks
]


def _full(case: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if case.startswith("swiglu"):
        k = 96 if case == "swiglu_narrow" else 256
        return {"gate": torch.randn(128, k, generator=g), "up": torch.randn(128, k, generator=g)}
    shape = (128, 128) if case in ("norm_both", "norm_backward") else (4, 64, 128)
    return {"x": torch.randn(shape, generator=g) * 3, "weight": torch.rand(128, generator=g) + 0.5}


def _run(case: str, t: dict) -> tuple:
    if case.startswith("swiglu"):
        return mk.swiglu_quantize(t["gate"], t["up"], colwise=case == "swiglu_both")
    if case == "norm_backward":
        y, rstd, *_ = mk.rms_norm_quantize(t["x"], t["weight"], EPS)
        dy = t["x"] * 0.5  # placed as x (elementwise on a DTensor: no collective)
        return mk.rms_norm_backward(dy, t["x"], t["weight"], rstd)
    return mk.rms_norm_quantize(t["x"], t["weight"], EPS, colwise=case.startswith("norm_both"))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t.contiguous()


def _worker(rank: int, world: int) -> list:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    from mx_dtensor.testing import from_full, local_slice

    mesh = init_device_mesh("cpu", (world,))
    results = []
    for case, placed, expected in CASES:
        full = _full(case)
        want = _run(case, full)
        dts = {
            name: from_full(t, mesh, [Shard(placed[name])] if name in placed else [Replicate()])
            for name, t in full.items()
        }
        with CommDebugMode() as comm:
            try:
                got = _run(case, dts)
            except mx_dtensor.MXShardingError as e:
                results.append((case, expected, comm.get_total_counts(), str(e)))
                continue
        verdicts = []
        for out, ref in zip(got, want, strict=True):
            if any(p.is_partial() for p in out.placements):  # dweight: summed over ranks
                total = out.full_tensor()
                verdicts.append(torch.allclose(total, ref, rtol=DW_TOL, atol=DW_TOL))
            else:
                local = local_slice(ref, mesh, out.placements)
                verdicts.append(torch.equal(_bits(out.to_local()), _bits(local)))
        results.append((case, expected, comm.get_total_counts(), f"ok {verdicts}"))
    return results


def test_fused_producers_on_dtensors():
    from mx_dtensor.testing import spawn

    for per_rank in spawn(_worker, 2):
        for case, expected, comms, got in per_rank:
            assert comms == 0, (case, expected, got)
            if expected == "ok":
                assert got.startswith("ok [") and "False" not in got, (case, got)
            else:
                assert expected in got and "mx::" in got, (case, expected, got)


def test_every_fused_op_has_a_rule():
    from mx_dtensor.fused_rules import FUSED_OPS

    assert set(FUSED_OPS) <= set(mx_dtensor.MX_OPS)
