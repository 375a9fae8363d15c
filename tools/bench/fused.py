"""Benchmark the fused producers, RMSNorm + MX cast and SwiGLU + MX cast (on a GPU).

Each against the unfused ops and against copy bandwidth.

Shapes: Llama-3-8B activations, bf16, tokens 8192 and 16384 (``--tokens``): the norm at
K 4096 (``mx_kernels.norm_cast``), SwiGLU at K 14336 (``mx_kernels.swiglu_cast``).
Per shape, timed in CUDA graphs (``do_bench_cudagraph``; ``do_bench`` beside it):

- fused: the Triton kernel into preallocated outputs (y or h, rstd, codes, scales);
- unfused: torch's ops, then ``quantize_rowwise`` of their output: the norm as
  ``rms_norm_reference`` (Hugging Face's LlamaRMSNorm in eager ops) and as
  ``F.rms_norm`` (torch's fused kernel, rounded once: other bits, same bytes); SwiGLU as
  ``F.silu(gate) * up``;
- copy: a device-to-device copy of the bytes the fused kernel must move (the norm: read
  x and weight, write y, rstd, codes and scales; SwiGLU: read gate and up, write h,
  codes and scales), timed the same way in the same run.

"/ copy" is the fused kernel's bandwidth over the copy's (target >= 0.85); "x unfused" is
the unfused time over the fused time. ``--colwise`` adds the both-casts kernels (against
``quantize_both`` of the unfused output), ``--sweep`` times other tiles (each checked
bit-equal to the default's outputs first).

Before timing, on the GPU: codes and scales must equal ``quantize_rowwise`` of the fused
kernel's own y / h, bit for bit, and y must equal the reference given the kernel's rstd
(failures: exit status 1). How many elements of y and h differ from torch's CUDA ops
(rstd: reduction order and CUDA's rsqrtf; h: exp) is printed, not judged.

Usage (from the repository root, on a GPU machine)::

    python3 tools/bench/fused.py                  # both shapes, rowwise, fp8_e4m3 rceil
    python3 tools/bench/fused.py --tokens 8192 --colwise --sweep
Writes the table to $OUT/fused.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import LLAMA3_8B, CopyBaseline, environment, graph_and_bench_ms, md_table, publish

DEVICE = "cuda"
EPS = 1e-5  # Llama-3's norm_eps
TARGET = 0.85  # of copy bandwidth, CUDA graph
# Tiles --sweep times besides the default (FusedTile: block_m, block_k, warps, stages).
SWEEP = {
    ("norm", "rowwise"): [(1, 0, 4), (2, 0, 8), (4, 0, 8), (1, 0, 16)],
    ("norm", "both"): [(32, 128, 4), (32, 256, 8), (32, 512, 16), (32, 128, 4, 3), (32, 256, 8, 2)],
    ("swiglu", "rowwise"): [(8, 1024, 4), (4, 2048, 8), (8, 1024, 8), (1, 4096, 4)],
    ("swiglu", "both"): [(32, 64, 2), (32, 256, 8), (32, 128, 8), (32, 512, 8)],
}


def _outputs(m: int, k: int, f, colwise: bool, dtype) -> dict:
    """Preallocated outputs of a fused kernel for [m, k] (the ops' layouts)."""
    from mx_kernels.cast_launch import empty_both, empty_cast

    out = {"y": torch.empty(m, k, device=DEVICE, dtype=dtype)}
    if colwise:
        q, s_buf, qt, st = empty_both((m, k), f, 32, DEVICE)
        out.update(q=q, s=s_buf.t(), qt=qt, st=st)
    else:
        out["q"], out["s"] = empty_cast((m, k), f, 32, DEVICE)
        out["qt"] = out["st"] = None
    return out


def _codes(out: dict) -> list[torch.Tensor]:
    return [out[n] for n in ("q", "s", "qt", "st") if out[n] is not None]


def _cast_of(y: torch.Tensor, fmt: str, mode: str, colwise: bool) -> list[torch.Tensor]:
    """quantize_rowwise / quantize_both of y, scale buffers as the kernels write them."""
    import mx_kernels

    if not colwise:
        return list(mx_kernels.quantize_rowwise(y, fmt, scale_mode=mode, backend="triton"))
    q, s, qt, st = mx_kernels.quantize_both(y, fmt, scale_mode=mode, backend="triton")
    return [q, s, qt, st.t()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(
        torch.equal(x.view(torch.uint8), z.view(torch.uint8)) for x, z in zip(a, b, strict=True)
    )


def norm_case(m: int, fmt: str, mode: str, colwise: bool, failures: list[str]):
    """(fused: tile -> closure running the kernel, unfused closures by name, bytes the
    fused kernel moves, check: outputs -> what is wrong) of the norm at [m, 4096]; what
    the default tile's first run gets wrong is added to ``failures``."""
    import mx_core
    from mx_kernels.cast import quantize_both, quantize_rowwise
    from mx_kernels.norm_cast import rms_norm_reference
    from mx_kernels.norm_cast_triton import rms_norm_cast_triton

    k, bf16, f = LLAMA3_8B["dim"], torch.bfloat16, mx_core.get_format(fmt)
    x = torch.randn(m, k, device=DEVICE, dtype=bf16)
    w = (1 + 0.1 * torch.randn(k, device=DEVICE)).to(bf16)
    rstd = torch.empty(m, device=DEVICE, dtype=torch.float32)

    def fused(tile=None) -> Callable[[], dict]:
        out = _outputs(m, k, f, colwise, bf16)

        def run():
            rms_norm_cast_triton(x, w, EPS, f, 32, mode, out["y"], rstd, out["q"], out["s"],
                                 out["qt"], out["st"], tile)  # fmt: skip
            return out

        return run

    def check(out: dict) -> list[str]:
        """What is wrong with ``out``: y must be the reference's given the kernel's rstd
        (the tile changes the order of the sum of squares, so rstd may change with it)
        and the codes must be the cast of y."""
        y_given = (w * (x.float() * rstd[:, None]).to(bf16)).to(bf16)
        wrong = (
            [] if torch.equal(out["y"], y_given) else ["y differs from the reference given rstd"]
        )
        if not _same(_codes(out), _cast_of(out["y"], fmt, mode, colwise)):
            wrong.append("codes or scales differ from the cast of the kernel's y")
        return wrong

    out = fused()()
    y_ref, rstd_ref = rms_norm_reference(x, w, EPS)
    what = f"norm {m}x{k} {'both' if colwise else 'rowwise'}"
    failures += [f"{what}: {msg}" for msg in check(out)]
    y_diff, rstd_diff = (out["y"] != y_ref).sum().item(), (rstd != rstd_ref).sum().item()
    print(f"{what}: y differs from torch's CUDA reference in {y_diff} of {m * k} elements, "
          f"rstd in {rstd_diff} of {m} rows")  # fmt: skip
    cast = quantize_both if colwise else quantize_rowwise
    unfused = {
        "rms_norm_reference + cast": lambda: cast(
            rms_norm_reference(x, w, EPS)[0], fmt, scale_mode=mode
        ),
        "F.rms_norm + cast": lambda: cast(F.rms_norm(x, (k,), w, EPS), fmt, scale_mode=mode),
    }
    cast_bytes = (2 if colwise else 1) * ((m * k // 2 if f.is_packed else m * k) + m * k // 32)
    return fused, unfused, 2 * m * k + 2 * k + 2 * m * k + 4 * m + cast_bytes, check


def swiglu_case(m: int, fmt: str, mode: str, colwise: bool, failures: list[str]):
    """As :func:`norm_case`, for SwiGLU at [m, 14336]."""
    import mx_core
    from mx_kernels.cast import quantize_both, quantize_rowwise
    from mx_kernels.swiglu_cast_triton import swiglu_cast_triton

    k, bf16, f = LLAMA3_8B["ffn"], torch.bfloat16, mx_core.get_format(fmt)
    gate = torch.randn(m, k, device=DEVICE, dtype=bf16)
    up = torch.randn(m, k, device=DEVICE, dtype=bf16)

    def fused(tile=None) -> Callable[[], dict]:
        out = _outputs(m, k, f, colwise, bf16)

        def run():
            swiglu_cast_triton(gate, up, f, 32, mode, out["y"], out["q"], out["s"], out["qt"],
                               out["st"], tile)  # fmt: skip
            return out

        return run

    h_ref = F.silu(gate) * up
    out = fused()()
    h_default = out["y"].clone()

    def check(out: dict) -> list[str]:
        """What is wrong with ``out``: h must be the default tile's (elementwise: no tile
        changes it) and the codes must be the cast of h."""
        wrong = [] if torch.equal(out["y"], h_default) else ["h differs from the default tile's"]
        if not _same(_codes(out), _cast_of(out["y"], fmt, mode, colwise)):
            wrong.append("codes or scales differ from the cast of the kernel's h")
        return wrong

    what = f"swiglu {m}x{k} {'both' if colwise else 'rowwise'}"
    failures += [f"{what}: {msg}" for msg in check(out)]
    print(f"{what}: h differs from torch's F.silu(gate) * up in "
          f"{(out['y'] != h_ref).sum().item()} of {m * k} elements")  # fmt: skip
    cast = quantize_both if colwise else quantize_rowwise
    unfused = {"F.silu(gate) * up + cast": lambda: cast(F.silu(gate) * up, fmt, scale_mode=mode)}
    cast_bytes = (2 if colwise else 1) * ((m * k // 2 if f.is_packed else m * k) + m * k // 32)
    return fused, unfused, 4 * m * k + 2 * m * k + cast_bytes, check


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--fmt", default="fp8_e4m3")
    p.add_argument("--mode", default="rceil")
    p.add_argument("--colwise", action="store_true", help="also the both-casts kernels")
    p.add_argument("--sweep", action="store_true", help="also time other tiles")
    p.add_argument("--quick", action="store_true", help="the first token count only")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("fused.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print(environment())
    failures: list[str] = []
    cases = []  # (label, (fused, unfused, bytes, check), sweep tiles)
    for colwise in (False, True) if args.colwise else (False,):
        kind = "both" if colwise else "rowwise"
        for m in args.tokens[:1] if args.quick else args.tokens:
            norm = norm_case(m, args.fmt, args.mode, colwise, failures)
            cases.append((f"rms_norm {kind} {m}x{LLAMA3_8B['dim']}", norm, SWEEP["norm", kind]))
            swiglu = swiglu_case(m, args.fmt, args.mode, colwise, failures)
            cases.append((f"swiglu {kind} {m}x{LLAMA3_8B['ffn']}", swiglu, SWEEP["swiglu", kind]))
    baseline = CopyBaseline(max(case[2] for _, case, _ in cases) // 4 + 1, DEVICE)
    baseline.warm_up()
    rows = []
    for label, (fused, unfused, nbytes, check), sweep in cases:
        copy_graph, copy_bench = baseline.tbs(nbytes // 4)  # a copy of n bf16 moves 4n bytes
        default = fused()
        graph, bench = graph_and_bench_ms(default)
        bw = nbytes / graph / 1e9
        ratio = bw / copy_graph
        verdict = f"{TARGET:.2f} {'met' if ratio >= TARGET else 'MISSED'}"
        unfused_ms = {name: graph_and_bench_ms(fn)[0] for name, fn in unfused.items()}
        speedups = ", ".join(f"{u / graph:.2f} ({name})" for name, u in unfused_ms.items())
        rows.append((label, "fused, default tile", f"{graph:.3f}", f"{bw:.2f}", f"{ratio:.3f}",
                     f"{nbytes / bench / 1e9 / copy_bench:.3f}", speedups, verdict))  # fmt: skip
        for name, u in unfused_ms.items():
            rows.append((label, f"unfused: {name}", f"{u:.3f}", "-", "-", "-", "-", "-"))
        if args.sweep:
            for tile in sweep:
                run = fused(tile)
                wrong = check(run())
                if wrong:
                    failures += [f"{label}, tile {tile}: {msg}" for msg in wrong]
                    continue
                g = graph_and_bench_ms(run)[0]
                rows.append((label, f"fused, tile {tile}", f"{g:.3f}",
                             f"{nbytes / g / 1e9:.2f}", f"{nbytes / g / 1e9 / copy_graph:.3f}",
                             "-", "-", "-"))  # fmt: skip
    note = (
        f"{args.fmt}, scale mode {args.mode}, bf16 in; ms, TB/s and / copy: CUDA graph "
        "(/ copy, do_bench: do_bench's times, L2 flushed); bytes: what the fused kernel "
        "must move, the copy moving the same bytes; x unfused: unfused ms / fused ms"
    )
    header = ["case", "variant", "ms", "TB/s", "/ copy", "/ copy, do_bench", "x unfused",
              "target"]  # fmt: skip
    publish(f"{note}\n\n{md_table(header, rows)}", "fused.md")
    for f in failures:
        print("FAILED", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
