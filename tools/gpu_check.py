"""Every Triton kernel of mx-kernels run on a real GPU against mx-core's reference.

The CPU tests run these kernels under Triton's interpreter, which neither compiles them
nor uses the GPU's own conversions and MMAs; this script is the same comparison on
CUDA. Casts, fake quantize and dequantize must match bit for bit; the scaled-matmul
designs are compared with the emulated GEMM (fp32 dequantize + fp32 matmul) within a
named tolerance, since their accumulation order differs.

    python tools/gpu_check.py [--quick] [--budget-s SECONDS]

``--quick`` checks the casts in the recipes' scale modes (rceil, floor) on bf16 and fp32
input (every format, every kernel); the full run adds the other modes and fp16 (each
combination compiles its own kernels: about 10 minutes on an H100). Prints one table per
kind of kernel as it finishes (also written to ``$OUT/gpu_check.md`` when OUT is set) and
exits 1 if anything differs, or if the time budget left a combination unchecked (listed).
Needs a CUDA GPU of compute capability >= 9.0.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for _pkg in reversed(("mx-core", "mx-kernels")):
    sys.path.insert(0, str(ROOT / "packages" / _pkg / "src"))

import mx_core  # noqa: E402
import mx_kernels  # noqa: E402

FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1")
DEQUANTIZE_FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
"""The formats of the Triton dequantize (fp6 runs mx-core's reference)."""
MODES = ("floor", "ceil", "even", "rceil")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DEVICE = torch.device("cuda")
"""Where the kernels run (``--device``; ``cpu`` under ``TRITON_INTERPRET=1`` is how the
repository's tests keep this script working without a GPU)."""
LARGE = 100_000
"""Shapes of more elements run only the scale modes of the recipes (``LARGE_MODES``) on
bf16 input: mx-core's reference takes about a second per million elements on CPU."""
LARGE_MODES = ("rceil", "floor")
QUICK_MODES, QUICK_DTYPES = LARGE_MODES, (torch.bfloat16, torch.float32)
"""``--quick``: the scale modes of the recipes, and the input dtypes MXLinear casts."""
GEMM_TOLERANCE = {torch.bfloat16: 2.0**-8, torch.float32: 1e-5}
"""Largest allowed max|got - emulated| / max|emulated| of a GEMM per output dtype: one
bf16 rounding of the output; for fp32 output, fp32 accumulation in another order."""
FP8_MMA_FP32_TOLERANCE = 2.0**-12
"""The ``fp8_mma`` design with an fp32 result: sm90's fp8 MMA keeps about 14 bits of
its accumulation (DeepSeek-V3 technical report, section 3.3.2, on H800), so each
32-wide block's partial carries a relative error near 2**-14 (measured on an H100:
5.9e-05 to 7.8e-05, docs/benchmark-log.md, 2026-12-07 'GPU check on the H100'); bf16
results hide it."""


def _data(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows of very different magnitudes, some exact ties on the fp8 grid, a few zeros
    (all within fp16's range)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-12, 12, shape[:-1], generator=g)).unsqueeze(-1)
    flat = x.view(-1)
    flat[::7] = torch.randint(-64, 64, flat[::7].shape, generator=g) / 4
    flat[3::97] = 0.0
    return x.to(dtype)


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.is_floating_point() and got.dtype.itemsize >= 2:
        return torch.equal(
            got.view(torch.int16 if got.itemsize == 2 else torch.int32),
            want.view(torch.int16 if want.itemsize == 2 else torch.int32),
        )
    return torch.equal(_u8(got.contiguous()), _u8(want.contiguous()))


def check_casts(shapes, failures: list[str], modes, dtypes, deadline: float) -> list[tuple]:
    """quantize_rowwise/colwise/both, fake_quantize_rowwise/colwise/both and
    dequantize_rowwise: Triton on CUDA vs mx-core on CPU, bit for bit. A combination not
    started before ``deadline`` (``time.monotonic()``) is a failure: unchecked."""
    rows = []
    blocked = "scale_layout" in inspect.signature(mx_kernels.quantize_rowwise).parameters
    for fmt in FORMATS:
        for mode in modes:
            for dtype in dtypes:
                if time.monotonic() > deadline:
                    failures.append(f"casts {fmt} {mode} {dtype}: not checked (time budget)")
                    continue
                checked = ok = 0
                for i, shape in enumerate(shapes):
                    if shape[0] * shape[1] > LARGE and (
                        mode not in LARGE_MODES or dtype != torch.bfloat16
                    ):
                        continue  # large shapes: the training casts' modes, bf16 input
                    x = _data(shape, dtype, seed=i)
                    xc = x.to(DEVICE)
                    t = mx_core.quantize(x, fmt, dim=-1, scale_mode=mode)
                    tt = mx_core.quantize(x.t().contiguous(), fmt, dim=-1, scale_mode=mode)
                    q, s, qt, st = t.qdata, t.scale, tt.qdata, tt.scale
                    deq, deq_t = t.dequantize(dtype), tt.dequantize(dtype).t()
                    kw = dict(scale_mode=mode, backend="triton")
                    pairs = {
                        "rowwise": (mx_kernels.quantize_rowwise(xc, fmt, **kw), (q, s)),
                        "colwise": (mx_kernels.quantize_colwise(xc, fmt, **kw), (qt, st)),
                        "both": (mx_kernels.quantize_both(xc, fmt, **kw), (q, s, qt, st)),
                        "fake rowwise": (
                            (mx_kernels.fake_quantize_rowwise(xc, fmt, **kw),),
                            (deq,),
                        ),
                        "fake colwise": (
                            (mx_kernels.fake_quantize_colwise(xc, fmt, **kw),),
                            (deq_t,),
                        ),
                        "fake both": (mx_kernels.fake_quantize_both(xc, fmt, **kw), (deq, deq_t)),
                        "fake rowwise, codes colwise": (
                            mx_kernels.fake_quantize_rowwise_quantize_colwise(xc, fmt, **kw),
                            (deq, qt, st),
                        ),
                    }
                    for out_dtype in (torch.bfloat16, torch.float32):
                        if fmt not in DEQUANTIZE_FORMATS:
                            break
                        got = mx_kernels.dequantize_rowwise(
                            q.to(DEVICE), s.to(DEVICE), fmt, out_dtype=out_dtype, backend="triton"
                        )
                        want = t.dequantize(out_dtype)
                        pairs[f"dequantize to {out_dtype}"] = ((got,), (want,))
                    if blocked:
                        got = mx_kernels.quantize_rowwise(xc, fmt, scale_layout="blocked", **kw)
                        want = mx_kernels.swizzle_scales(s).flatten()
                        pairs["rowwise, blocked scales"] = ((got[1],), (want,))
                    for name, (got, want) in pairs.items():
                        checked += 1
                        if len(got) == len(want) and all(map(_same, got, want)):
                            ok += 1
                        else:
                            failures.append(f"{name} {fmt} {mode} {dtype} {shape}")
                rows.append((fmt, mode, str(dtype).removeprefix("torch."), checked, ok))
    return rows


def check_swizzle(failures: list[str]) -> list[tuple]:
    """swizzle_scales / unswizzle_scales on CUDA vs CPU."""
    rows = []
    for shape in ((1, 1), (33, 3), (128, 4), (130, 160), (4096, 128)):
        s = torch.randint(0, 255, shape, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        got = mx_kernels.swizzle_scales(s.to(DEVICE))
        back = mx_kernels.unswizzle_scales(got, shape)
        ok = _same(got, mx_kernels.swizzle_scales(s)) and _same(back, s)
        if not ok:
            failures.append(f"swizzle {shape}")
        rows.append((str(shape), "yes" if ok else "NO"))
    return rows


def check_gemms(shapes, failures: list[str], deadline: float) -> list[tuple]:
    """Each Triton design of scaled_mm vs the emulated GEMM, both on CUDA (a format pair
    not started before ``deadline`` is a failure: unchecked)."""
    from mx_kernels.matmul_triton import scaled_mm_triton
    from mx_kernels.settings import DESIGNS

    pairs = (
        ("fp8_e4m3", "fp8_e4m3"),
        ("fp8_e5m2", "fp8_e4m3"),
        ("fp8_e4m3", "fp8_e5m2"),
        ("fp4_e2m1", "fp4_e2m1"),
        ("fp4_e2m1", "fp8_e4m3"),
    )
    rows = []
    for a_fmt, b_fmt in pairs:
        if time.monotonic() > deadline:
            failures.append(f"scaled_mm {a_fmt} x {b_fmt}: not checked (time budget)")
            continue
        for m, k, n in shapes:
            a = mx_core.quantize(_data((m, k), torch.bfloat16, 1).to(DEVICE), a_fmt)
            b = mx_core.quantize(_data((n, k), torch.bfloat16, 2).to(DEVICE), b_fmt)
            a_q = a.qdata if a_fmt != "fp4_e2m1" else a.qdata.view(torch.uint8)
            b_q = b.qdata if b_fmt != "fp4_e2m1" else b.qdata.view(torch.uint8)
            for out_dtype in (torch.bfloat16, torch.float32):
                want = mx_kernels.scaled_mm(
                    a.qdata, a.scale, b.qdata, b.scale, out_dtype=torch.float32, backend="emulated"
                )
                scale = want.abs().max().item() or 1.0
                for design in DESIGNS:
                    got = scaled_mm_triton(a_q, a.scale, b_q, b.scale, out_dtype, design=design)
                    err = (got.float() - want).abs().max().item() / scale
                    fp8_mma_fp32 = design == "fp8_mma" and out_dtype == torch.float32
                    tol = FP8_MMA_FP32_TOLERANCE if fp8_mma_fp32 else GEMM_TOLERANCE[out_dtype]
                    ok = err <= tol and bool(torch.isfinite(got).all())
                    if not ok:
                        failures.append(
                            f"scaled_mm {design} {a_fmt}x{b_fmt} {(m, k, n)} {out_dtype}: {err:.3g}"
                        )
                    rows.append(
                        (
                            design,
                            f"{a_fmt} x {b_fmt}",
                            f"{m}x{k}x{n}",
                            str(out_dtype).removeprefix("torch."),
                            f"{err:.2e}",
                            "yes" if ok else "NO",
                        )
                    )
    return rows


def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _environment() -> str:
    import triton

    if DEVICE.type == "cuda":
        p = torch.cuda.get_device_properties(DEVICE)
        where = f"{p.name} (sm{p.major}{p.minor})"
    else:
        where = f"{DEVICE.type} (Triton's interpreter)"

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown commit"
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{where}, torch {torch.__version__}, triton {triton.__version__}, {commit}, {today}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="the recipes' scale modes, bf16 and fp32 input"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=float("inf"),
        help="start no new combination after this many seconds (the rest fail as unchecked)",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda (default), or cpu under TRITON_INTERPRET=1 to check the script itself",
    )
    parser.add_argument(
        "--parts",
        default="casts,swizzle,gemms",
        help="comma-separated: casts, swizzle, gemms (default: all three)",
    )
    args = parser.parse_args(argv)
    parts_asked = set(args.parts.split(","))
    if not parts_asked or parts_asked - {"casts", "swizzle", "gemms"}:
        parser.error(f"--parts: {args.parts!r}; allowed: casts, swizzle, gemms, comma-separated")
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and (
        not torch.cuda.is_available() or torch.cuda.get_device_capability(DEVICE) < (9, 0)
    ):
        print("gpu_check: needs a CUDA GPU of compute capability >= 9.0", file=sys.stderr)
        return 2
    if DEVICE.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        print("gpu_check: --device cpu needs TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    cast_shapes = [(32, 32), (64, 96), (160, 160), (256, 4096), (1024, 2048)]
    gemm_shapes = [(128, 256, 128), (133, 512, 528), (1000, 4096, 2048)]
    modes, dtypes = (QUICK_MODES, QUICK_DTYPES) if args.quick else (MODES, DTYPES)
    if DEVICE.type != "cuda":  # the interpreter: small shapes, one scale mode and dtype
        cast_shapes, gemm_shapes = [(32, 32), (64, 96)], [(33, 64, 48)]
        modes, dtypes = MODES[-1:], DTYPES[1:2]
    elif not args.quick:
        gemm_shapes.append((4096, 8192, 4096))
    deadline = time.monotonic() + args.budget_s
    failures: list[str] = []
    parts: list[str] = []

    def emit(*texts: str) -> None:
        # printed as each part finishes, so a run cut short still shows what it checked
        parts.extend(texts)
        print("\n\n".join(texts), end="\n\n", flush=True)

    emit(_environment())
    if "casts" in parts_asked:
        emit(
            "## Casts, fake quantize, dequantize (bit for bit)",
            _table(
                ("format", "scale mode", "input", "checks", "equal"),
                check_casts(cast_shapes, failures, modes, dtypes, deadline),
            ),
        )
    if "swizzle" in parts_asked:
        emit("## Scale swizzle (bit for bit)", _table(("scales", "equal"), check_swizzle(failures)))
    if "gemms" in parts_asked:
        emit(
            "## scaled_mm Triton designs vs emulated (max error / max |emulated|)",
            _table(
                ("design", "formats", "M x K x N", "out", "error", "within"),
                check_gemms(gemm_shapes, failures, deadline),
            ),
        )
    emit(f"Failures: {len(failures)}" + "".join(f"\n- {f}" for f in failures[:50]))
    text = "\n\n".join(parts)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "gpu_check.md").write_text(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
