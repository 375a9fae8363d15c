"""What the benchmarks under tools/bench share: timing and its baselines, the Llama-3-8B
shapes, the seven linears of one layer, the cast harness, the environment line and the
markdown tables (printed, and kept under ``$OUT``).

Each script imports it as ``common`` (Python puts a script's own folder first on
``sys.path``; the scripts under ``diagnostics/`` add this folder). Importing it puts the
repository's package sources first on ``sys.path`` too, so the scripts run the working
tree, installed or not; it imports no mx package itself (each function that needs one
imports it).
"""

from __future__ import annotations

import copy
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "LINEAR_NAMES",
    "LLAMA3_8B",
    "ROOT",
    "TOKENS",
    "CopyBaseline",
    "LinearShape",
    "SevenLinears",
    "bench_ms",
    "bf16_and_mx",
    "cast_bytes",
    "environment",
    "graph_and_bench_ms",
    "graph_ms",
    "llama3_8b_config",
    "llama3_8b_linears",
    "md_table",
    "publish",
    "run_cast",
    "same_bits",
    "seven_linear_inputs",
    "step_fn",
    "wall_per_call",
]

ROOT = Path(__file__).resolve().parents[2]
for _pkg in reversed(("mx-core", "mx-kernels", "mx-dtensor", "mx-nn")):
    sys.path.insert(0, str(ROOT / "packages" / _pkg / "src"))

# --- timing ----------------------------------------------------------------------------


def bench_ms(
    fn: Callable[[], object],
    *,
    warmup: int = 25,
    rep: int = 100,
    grad_to_none: Sequence[torch.Tensor] | None = None,
) -> float:
    """Median milliseconds of ``fn`` under ``triton.testing.do_bench`` (one launch from
    Python per timing, L2 flushed before each; ``warmup`` and ``rep`` in ms)."""
    import triton

    return triton.testing.do_bench(
        fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median"
    )


def graph_ms(fn: Callable[[], object], *, rep: int = 100) -> float:
    """Median milliseconds of ``fn`` replayed back to back in a CUDA graph
    (``triton.testing.do_bench_cudagraph``): no host time between the kernels."""
    import triton

    return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")


def graph_and_bench_ms(fn: Callable[[], object]) -> tuple[float, float]:
    """(:func:`graph_ms`, :func:`bench_ms`) of ``fn`` as the casts are timed: the CUDA
    graph's figure is judged, do_bench's (warm-up 50 ms, 300 ms) shown beside it."""
    return graph_ms(fn, rep=100), bench_ms(fn, warmup=50, rep=300)


def wall_per_call(fn: Callable[[], object], calls: int, warmup: int, rounds: int = 3) -> float:
    """Seconds per call of ``fn``: the best of ``rounds`` rounds of ``calls`` calls queued
    back to back (CUDA synchronized at the end of each round, where there is CUDA),
    after ``warmup`` calls. Host and GPU together: where the host's launch path is
    slower than the kernels, this is the host's time."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


class CopyBaseline:
    """Device-to-device copies of the first ``numel`` elements of one random bf16 buffer
    of ``capacity`` elements: the bandwidth every cast is divided by."""

    def __init__(self, capacity: int, device: str = "cuda") -> None:
        if capacity <= 0:
            raise ValueError(f"capacity={capacity}: must be a positive element count")
        self.src = torch.randn(capacity, device=device, dtype=torch.bfloat16)
        self.dst = torch.empty_like(self.src)

    def warm_up(self, copies: int = 2000) -> None:
        """~0.3 s of copies on an H200: the GPU idles at 390 MHz until worked."""
        for _ in range(copies):
            self.dst.copy_(self.src)

    def ms(self, numel: int) -> tuple[float, float]:
        """(CUDA graph, do_bench) milliseconds of one copy of ``numel`` elements."""
        if not 0 < numel <= self.src.numel():
            raise ValueError(f"numel={numel}: must be in 1..{self.src.numel()}")
        return graph_and_bench_ms(lambda: self.dst[:numel].copy_(self.src[:numel]))

    def tbs(self, numel: int) -> tuple[float, float]:
        """(CUDA graph, do_bench) TB/s of that copy, bytes read plus bytes written."""
        return tuple(4 * numel / ms / 1e9 for ms in self.ms(numel))


# --- Llama-3-8B shapes and the seven linears of one layer ------------------------------

LLAMA3_8B = {"dim": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 32768}
TOKENS = 8192  # tokens per step of the per-layer benchmarks
LINEAR_NAMES = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True, kw_only=True)
class LinearShape:
    """One linear of a layer: ``in_features -> out_features``; ``style`` is how tensor
    parallelism shards it ("colwise": its output, "rowwise": its input)."""

    name: str
    style: str
    in_features: int
    out_features: int

    def __post_init__(self) -> None:
        if self.style not in ("colwise", "rowwise"):
            raise ValueError(f"style={self.style!r}: allowed 'colwise' or 'rowwise'")
        for field in ("in_features", "out_features"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field}={getattr(self, field)}: must be positive")


def llama3_8b_linears(tp: int = 1) -> list[LinearShape]:
    """The seven linears of a Llama-3-8B layer per rank at tensor-parallel degree ``tp``:
    q 4096 -> 4096/tp, k and v 4096 -> 1024/tp, o 4096/tp -> 4096, gate and up
    4096 -> 14336/tp, down 14336/tp -> 4096.

    Raises:
        ValueError: ``tp`` not a positive divisor of 1024 (the k/v width).
    """
    d, ffn = LLAMA3_8B["dim"], LLAMA3_8B["ffn"]
    kv = d // LLAMA3_8B["heads"] * LLAMA3_8B["kv_heads"]
    if tp <= 0 or kv % tp:
        raise ValueError(f"tp={tp}: must be a positive divisor of {kv}")
    col, row = "colwise", "rowwise"
    dims = [("q", col, d, d // tp), ("k", col, d, kv // tp), ("v", col, d, kv // tp),
            ("o", row, d // tp, d), ("gate", col, d, ffn // tp), ("up", col, d, ffn // tp),
            ("down", row, ffn // tp, d)]  # fmt: skip
    return [LinearShape(name=n, style=s, in_features=k, out_features=o) for n, s, k, o in dims]


def llama3_8b_config(*, n_layers: int, max_seq_len: int):
    """An ``mx_nn.models.LlamaConfig`` of Llama-3-8B widths (vocabulary 32768)."""
    from mx_nn.models import LlamaConfig

    return LlamaConfig(
        dim=LLAMA3_8B["dim"], n_layers=n_layers, n_heads=LLAMA3_8B["heads"],
        n_kv_heads=LLAMA3_8B["kv_heads"], hidden_dim=LLAMA3_8B["ffn"],
        vocab_size=LLAMA3_8B["vocab"], max_seq_len=max_seq_len,
    )  # fmt: skip


def _input_widths(shapes: Sequence[LinearShape]) -> list[int]:
    """The widths of q/k/v's, o's, gate/up's and down's inputs."""
    if tuple(s.name for s in shapes) != LINEAR_NAMES:
        raise ValueError(f"shapes {[s.name for s in shapes]}: must be named {LINEAR_NAMES}")
    q, _, _, o, gate, _, down = shapes
    return [q.in_features, o.in_features, gate.in_features, down.in_features]


class SevenLinears(nn.Module):
    """q, k, v, o, gate, up and down of one layer, bias-free, each a child of this
    module (so that ``mx_nn.convert`` gives it a cast scope: MXLinear casts each shared
    input once per call). ``forward`` takes four inputs, as in the layer: q/k/v read the
    first, o the second, gate/up the third and down the fourth."""

    def __init__(self, shapes: Sequence[LinearShape], device: str, dtype=torch.bfloat16):
        super().__init__()
        _input_widths(shapes)  # checks the names
        for s in shapes:
            linear = nn.Linear(s.in_features, s.out_features, bias=False, dtype=dtype)
            self.add_module(s.name, linear.to(device))

    def linears(self) -> list[nn.Module]:
        """The seven layers in :data:`LINEAR_NAMES` order."""
        return [getattr(self, name) for name in LINEAR_NAMES]

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        x_attn, x_o, x_mlp, x_down = xs
        inputs = [x_attn, x_attn, x_attn, x_o, x_mlp, x_mlp, x_down]
        return [layer(x) for layer, x in zip(self.linears(), inputs, strict=True)]


class LayerPath(SevenLinears):
    """A decoder layer's path through its linears, norms and activation at one rank's
    widths: ``h = attention_norm(x)``, q/k/v of h; o of the attention's output (an input
    here: the attention core is left out), ``r = x + o``; ``h2 = ffn_norm(r)``,
    ``out = r + down(silu(gate(h2)) * up(h2))``. The norms are ``nn.RMSNorm`` (eps 1e-5)
    over the whole width: tensor parallelism without sequence parallelism, every rank
    normalising all tokens. ``forward`` takes ``[x, attention output]`` and returns
    ``[q, k, v, out]``."""

    def __init__(self, shapes: Sequence[LinearShape], device: str, dtype=torch.bfloat16):
        super().__init__(shapes, device, dtype)
        dim = shapes[0].in_features
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5, device=device, dtype=dtype)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5, device=device, dtype=dtype)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        x, attention = xs
        h = self.attention_norm(x)
        r = x + self.o(attention)
        h2 = self.ffn_norm(r)
        out = r + self.down(F.silu(self.gate(h2)) * self.up(h2))
        return [self.q(h), self.k(h), self.v(h), out]


def layer_path_inputs(shapes: Sequence[LinearShape], tokens: int, device: str):
    """The two inputs of :class:`LayerPath` of ``shapes`` ([tokens, dim] and [tokens,
    o's input width], bf16, requiring grad) and the grads of its four outputs."""
    bf16 = torch.bfloat16
    q, k, v, o = shapes[0], shapes[1], shapes[2], shapes[3]
    xs = [torch.randn(tokens, w, device=device, dtype=bf16).requires_grad_()
          for w in (q.in_features, o.in_features)]  # fmt: skip
    widths = (q.out_features, k.out_features, v.out_features, o.out_features)
    grads = [torch.randn(tokens, w, device=device, dtype=bf16) for w in widths]
    return xs, grads


def seven_linear_inputs(shapes: Sequence[LinearShape], tokens: int, device: str):
    """The four inputs of :class:`SevenLinears` of ``shapes``, [tokens, width] bf16
    requiring grad, and each output's grad [tokens, out_features]."""
    bf16 = torch.bfloat16
    widths = _input_widths(shapes)
    xs = [torch.randn(tokens, k, device=device, dtype=bf16).requires_grad_() for k in widths]
    grads = [torch.randn(tokens, s.out_features, device=device, dtype=bf16) for s in shapes]
    return xs, grads


def step_fn(model: nn.Module, xs, grads) -> Callable[[], None]:
    """One forward + backward of ``model(xs)`` (weights' grads kept, as in training)."""

    def step():
        torch.autograd.backward(model(xs), grads)

    return step


def bf16_and_mx(make: Callable[[], nn.Module], recipe_or_config) -> tuple[nn.Module, nn.Module]:
    """The bf16 baseline ``make()`` (seeded 0) and an MX copy of it, same weights,
    converted by ``mx_nn.convert`` to ``recipe_or_config`` (a recipe name or config)."""
    import mx_nn

    torch.manual_seed(0)
    bf16 = make()
    return bf16, mx_nn.convert(copy.deepcopy(bf16), recipe_or_config)


# --- the cast harness ------------------------------------------------------------------


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def cast_bytes(kind: str, m: int, k: int, in_bytes: int) -> int:
    """Bytes a cast must move: input read once; fp8 data and E8M0 scales written per
    orientation, or for the "fake_" kinds the fake-quantized values in x's dtype
    (:data:`MIXED_KIND`: values rowwise, codes and scales columnwise)."""
    codes = m * k + m * k // 32
    if kind == MIXED_KIND:  # values along K, codes and scales along M
        return m * k * in_bytes * 2 + codes
    one = in_bytes * m * k if kind.startswith("fake_") else codes
    return m * k * in_bytes + (2 * one if kind.endswith("both") else one)


MIXED_KIND = "fake_rowwise_codes_colwise"
"""The cast kind of ``mx_kernels.fake_quantize_rowwise_quantize_colwise``."""


def run_cast(kind: str, x: torch.Tensor, fmt: str, mode: str, tile=None, hw_round=None):
    """A closure that runs one Triton cast into preallocated outputs and returns them as
    (q_row, s_row, q_col, s_col), None where not computed. Kinds "fake_rowwise",
    "fake_colwise" and "fake_both" write the fake-quantized values ([M, K], x's dtype)
    as q_row / q_col and no scales; :data:`MIXED_KIND` the rowwise values as q_row and
    the columnwise codes and scales. ``tile``: CastTile fields (None: the default)."""
    import mx_core
    from mx_kernels.cast_launch import empty_both, empty_cast, empty_cast_t, launch_cast

    f = mx_core.get_format(fmt)
    fake = kind.startswith("fake_")
    q_row = s_row = q_col = s_col = None
    if kind == MIXED_KIND:
        q_row = torch.empty_like(x)
        q_col, s_col = empty_cast_t(x.shape, f, 32, x.device)
        fake = "rowwise"  # launch_cast's dequantized: the rowwise cast alone
    elif fake:
        q_row, q_col = (torch.empty_like(x) if kind.endswith(o) or kind.endswith("both")
                        else None for o in ("rowwise", "colwise"))  # fmt: skip
    else:  # fp4 qdata is packed: [M, K // 2]
        if kind == "rowwise":
            q_row, s_row = empty_cast(x.shape, f, 32, x.device)
        elif kind == "colwise":
            q_col, s_col = empty_cast_t(x.shape, f, 32, x.device)
        else:  # column-major rowwise scales, as mx_kernels.quantize_both has them
            q_row, s_row_buf, q_col, s_col = empty_both(x.shape, f, 32, x.device)
            s_row = s_row_buf.t()

    def run():
        launch_cast(x, f, 32, mode, q_row, s_row, q_col, s_col, tile, hw_round, dequantized=fake)
        return q_row, s_row, q_col, None if s_col is None else s_col.t()

    return run


# --- environment and tables ------------------------------------------------------------


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"commit unknown ({type(e).__name__})"
    return f"commit {out.stdout.strip()}" if out.returncode == 0 else "commit unknown (no git)"


def environment() -> str:
    """One line: the GPU (or CPU), torch, triton, the commit and the UTC date."""
    import triton

    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        where = f"{p.name} (sm{p.major}{p.minor}, {p.multi_processor_count} SMs)"
    else:
        where = "CPU"
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{where}, torch {torch.__version__}, triton {triton.__version__}, {_commit()}, "
            f"{today}")  # fmt: skip


def md_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table of ``header`` and ``rows`` (cells formatted by the caller)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def publish(text: str, filename: str) -> None:
    """Print ``text`` and the :func:`environment` line; also write both to
    ``$OUT/filename`` when OUT is set (the device tool brings files written there back)."""
    text = f"{text}\n\n{environment()}"
    print("\n" + text)
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / filename
        path.write_text(text + "\n")
        print(f"wrote {path}")
