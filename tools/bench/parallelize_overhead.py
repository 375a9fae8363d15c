"""Overhead of mx_nn.parallelize at tp=1 against mx_nn.convert alone (run on a GPU).

Two copies of the same bf16 mx_nn.models.Llama (Llama-3-8B layer shapes: dim 4096, 32 query /
8 key-value heads, SwiGLU 14336; 2 layers, vocab 32768): one converted with
``mx_nn.convert(model, recipe)`` (LM head kept in bf16, as parallelize keeps it), one
with ``mx_nn.parallelize(model, mesh, recipe=...)`` on a one-rank mesh (DTensor
parameters, sequence-parallel plan, no communication that moves data). Times forward +
backward of tokens [batch, seq] (median ms of do_bench, the models measured
alternately, ROUNDS times) and prints the ratio. At tp=1 parallelize leaves tensor
parallelism out (plain tensors). Context, what the DTensor path itself costs: a third
copy with the built-in TP plan applied on the one-rank mesh anyway
(``mx_nn.apply_tp(..., include_single_rank=True)``: DTensor parameters and activations,
the MXLinears on their local shards, mx_nn.dtensor.local_shards), and the same with every
mx op of its MXLinears dispatched through DTensor instead
(``mx_nn.dtensor.dispatch_per_op``).

Target: parallelize / convert <= 1.02.

Usage: cd tools/bench && python3 parallelize_overhead.py   (BENCHMARKS.md's figure;
       run_all.sh's parallelize step)
       python3 tools/bench/parallelize_overhead.py [--quick] [--recipe mxfp8] [--batch 1]
Writes the table to $OUT/parallelize_overhead.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys

import torch
import torch.distributed as dist
from common import bench_ms, environment, llama3_8b_config, md_table, publish

import mx_nn
from mx_nn.dtensor import dispatch_per_op
from mx_nn.models import Llama, LlamaConfig

ROUNDS = 3
TARGET = 1.02  # parallelize / convert


def _model(config: LlamaConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return Llama(config).to(device="cuda", dtype=torch.bfloat16)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 layer, dim 1024, seq 1024")
    p.add_argument("--recipe", default="mxfp8")
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args(argv)
    print(environment())
    if args.quick:
        config = LlamaConfig(
            dim=1024,
            n_layers=1,
            n_heads=8,
            n_kv_heads=2,
            hidden_dim=3584,
            vocab_size=32768,
            max_seq_len=1024,
        )
    else:
        config = llama3_8b_config(n_layers=2, max_seq_len=4096)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("tp",))
        # parallelize keeps the LM head in bf16: so does the baseline.
        keep_head = lambda _module, fqn: fqn != "output"  # noqa: E731
        converted = mx_nn.convert(_model(config), args.recipe, filter_fn=keep_head)
        parallel = mx_nn.parallelize(_model(config), mesh, recipe=args.recipe)
        forced = mx_nn.convert(_model(config), args.recipe, filter_fn=keep_head)
        # mx_comms=False: the plan's communication in high precision, as parallelize's.
        mx_nn.apply_tp(forced, mesh, mx_comms=False, include_single_rank=True)
        tokens = torch.randint(
            0, config.vocab_size, (args.batch, config.max_seq_len), device="cuda"
        )

        def step_of(model):
            params = list(model.parameters())

            def step():
                model(tokens).float().mean().backward()

            return step, params

        with torch.no_grad():
            f = forced(tokens)
            f = f.full_tensor() if hasattr(f, "full_tensor") else f
            same = torch.equal(converted(tokens), parallel(tokens)) and torch.equal(
                converted(tokens), f
            )
        times = {"convert": [], "parallelize": [], "tp plan": [], "dispatch": []}
        runs = (("convert", converted), ("parallelize", parallel), ("tp plan", forced),
                ("dispatch", forced))  # fmt: skip
        for _ in range(ROUNDS):
            for name, model in runs:
                step, params = step_of(model)
                with dispatch_per_op() if name == "dispatch" else contextlib.nullcontext():
                    times[name].append(bench_ms(step, grad_to_none=params))
    finally:
        dist.destroy_process_group()
    t_conv = statistics.median(times["convert"])
    t_par = statistics.median(times["parallelize"])
    ratio = t_par / t_conv
    shape = f"{config.n_layers} x dim {config.dim}, seq {config.max_seq_len}, batch {args.batch}"
    header = ["model", "recipe", "convert ms", "parallelize tp=1 ms", "ratio", "target",
              "logits equal"]  # fmt: skip
    row = (shape, args.recipe, f"{t_conv:.3f}", f"{t_par:.3f}", f"{ratio:.3f}", f"<= {TARGET}",
           same)  # fmt: skip
    lines = [
        md_table(header, [row]),
        "",
        f"rounds: convert {[round(t, 3) for t in times['convert']]}, "
        f"parallelize {[round(t, 3) for t in times['parallelize']]}",
        "",
        "context: the TP plan applied on the one-rank mesh anyway (DTensors), "
        f"{[round(t, 3) for t in times['tp plan']]} "
        f"({statistics.median(times['tp plan']) / t_conv:.3f}x convert); the same with "
        f"the mx ops dispatched through DTensor {[round(t, 3) for t in times['dispatch']]} "
        f"({statistics.median(times['dispatch']) / t_conv:.3f}x convert)",
    ]
    publish("\n".join(lines), "parallelize_overhead.md")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
