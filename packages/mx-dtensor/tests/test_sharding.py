"""Every mx op on DTensors: each supported placement gives local shards bit-identical to
the op on the full tensor, sliced, with no collective inside the op; every placement
without a rule raises MXShardingError (a ValueError) before any communication.

Two spawned groups: 2 ranks (1-D mesh) and 4 ranks (1-D mesh of 4 and a 2x2 mesh)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import mx_dtensor
import mx_kernels as mk

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed")

R_, P_ = "R", "P"  # placement shorthands in case tables: "R", "P", or an int (Shard dim)


def _placements(spec):
    from torch.distributed.tensor import Partial, Replicate, Shard

    spec = spec if isinstance(spec, tuple) else (spec,)
    return tuple(Replicate() if s == R_ else Partial() if s == P_ else Shard(s) for s in spec)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t.contiguous()


def _inputs(name: str):
    """Full inputs per case family (every rank builds the same)."""
    g = torch.Generator().manual_seed(0)
    x3 = torch.randn(4, 6, 128, generator=g) * 4
    x2 = torch.randn(128, 128, generator=g) * 4
    b2 = torch.randn(64, 128, generator=g)
    return {"x3": x3, "x2": x2, "b2": b2}[name]


def _call(op: str, fmt: str, tensors):
    op, _, overload = op.partition(" ")  # "<op> inline": the op's inline overload
    kw = dict(block_size=32, **({"inline": True} if overload == "inline" else {}))
    if op == "dequantize_rowwise":
        return (mk.dequantize_rowwise(*tensors, fmt, out_dtype=torch.float32, **kw),)
    if op == "scaled_mm":
        return (mk.scaled_mm(*tensors, out_dtype=torch.float32),)
    out = getattr(mk, op)(tensors[0], fmt, **kw)
    return out if isinstance(out, tuple) else (out,)


def _case_tensors(op: str, fmt: str):
    """Full (plain) tensor inputs of ``op``."""
    if op == "dequantize_rowwise":
        return list(mk.quantize_rowwise(_inputs("x3"), fmt))
    if op == "scaled_mm":
        a = mk.quantize_rowwise(_inputs("x2"), fmt)
        b = mk.quantize_rowwise(_inputs("b2"), fmt)
        return [*a, *b]
    return [_inputs("x3" if op.split(" ")[0].endswith("rowwise") else "x2")]


# (op, fmt, placements of each input per mesh dim). dequantize and scaled_mm give the
# scale the placement of its data.
ROWWISE = ["quantize_rowwise", "fake_quantize_rowwise"]
TWO_D = ["quantize_colwise", "fake_quantize_colwise", "quantize_both", "fake_quantize_both",
         "fake_quantize_rowwise_quantize_colwise"]  # fmt: skip


def _ok_cases(mesh_ndim: int):
    if mesh_ndim == 1:
        cases = [(op, "fp8_e4m3", [p]) for op in ROWWISE for p in (R_, 0, 1, 2)]
        cases += [(op, "fp8_e4m3", [p]) for op in TWO_D for p in (R_, 0, 1)]
        cases += [("fake_quantize_both inline", "fp8_e4m3", [p]) for p in (0, 1)]
        cases += [("fake_quantize_rowwise inline", "fp8_e4m3", [2])]
        cases += [("quantize_rowwise", "fp4_e2m1", [2]), ("quantize_colwise", "fp4_e2m1", [0])]
        cases += [("quantize_both", "fp4_e2m1", [p]) for p in (0, 1)]
        cases += [("dequantize_rowwise", f, [p]) for f in ("fp8_e4m3", "fp4_e2m1")
                  for p in (R_, 0, 2)]  # fmt: skip
        cases += [("scaled_mm", "fp8_e4m3", list(p)) for p in ((R_, R_), (0, R_), (R_, 0), (1, 1))]
        cases += [("scaled_mm", "fp4_e2m1", [1, 1])]
        return cases
    # 2x2 mesh: nested shards of one dim, and a dim per mesh dim.
    cases = [(op, "fp8_e4m3", [p]) for op in ROWWISE for p in ((0, 2), (2, 2), (R_, 2))]
    cases += [(op, "fp8_e4m3", [p]) for op in TWO_D for p in ((0, 1), (1, 0), (0, 0), (1, 1))]
    cases += [("dequantize_rowwise", "fp8_e4m3", [(1, 2)])]
    cases += [
        ("scaled_mm", "fp8_e4m3", [(0, 1), (R_, 1)]),
        ("scaled_mm", "fp8_e4m3", [(1, 0), (1, R_)]),
    ]
    return cases


def _error_cases(world: int):
    """(label, callable building DTensors and calling the op, words the message must hold)."""
    bad_k = 32 * (world + 1)  # a K whose shards are not whole blocks at this world size
    return [
        (
            "rowwise K shard",
            "quantize_rowwise",
            (4, 2, bad_k),
            [2],
            ["mx::quantize_rowwise", "dim 2"],
        ),
        ("fake rowwise K shard", "fake_quantize_rowwise", (8, bad_k), [1], ["dim 1"]),
        (
            "colwise M shard",
            "quantize_colwise",
            (bad_k, 64),
            [0],
            ["mx::quantize_colwise", "dim 0"],
        ),
        ("both K shard", "quantize_both", (64, bad_k), [1], ["mx::quantize_both"]),
        ("fake both M shard", "fake_quantize_both", (bad_k, 64), [0], ["dim 0"]),
        ("partial input", "quantize_rowwise", (8, 64), [P_], ["Partial", "reduce it first"]),
        ("partial input colwise", "fake_quantize_colwise", (64, 64), [P_], ["Partial"]),
    ]


def _expected_local(full_out: torch.Tensor, local_out, mesh):
    from mx_dtensor.testing import local_slice

    if any(p.is_partial() for p in local_out.placements):
        return None
    return local_slice(full_out, mesh, local_out.placements)


def _run_ok(mesh, op, fmt, specs):
    from torch.distributed.tensor.debug import CommDebugMode

    from mx_dtensor.testing import from_full, local_slice

    full = _case_tensors(op, fmt)
    specs = list(specs) * (2 if op == "dequantize_rowwise" else 1)
    if op == "scaled_mm":
        specs = [specs[0], specs[0], specs[1], specs[1]]
    placements = [_placements(s) for s in specs]
    dts = [from_full(t, mesh, p) for t, p in zip(full, placements, strict=True)]
    with CommDebugMode() as comm:
        outs = _call(op, fmt, dts)
    refs = _call(op, fmt, full)
    report = []
    for j, (o, r) in enumerate(zip(outs, refs, strict=True)):
        want = _expected_local(r, o, mesh)
        if want is None:  # Partial: the local result is the op on the local operands
            local_in = [local_slice(t, mesh, p) for t, p in zip(full, placements, strict=True)]
            want = _call(op, fmt, [t.contiguous() for t in local_in])[j]
        same = tuple(o.shape) == tuple(r.shape) and torch.equal(_bits(o.to_local()), _bits(want))
        report.append((j, same, str(o.placements)))
    return comm.get_total_counts(), report


def _run_error(mesh, op, shape, spec):
    from torch.distributed.tensor.debug import CommDebugMode

    from mx_dtensor.testing import from_full

    full = torch.randn(shape)
    x = from_full(full, mesh, _placements(spec[0]))  # Partial: every rank holds full
    with CommDebugMode() as comm:
        try:
            _call(op, "fp8_e4m3", [x])
        except mx_dtensor.MXShardingError as e:
            return comm.get_total_counts(), isinstance(e, ValueError), str(e)
    return comm.get_total_counts(), False, "no error"


def _register_sharding_redistributes(mesh) -> int:
    """The behaviour the mx rules avoid: an op registered with DTensor's public
    register_sharding, listing only Replicate, silently all-gathers a Shard(0) input."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.experimental import register_sharding

    from mx_dtensor.testing import from_full

    @torch.library.custom_op("mxtest::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    double.register_fake(lambda x: torch.empty_like(x))

    @register_sharding(torch.ops.mxtest.double.default)
    def _(x):
        return [([Replicate()], [Replicate()])]

    x = from_full(torch.randn(8, 4), mesh, [Shard(0)])
    with CommDebugMode() as comm:
        torch.ops.mxtest.double(x)
    return comm.get_total_counts()


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    meshes = [init_device_mesh("cpu", (world,))]
    if world == 4:
        meshes.append(init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")))
    out = {"ok": [], "errors": [], "register_sharding_comms": None}
    for mesh in meshes:
        for op, fmt, specs in _ok_cases(mesh.ndim):
            out["ok"].append(((op, fmt, str(specs), mesh.ndim), _run_ok(mesh, op, fmt, specs)))
    for label, op, shape, spec, words in _error_cases(world):
        out["errors"].append((label, words, _run_error(meshes[0], op, shape, spec)))
    out["scaled_mm_errors"] = [
        (spec, _run_scaled_mm_error(meshes[0], spec)) for spec in ((0, 0), (1, R_), (R_, 1), (0, 1))
    ]
    out["dequant_mismatch"] = _run_dequant_mismatch(meshes[0])
    out["strided"] = _run_strided(meshes[0])
    out["mm_dtype"] = _run_mm_dtype(meshes[0])
    out["register_sharding_comms"] = _register_sharding_redistributes(meshes[0])
    return out


def _run_scaled_mm_error(mesh, spec):
    from torch.distributed.tensor.debug import CommDebugMode

    from mx_dtensor.testing import from_full

    full = _case_tensors("scaled_mm", "fp8_e4m3")
    pa, pb = _placements(spec[0]), _placements(spec[1])
    dts = [from_full(t, mesh, p) for t, p in zip(full, (pa, pa, pb, pb), strict=True)]
    with CommDebugMode() as comm:
        try:
            _call("scaled_mm", "fp8_e4m3", dts)
        except mx_dtensor.MXShardingError as e:
            return comm.get_total_counts(), str(e)
    return comm.get_total_counts(), "no error"


def _run_dequant_mismatch(mesh):
    from mx_dtensor.testing import from_full

    q, s = _case_tensors("dequantize_rowwise", "fp8_e4m3")
    try:
        mk.dequantize_rowwise(
            from_full(q, mesh, _placements(0)), from_full(s, mesh, _placements(1))
        )
    except mx_dtensor.MXShardingError as e:
        return str(e)
    return "no error"


def _run_mm_dtype(mesh):
    """aten.mm.dtype's rule, on meta local tensors (no CPU kernel): output placements
    per input pair, no communication, and a refusal."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    def dt(shape, spec):
        local = torch.empty(shape, dtype=torch.bfloat16, device="meta")
        return DTensor.from_local(local, mesh, _placements(spec), run_check=False)

    n, out = mesh.size(), []
    for sa, sb, want in ((R_, R_, "R"), (0, R_, "S(0)"), (R_, 1, "S(1)"), (1, 0, "P")):
        a = dt((64 // (n if sa == 0 else 1), 64 // (n if sa == 1 else 1)), sa)
        b = dt((64 // (n if sb == 0 else 1), 32 // (n if sb == 1 else 1)), sb)
        with CommDebugMode() as comm:
            y = torch.mm(a, b, out_dtype=torch.float32)
        got = {"R": y.placements[0].is_replicate(), "P": y.placements[0].is_partial()}.get(
            want, str(y.placements[0]) == want
        )
        out.append((sa, sb, got and y.dtype == torch.float32 and comm.get_total_counts() == 0))
    try:
        torch.mm(dt((64 // n, 64), 0), dt((64 // n, 32), 0), out_dtype=torch.float32)
        out.append(("S(0)", "S(0)", False))
    except mx_dtensor.MXShardingError as e:
        out.append(("S(0)", "S(0)", "no rule" in str(e)))
    return out


def _full_bits(dt) -> torch.Tensor:
    return (dt.view(torch.uint8) if dt.element_size() == 1 else dt).full_tensor()


def _run_strided(mesh):
    """Flattening a dim sharded behind another gives a _StridedShard (torch 2.13; an
    older torch may refuse or redistribute instead, and then there is nothing to check).
    The casts and scaled_mm keep it, also on a blocked dim whose contiguous runs hold
    whole blocks, and refuse it where runs would split blocks. Checked on the gathered
    results against the ops on the full tensors."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.placement_types import _StridedShard

    from mx_dtensor.testing import from_full

    n = mesh.size()
    g = torch.Generator().manual_seed(1)
    rows_full = torch.randn(2, 32 * n, 128, generator=g)  # 32 rows per rank and batch
    cols_full = torch.randn(64, 2, 32 * n, generator=g)
    rows = from_full(rows_full, mesh, [Shard(1)]).reshape(-1, 128)
    cols = from_full(cols_full, mesh, [Shard(2)]).reshape(64, -1)
    if not all(isinstance(t.placements[0], _StridedShard) for t in (rows, cols)):
        return []
    checks = []
    for op, x, full in (
        ("quantize_rowwise", rows, rows_full.reshape(-1, 128)),
        ("quantize_colwise", rows, rows_full.reshape(-1, 128)),
        ("fake_quantize_both", cols, cols_full.reshape(64, -1)),
        ("fake_quantize_rowwise_quantize_colwise", cols, cols_full.reshape(64, -1)),
        ("quantize_both", cols, cols_full.reshape(64, -1)),
    ):
        with CommDebugMode() as comm:
            outs = _call(op, "fp8_e4m3", [x])
        want = _call(op, "fp8_e4m3", [full])
        same = all(torch.equal(_full_bits(o), _bits(w)) for o, w in zip(outs, want, strict=True))
        kept = all(isinstance(o.placements[0], _StridedShard) for o in outs)
        checks.append((op, same and kept and comm.get_total_counts() == 0, str(outs[0].placements)))
    b_full = torch.randn(32, 2, 32 * n, generator=g)
    b = from_full(b_full, mesh, [Shard(2)]).reshape(32, -1)  # K split as cols' K
    with CommDebugMode() as comm:
        y = mk.scaled_mm(
            *mk.quantize_rowwise(cols), *mk.quantize_rowwise(b), out_dtype=torch.float32
        )
    full_a, full_b = cols_full.reshape(64, -1), b_full.reshape(32, -1)
    want = mk.scaled_mm(*mk.quantize_rowwise(full_a), *mk.quantize_rowwise(full_b),
                        out_dtype=torch.float32)  # fmt: skip
    # Partial sums over K in another order: fp32 rounding, hence a tolerance.
    close = torch.allclose(y.full_tensor(), want, rtol=1e-5, atol=1e-4)
    checks.append(("scaled_mm strided K", close and y.placements[0].is_partial()
                   and comm.get_total_counts() == 0, str(y.placements)))  # fmt: skip
    bad = from_full(torch.randn(8, 2, 16 * n), mesh, [Shard(2)]).reshape(8, -1)
    try:
        mk.quantize_rowwise(bad, "fp8_e4m3")
        checks.append(("strided runs of 16", False, "no error"))
    except mx_dtensor.MXShardingError as e:
        checks.append(("strided runs of 16", "runs of [16]" in str(e), str(e)))
    return checks


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def results(request):
    from mx_dtensor.testing import spawn

    return request.param, spawn(_worker, request.param)


def test_supported_placements_are_bit_exact_without_communication(results):
    world, per_rank = results
    assert len(per_rank[0]["ok"]) >= 30
    for rank, res in enumerate(per_rank):
        for case, (comms, report) in res["ok"]:
            assert comms == 0, f"rank {rank} {case}: {comms} collectives inside the op"
            for j, same, placements in report:
                assert same, f"rank {rank} {case}: output {j} ({placements}) differs"


def test_unsupported_placements_raise_before_communicating(results):
    world, per_rank = results
    for res in per_rank:
        for label, words, (comms, is_value_error, msg) in res["errors"]:
            assert comms == 0, label
            assert is_value_error, f"{label}: {msg}"
            for w in words + ["mesh dim", f"{world}"]:
                assert w in msg, f"{label}: {w!r} not in {msg!r}"
        for spec, (comms, msg) in res["scaled_mm_errors"]:
            assert comms == 0 and "mx::scaled_mm" in msg and "no rule" in msg, (spec, msg)
        assert "same placements" in res["dequant_mismatch"]


def test_strided_shards(results):
    _, per_rank = results
    for res in per_rank:
        assert torch.__version__ < (2, 13) or len(res["strided"]) == 7
        for op, ok, detail in res["strided"]:
            assert ok, f"{op}: {detail}"


def test_mm_dtype_rule(results):
    _, per_rank = results
    for res in per_rank:
        assert len(res["mm_dtype"]) == 5
        for sa, sb, ok in res["mm_dtype"]:
            assert ok, (sa, sb)


def test_block_error_names_global_and_local_sizes(results):
    world, per_rank = results
    label, _, (_, _, msg) = per_rank[0]["errors"][0]
    bad_k = 32 * (world + 1)
    local = -(-bad_k // world)
    assert f"global size {bad_k}" in msg and str(local) in msg, msg


def test_register_sharding_would_have_redistributed(results):
    # Shows what the checks above guard against, and that CommDebugMode sees it.
    _, per_rank = results
    assert all(res["register_sharding_comms"] >= 1 for res in per_rank)


def test_every_mx_op_has_a_rule():
    # Every op registered in the mx namespace (mx_kernels is imported above).
    all_ops = torch._C._dispatch_get_all_op_names()
    overloads = {n.removeprefix("mx::") for n in all_ops if n.startswith("mx::")}
    names = {n.split(".")[0] for n in overloads}
    assert names and names == set(mx_dtensor.MX_OPS)
    from torch.distributed.tensor import DTensor

    funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    for name in overloads:  # the inline overloads of the fake-quantize ops too
        base, _, overload = name.partition(".")
        assert getattr(getattr(torch.ops.mx, base), overload or "default") in funcs, name


def test_local_sizes_follow_torch_chunk():
    from torch.distributed.tensor import Replicate, Shard

    assert mx_dtensor.local_sizes(96, [Shard(1)], [2], 1) == [48, 48]
    assert mx_dtensor.local_sizes(5, [Shard(0)], [4], 0) == [2, 2, 1, 0]
    assert mx_dtensor.local_sizes(128, [Shard(0), Shard(0)], [2, 2], 0) == [32] * 4
    assert mx_dtensor.local_sizes(128, [Replicate(), Shard(0)], [2, 2], 0) == [64] * 4
    assert mx_dtensor.local_sizes(128, [Shard(1)], [2], 0) == [128, 128]
