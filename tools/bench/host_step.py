"""Host time of one step of ``tp_layer.py``'s seven linears, on CPU with the cast
launches stubbed: the Python and dispatcher work that an MX step adds to a bf16 one,
measurable without a GPU (to compare two trees; the GPU's host is slower, and its
figures come from ``tp_profile.py``).

The linears have tp_layer's structure (q/k/v read one input, gate/up another) at tiny
widths (``--tokens`` tokens, hidden ``--hidden``), so that the CPU's GEMMs cost little;
MXLinear runs its fused path (``compute_path="fake_quant"``, Triton casts) through the
cached launch path of CUDA tensors with each launch a no-op
(``mx_kernels.testing.cpu_cached_launches(interpret=False)``), and its bf16 GEMMs as
on CUDA (``torch.mm`` of the bf16 operands; on CPU ``bf16_gemm`` multiplies in fp32).
Wall time per step, microseconds, best of rounds of steps queued back to back.

Usage: python tools/bench/host_step.py [--modes eager,compiled] [--steps 200]
Needs TRITON_INTERPRET=1 (set here when unset).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from report import wall_per_call  # noqa: E402
from torch import nn  # noqa: E402

import mx_nn  # noqa: E402
import mx_nn.linear  # noqa: E402
from mx_kernels.testing import cpu_cached_launches  # noqa: E402


class Linears(nn.Module):
    """q, k, v, o, gate, up, down at widths ``hidden`` and ``hidden // 4`` (the per-rank
    ratio of Llama-3-8B at TP=8); forward takes the four inputs."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        small, ffn = hidden // 4, hidden // 2
        self.shapes = [(hidden, small), (hidden, small), (hidden, small), (small, hidden),
                       (hidden, ffn), (hidden, ffn), (ffn, hidden)]  # fmt: skip
        self.widths = [hidden, small, hidden, ffn]
        self.layers = nn.ModuleList(
            nn.Linear(k, n, bias=False, dtype=torch.bfloat16) for k, n in self.shapes
        )

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        a, o, m, d = xs
        return [layer(x) for layer, x in zip(self.layers, [a, a, a, o, m, m, d], strict=True)]


def _gemm_as_on_cuda(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    bf16 = torch.bfloat16
    a, b = a.to(bf16), b.to(bf16)
    return torch.mm(a, b) if out_dtype == bf16 else torch.mm(a, b).to(out_dtype)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    bf16, mx = Linears(a.hidden), Linears(a.hidden)
    mx.load_state_dict(bf16.state_dict())
    mx_nn.convert(mx, mx_nn.MXLinearConfig(compute_path="fake_quant", cast_backend="triton"))
    mx_nn.linear.bf16_gemm = _gemm_as_on_cuda
    xs = [torch.randn(a.tokens, k, dtype=torch.bfloat16, requires_grad=True) for k in bf16.widths]
    grads = [torch.randn(a.tokens, n, dtype=torch.bfloat16) for _, n in bf16.shapes]
    with cpu_cached_launches(interpret=False):
        for mode in a.modes.split(","):
            times = {}
            for name, model in (("bf16", bf16), ("mx", mx)):
                model = torch.compile(model) if mode == "compiled" else model

                def step(model=model):
                    torch.autograd.backward(model(xs), grads)

                times[name] = wall_per_call(step, a.steps, warmup=5) * 1e6
            print(f"{mode}: bf16 {times['bf16']:.0f} us/step, MX {times['mx']:.0f} us/step "
                  f"(+{times['mx'] - times['bf16']:.0f})", flush=True)  # fmt: skip
    print(f"torch {torch.__version__}, {a.tokens} tokens, hidden {a.hidden}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
