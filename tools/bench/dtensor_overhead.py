"""MXLinear through the DTensor sharding rules at tp=1 against plain tensors (one GPU).

A one-rank CUDA mesh (NCCL, world size 1). Two parts:

1. Check: the Llama-style block of packages/mx-nn/tests/tp_block.py (GQA
   attention, SwiGLU MLP, RMSNorm), converted to MX and parallelized with torchtitan's
   plan, against the same block on plain tensors: outputs and every gradient bit for
   bit, for compute_path "auto" (on sm90 the fused fake-quantize path) and "mx", and
   for the nn.Linear block (the control). Compiled (torch.compile(fullgraph=True),
   compiled against compiled) with the whole plan, and eager without the
   SequenceParallel norms: every result bit-equal. Eager with them, PyTorch's
   SequenceParallel norms read their input through a separate autograd node
   (DTensor.from_local), so the norm's two gradient contributions are summed before the
   residual's, in another order than on plain tensors: the gradients upstream of the
   norms differ in the last bits, for the nn.Linear block as for the MX one (CPU test:
   packages/mx-nn/tests/test_tensor_parallel_one_rank.py); there the MX block may
   differ only where the control does.
2. Time: forward + backward (median ms, triton.testing.do_bench) of one MXLinear on
   plain tensors and on DTensors as ColwiseParallel / RowwiseParallel hand them to the
   layer (weight Shard(0) and input Replicate; weight Shard(1) and input Shard(-1)), at
   16384x4096x4096 and at the per-rank shapes of a Llama-3-8B layer at TP=4 and TP=8
   (8192 tokens: q 4096->4096/tp, k/v 4096->1024/tp, o 4096/tp->4096, gate/up
   4096->14336/tp, down 14336/tp->4096). Each DTensor result is bit-compared with the
   plain one too. Target: DTensor / plain <= 1.03. MXLinear runs DTensors as one op on
   their local shards (mx_nn.dtensor.local_shards); the "dispatch" column times the same
   layer with every mx op dispatched through DTensor and the sharding rules instead
   (``mx_nn.dtensor.dispatch_per_op``; context: what the local path saves), eager
   only. The control: bf16 nn.Linear on the same plain tensors and DTensors, its
   DTensor / plain ratio in the same run (what DTensor costs around a layer that has no
   mx ops at all).

Usage: cd tools/bench && python3 dtensor_overhead.py --compile   (BENCHMARKS.md's table;
       run_all.sh's dtensor step)
       python3 tools/bench/dtensor_overhead.py [--quick] [--compile] [--recipe mxfp8]
       [--skip-block]
Writes the table to $OUT/dtensor_overhead.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import logging
import sys
import traceback

import torch
import torch.distributed as dist
from common import (
    ROOT,
    TOKENS,
    bench_ms,
    environment,
    llama3_8b_linears,
    md_table,
    publish,
    step_fn,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import mx_nn
from mx_nn.dtensor import dispatch_per_op

TARGET = 1.03
# k and v have one shape, and so do gate and up: one row each.
ROW_NAMES = {"q": "q", "k": "k/v", "o": "o", "gate": "gate/up", "down": "down"}


def llama3_8b_shapes(tp: int) -> list[tuple[str, str, int, int, int]]:
    """(layer, style, M, K, N) per rank of a Llama-3-8B layer at tensor parallelism tp."""
    return [
        (f"{ROW_NAMES[s.name]} tp{tp}", s.style, TOKENS, s.in_features, s.out_features)
        for s in llama3_8b_linears(tp)
        if s.name in ROW_NAMES
    ]


def shapes(quick: bool) -> list[tuple[str, str, int, int, int]]:
    big = [("square", "colwise", 16384, 4096, 4096)]
    return big if quick else big + llama3_8b_shapes(4) + llama3_8b_shapes(8)


def load_block_module():
    """The test module that defines the Llama-style block and torchtitan's plan."""
    path = ROOT / "packages/mx-nn/tests/tp_block.py"
    spec = importlib.util.spec_from_file_location("mx_tp_block", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same(a, b) -> bool:
    a = a.full_tensor() if isinstance(a, DTensor) else a
    b = b.full_tensor() if isinstance(b, DTensor) else b
    return a.shape == b.shape and torch.equal(a, b)


def rel_error(a, b) -> float:
    a = a.full_tensor() if isinstance(a, DTensor) else a
    b = b.full_tensor() if isinstance(b, DTensor) else b
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def block_differences(mesh, config, compiled: bool, sp_norms: bool = True) -> dict[str, float]:
    """Results of the parallelized block (one rank) that are not bit-identical to the
    same block on plain tensors, with their relative errors (Frobenius norms). ``config``
    None: the nn.Linear block (the control); ``sp_norms`` False: the plan without its
    SequenceParallel norms."""
    named = load_block_module().one_rank_results(mesh, config, "cuda", sp_norms, compiled)
    return {name: rel_error(b, a) for name, (a, b) in named.items() if not same(a, b)}


def check_block(mesh, recipe: str) -> list[str]:
    """Failures of the block check (module doc): compiled with the whole plan and eager
    without SequenceParallel norms, any result that differs; eager with them, results
    of the MX block that differ where the nn.Linear block's do not."""
    failures = []
    runs = [("compiled", True, True), ("eager, no SP norms", False, False),
            ("eager", False, True)]  # fmt: skip
    for mode, compiled, sp_norms in runs:
        control = block_differences(mesh, None, compiled, sp_norms)
        print(f"block check, {mode}, nn.Linear control: differ {_errors(control)}")
        if sp_norms and not compiled:
            allowed = control
        else:
            allowed = {}
            failures += [f"{mode} nn.Linear {name}" for name in control]
        for path in ("auto", "mx"):
            config = mx_nn.MXLinearConfig.from_recipe(recipe, compute_path=path)
            bad = block_differences(mesh, config, compiled, sp_norms)
            extra = [name for name in bad if name not in allowed]
            print(
                f"block check, {mode}, compute_path={path}: differ {_errors(bad)}"
                + (f"; NOT allowed: {extra}" if extra else "")
            )
            failures += [f"{mode} {path} {name}" for name in extra]
    return failures


def _errors(differ: dict[str, float]) -> str:
    """The differing results and their relative errors, or 'nowhere'."""
    return ", ".join(f"{name} ({err:.1e})" for name, err in differ.items()) or "nowhere"


def layer_pair(mesh, style: str, m: int, k: int, n: int, recipe: str | None):
    """(plain MXLinear, its input), (the DTensor MXLinear, its input), grad, DTensor grad;
    ``recipe`` None: nn.Linear (the control)."""
    lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    if recipe is None:
        plain, dt = lin, copy.deepcopy(lin)
    else:
        config = mx_nn.MXLinearConfig.from_recipe(recipe)
        plain = mx_nn.MXLinear.from_linear(lin, config)
        dt = mx_nn.MXLinear.from_linear(copy.deepcopy(lin), config)
    w_place, x_place = (
        ([Shard(0)], [Replicate()]) if style == "colwise" else ([Shard(1)], [Shard(1)])
    )
    dt.weight = torch.nn.Parameter(distribute_tensor(dt.weight.detach(), mesh, w_place))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x_dt = distribute_tensor(x.detach(), mesh, x_place).requires_grad_()
    grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    g_place = [Shard(1)] if style == "colwise" else [Replicate()]
    return (plain, x), (dt, x_dt), grad, distribute_tensor(grad, mesh, g_place)


def layer_results_equal(plain, x, dt, x_dt, grad, grad_dt) -> bool:
    """One forward + backward of each: output, input grad and weight grad bit-equal."""
    results = []
    for module, xx, g in ((plain, x, grad), (dt, x_dt, grad_dt)):
        y = module(xx)
        y.backward(g)
        if isinstance(y, DTensor):  # rowwise: Partial over one rank
            y = y.redistribute(y.device_mesh, [Replicate()])
        results.append((y, xx.grad, module.weight.grad))
        xx.grad = module.weight.grad = None
    return all(same(a, b) for a, b in zip(*results, strict=True))


def time_step(module, x, grad, params) -> float:
    step = step_fn(module, x, grad)
    step()  # compile / warm up
    return bench_ms(step, grad_to_none=[x, *params])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one shape (16384x4096x4096)")
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd layers")
    recipes = [r.value for r in mx_nn.MXRecipe]
    p.add_argument("--recipe", default="mxfp8", choices=recipes, help="default mxfp8")
    p.add_argument("--skip-block", action="store_true", help="skip the block bit check")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (a one-rank CUDA mesh)")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("mx_nn").setLevel(logging.INFO)  # which path MXLinear runs
    print(environment())
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    ok = True
    try:
        mesh = init_device_mesh("cuda", (1,))
        if not args.skip_block:
            try:
                failures = check_block(mesh, args.recipe)
                print(f"block check: {'FAILED ' + str(failures) if failures else 'passed'}")
                ok &= not failures
            except Exception:
                traceback.print_exc()
                ok = False
        rows = []
        for name, style, m, k, n in shapes(args.quick):
            (plain, x), (dt, x_dt), grad, grad_dt = layer_pair(mesh, style, m, k, n, args.recipe)
            (c_plain, c_x), (c_dt, c_x_dt), _, _ = layer_pair(mesh, style, m, k, n, None)
            equal = layer_results_equal(plain, x, dt, x_dt, grad, grad_dt)
            ok &= equal
            modes = [("eager", plain, dt, c_plain, c_dt)]
            if args.compile:
                compiled = (torch.compile(mod) for mod in (plain, dt, c_plain, c_dt))
                modes.append(("compiled", *compiled))
            torch._dynamo.reset()  # fresh compile caches per shape: no recompile limit
            for mode, a, b, ca, cb in modes:
                t_dispatch = control = float("nan")
                try:
                    t_plain = time_step(a, x, grad, [plain.weight])
                    t_dt = time_step(b, x_dt, grad_dt, [dt.weight])
                    control = time_step(cb, c_x_dt, grad_dt, [c_dt.weight]) / time_step(
                        ca, c_x, grad, [c_plain.weight]
                    )
                    if mode == "eager":
                        with dispatch_per_op():
                            t_dispatch = time_step(b, x_dt, grad_dt, [dt.weight])
                except Exception:
                    traceback.print_exc()
                    ok = False
                    t_plain = t_dt = float("nan")
                ratio = t_dt / t_plain
                ok &= ratio <= TARGET
                rows.append((name, style, f"{m}x{k}x{n}", mode, t_plain, t_dt, ratio, equal,
                             t_dispatch, control))  # fmt: skip
    finally:
        dist.destroy_process_group()
    header = ["layer", "style", "M x K x N", "mode", "plain ms", "DTensor ms", "DTensor / plain",
              f"<= {TARGET}", "output bit-equal", "dispatch ms (context)",
              "nn.Linear DTensor / plain (control)"]  # fmt: skip
    table = [
        (name, style, shape, mode, f"{t_plain:.3f}", f"{t_dt:.3f}", f"{ratio:.3f}",
         "yes" if ratio <= TARGET else "NO", "yes" if equal else "NO", f"{t_dispatch:.3f}",
         f"{control:.3f}")
        for name, style, shape, mode, t_plain, t_dt, ratio, equal, t_dispatch, control in rows
    ]  # fmt: skip
    publish(md_table(header, table), "dtensor_overhead.md")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
