"""Tensor parallelism across GPUs: correctness against one device, the MX gather against
bf16's, and tokens/s of bf16 against mxfp8 under TP, FSDP and both (run under torchrun).

  torchrun --nproc-per-node N tools/bench/multi_gpu.py [--quick] [--device cpu]
           [--parts check,gather,throughput]

On CUDA it uses NCCL and must run with NVLink multicast off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1: set here when unset); with
``--device cpu`` it runs the same code on gloo (a dry run: ``--quick`` sizes).

1. check: an ``mx_nn.models.Llama`` in mxfp8, ``mx_nn.parallelize``'d at tp=N with sequence
   parallelism (and dp=2 x tp=N/2 when N >= 4), against the same model on one device
   (every rank computes it): logits, then 5 SGD steps' losses, relative error.
2. gather: one Llama-3-8B layer's sequence-parallel input gather ([8192/N, 4096] per
   rank), bytes sent and time, ``mx_dtensor.mx_all_gather`` against a bf16 all-gather.
3. throughput: a Llama of Llama-3-8B widths, compiled, bf16 against mxfp8, tokens/s and
   peak memory for FSDP alone (mesh ("dp",)), TP alone, and FSDP+TP (N >= 4).

Target (3): mxfp8 with TP >= 1.05x bf16 with TP, and never below bf16 in any column.
Rank 0 prints markdown tables; with OUT set it writes $OUT/multi_gpu.md.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

for _var, _val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                   ("NVSHMEM_DISABLE_NVLS", "1")):  # fmt: skip
    os.environ.setdefault(_var, _val)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import LLAMA3_8B, TOKENS, llama3_8b_config, publish  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import mx_dtensor  # noqa: E402
import mx_nn  # noqa: E402
from mx_nn.models import Llama, LlamaConfig  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _losses(model, tokens, steps: int) -> tuple[torch.Tensor, list[float]]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    logits, losses = None, []
    for _ in range(steps):
        out = _full(model(tokens[:, :-1]))
        logits = out.detach() if logits is None else logits
        loss = torch.nn.functional.cross_entropy(out.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return logits, losses


def check(world: int, device: str, quick: bool) -> list[str]:
    cfg = LlamaConfig(dim=256 if quick else 1024, n_layers=2, n_heads=8, n_kv_heads=4,
                      hidden_dim=768 if quick else 2816, max_seq_len=256)  # fmt: skip
    torch.manual_seed(0)
    base = Llama(cfg).to(device)
    tokens = torch.randint(0, cfg.vocab_size, (2, 129 if quick else 257), device=device)
    one = mx_nn.convert(copy.deepcopy(base), "mxfp8", filter_fn=lambda m, fqn: fqn != "output")
    ref_logits, ref_losses = _losses(one, tokens, 5)
    layouts = [("tp", (world,), ("tp",))]
    if world >= 4:
        layouts.append(("dp2 x tp", (2, world // 2), ("dp", "tp")))
    rows = []
    for name, shape, names in layouts:
        mesh = init_device_mesh(device, shape, mesh_dim_names=names)
        model = mx_nn.parallelize(copy.deepcopy(base), mesh, recipe="mxfp8")
        logits, losses = _losses(model, tokens, 5)
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
        rows.append(f"| {name} {shape} | {rel(logits, ref_logits):.2e} | {worst:.2e} |")
    return ["| layout | logits rel err | worst loss rel err (5 steps) |", "|---|---|---|", *rows]


def _timed(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def gather(world: int, device: str, quick: bool) -> list[str]:
    tokens, hidden = (256, 256) if quick else (TOKENS, LLAMA3_8B["dim"])
    mesh = init_device_mesh(device, (world,), mesh_dim_names=("tp",))
    x = torch.randn(1, tokens // world, hidden, device=device, dtype=torch.bfloat16)
    group = mesh.get_group()
    out = torch.empty(world * x.numel(), device=device, dtype=torch.bfloat16)
    bf16_ms = _timed(lambda: dist.all_gather_into_tensor(out, x.flatten(), group=group))
    mx_ms = _timed(lambda: mx_dtensor.mx_all_gather(x, mesh, 1))
    local = x.numel()
    bf16_bytes, mx_bytes = 2 * local, local + local // 32  # codes + one E8M0 per block
    return [
        "| gather of one layer input | bytes per rank | ms |", "|---|---|---|",
        f"| bf16 all-gather | {bf16_bytes:,} | {bf16_ms:.3f} |",
        f"| MX all-gather (codes + scales) | {mx_bytes:,} ({mx_bytes / bf16_bytes:.3f}x) "
        f"| {mx_ms:.3f} ({mx_ms / bf16_ms:.2f}x) |",
    ]  # fmt: skip


def throughput(world: int, device: str, quick: bool) -> list[str]:
    if quick:
        cfg = LlamaConfig(dim=256, n_layers=2, n_heads=8, n_kv_heads=4, hidden_dim=768,
                          vocab_size=256, max_seq_len=256)  # fmt: skip
    else:
        cfg = llama3_8b_config(n_layers=4, max_seq_len=4096)
    seq, batch = (128, 2) if quick else (4096, 2)
    layouts = [("FSDP", (world,), ("dp",)), ("TP", (world,), ("tp",))]
    if world >= 4:
        layouts.append(("FSDP+TP", (2, world // 2), ("dp", "tp")))
    rows = ["| layout | bf16 tokens/s | mxfp8 tokens/s | mxfp8 / bf16 | peak GiB bf16 / mxfp8 |",
            "|---|---|---|---|---|"]  # fmt: skip
    for name, shape, names in layouts:
        mesh = init_device_mesh(device, shape, mesh_dim_names=names)
        result = {}
        for recipe in (None, "mxfp8"):
            torch.manual_seed(0)
            model = Llama(cfg).to(device=device, dtype=torch.bfloat16)
            model = mx_nn.parallelize(model, mesh, recipe=recipe, compile=device == "cuda")
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)

            def step(model=model, opt=opt, tokens=tokens):
                logits = _full(model(tokens[:, :-1]))
                loss = torch.nn.functional.cross_entropy(
                    logits.float().flatten(0, 1), tokens[:, 1:].flatten()
                )
                loss.backward()
                opt.step()
                opt.zero_grad()

            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            ms = _timed(step, reps=3 if quick else 10)
            peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0
            dp = mesh["dp"].size() if "dp" in names else 1
            result[recipe] = (batch * seq * dp / (ms / 1e3), peak)
            del model, opt
        (b, pb), (m, pm) = result[None], result["mxfp8"]
        rows.append(f"| {name} {shape} | {b:,.0f} | {m:,.0f} | {m / b:.2f} | {pb:.1f} / {pm:.1f} |")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (the CPU dry run)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--parts", default="check,gather,throughput", help="comma-separated")
    a = p.parse_args()
    if "WORLD_SIZE" not in os.environ:
        p.error("run under torchrun: torchrun --nproc-per-node N tools/bench/multi_gpu.py")
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    parts = {"check": check, "gather": gather, "throughput": throughput}
    tables = []
    for part in a.parts.split(","):
        if part not in parts:
            p.error(f"--parts: {part!r}; allowed: {', '.join(parts)}")
        tables.append("\n".join(parts[part](world, a.device, a.quick)))
    if rank == 0:
        head = f"{world} ranks, " + ("NCCL" if a.device == "cuda" else "CPU (gloo)")
        publish(head + "\n\n" + "\n\n".join(tables), "multi_gpu.md")
    dist.barrier()  # no rank tears the group down while another's collective is in flight
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
