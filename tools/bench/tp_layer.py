"""The seven linears of one Llama-3-8B layer at the per-rank widths of tensor
parallelism, MXLinear against bf16 nn.Linear, forward + backward (run on a GPU).

Per rank at TP degree t (8192 tokens, hidden 4096, 32 heads, 8 KV heads, FFN 14336):
q 4096 -> 4096/t, k and v 4096 -> 1024/t, o 4096/t -> 4096, gate and up 4096 -> 14336/t,
down 14336/t -> 4096 (colwise layers shard their outputs, rowwise ones their inputs).
q, k and v read one input, and so do gate and up, as in the layer (MXLinear casts a
shared input once). One step runs all seven forward and backward (weights' grads
kept, as in training);
its time is the wall time per step of steps queued back to back (host and GPU: at
small per-rank shapes the host's launch path is what the GPU waits for). bf16 and MX
alternate in the same run, eager and each ``torch.compile``'d.

Targets: at TP=4 and TP=8, compiled MX <= 1.0x compiled bf16 (floor 1.10) and eager MX
<= 1.15x eager bf16; at TP=1 and TP=2, compiled <= 1.0x.

Usage: python tools/bench/tp_layer.py [--quick] [--tp 1,2,4,8] [--recipe mxfp8]
Writes the table to $OUT/tp_layer.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import sys

import torch
from report import publish, wall_per_call
from torch import nn

import mx_nn

TOKENS, HIDDEN, KV, FFN = 8192, 4096, 1024, 14336
TARGETS = {1: (1.0, None), 2: (1.0, None), 4: (1.0, 1.15), 8: (1.0, 1.15)}  # (compiled, eager)


def shapes(tp: int) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) per rank."""
    return [
        ("q", HIDDEN, HIDDEN // tp), ("k", HIDDEN, KV // tp), ("v", HIDDEN, KV // tp),
        ("o", HIDDEN // tp, HIDDEN), ("gate", HIDDEN, FFN // tp), ("up", HIDDEN, FFN // tp),
        ("down", FFN // tp, HIDDEN),
    ]  # fmt: skip


class Linears(nn.Module):
    """The seven linears; forward takes one input per linear."""

    def __init__(self, tp: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
            for _, k, n in shapes(tp)
        )

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        x_attn, x_o, x_mlp, x_down = xs
        inputs = [x_attn, x_attn, x_attn, x_o, x_mlp, x_mlp, x_down]
        return [layer(x) for layer, x in zip(self.layers, inputs, strict=True)]


def models(tp: int, recipe: str) -> tuple[Linears, Linears]:
    """The bf16 linears and an MX copy of them (same weights) converted to ``recipe``."""
    torch.manual_seed(0)
    bf16, mx = Linears(tp), Linears(tp)
    mx.load_state_dict(bf16.state_dict())
    mx_nn.convert(mx, recipe)
    return bf16, mx


def inputs(tp: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The inputs of q/k/v, o, gate/up and down (requiring grad), and each output's grad."""
    widths = [HIDDEN, HIDDEN // tp, HIDDEN, FFN // tp]
    xs = [torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16) for k in widths]
    xs = [x.requires_grad_() for x in xs]
    grads = [torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16) for *_, n in shapes(tp)]
    return xs, grads


def step_fn(model, xs, grads):
    def step():
        outs = model(xs)
        torch.autograd.backward(outs, grads)

    return step


def run_tp(tp: int, recipe: str, steps: int, modes: tuple[str, ...]) -> dict[str, float]:
    bf16, mx = models(tp, recipe)
    xs, grads = inputs(tp)
    out = {}
    for mode in modes:
        for name, model in (("bf16", bf16), ("mx", mx)):
            if mode == "compiled":
                model = torch.compile(model)
            elif mode == "cudagraphs":  # a user option: it takes the host out of the step
                model = torch.compile(model, mode="reduce-overhead")
            out[f"{name} {mode}"] = wall_per_call(step_fn(model, xs, grads), steps, warmup=3) * 1e3
            if mode != "eager":
                torch._dynamo.reset()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps per timing")
    p.add_argument("--tp", default="1,2,4,8", help="comma-separated TP degrees")
    p.add_argument("--recipe", default="mxfp8", help="an mx_nn recipe")
    p.add_argument(
        "--cudagraphs",
        action="store_true",
        help="also torch.compile(mode='reduce-overhead') (context, not judged)",
    )
    a = p.parse_args()
    degrees = [int(t) for t in a.tp.split(",")]
    bad = [t for t in degrees if t not in TARGETS]
    if bad:
        p.error(f"--tp {bad}: allowed degrees are {sorted(TARGETS)}")
    steps = 5 if a.quick else 20
    rows = [
        "| per-rank shapes of | bf16 eager ms | MX eager ms | MX / bf16 eager | bf16 compiled ms "
        "| MX compiled ms | MX / bf16 compiled | CUDA graphs bf16 / MX ms | targets |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for tp in degrees:
        modes = ("eager", "compiled", "cudagraphs") if a.cudagraphs else ("eager", "compiled")
        t = run_tp(tp, a.recipe, steps, modes)
        eager = t["mx eager"] / t["bf16 eager"]
        comp = t["mx compiled"] / t["bf16 compiled"]
        want_c, want_e = TARGETS[tp]
        verdict = [f"compiled {'met' if comp <= want_c else 'MISSED'} (<= {want_c})"]
        if want_e:
            verdict.append(f"eager {'met' if eager <= want_e else 'MISSED'} (<= {want_e})")
        graphs = "-"
        if a.cudagraphs:
            graphs = f"{t['bf16 cudagraphs']:.3f} / {t['mx cudagraphs']:.3f}"
        rows.append(
            f"| TP={tp} | {t['bf16 eager']:.3f} | {t['mx eager']:.3f} | {eager:.2f} | "
            f"{t['bf16 compiled']:.3f} | {t['mx compiled']:.3f} | {comp:.2f} | {graphs} | "
            f"{'; '.join(verdict)} |"
        )
        print(rows[-1], flush=True)
    rows.append(f"\n{a.recipe}, {TOKENS} tokens; torch {torch.__version__}, "
                f"{torch.cuda.get_device_name()}")  # fmt: skip
    publish("\n".join(rows), "tp_layer.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
