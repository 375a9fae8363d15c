"""Profile one launch of each Triton cast at 16384x8192 bf16 (run on a GPU, under ncu).

Prints each kernel's registers, spills and shared memory, then runs each cast (and a
device-to-device copy of x, the reference) once
between cudaProfilerStart/Stop so that ``ncu --profile-from-start off`` sees only those
launches. No target: the counters explain the casts' ratios to copy bandwidth. From
tools/bench (PYTHONPATH as run_all.sh sets it; ``STEPS=profile bash run_all.sh`` runs
it with more sections and metrics):
  ncu --clock-control none --profile-from-start off --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section InstructionStats \
      python3 diagnostics/profile_casts.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/bench, for common

import torch  # noqa: E402
from common import run_cast  # noqa: E402

import mx_kernels  # noqa: E402


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    x = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
    runs = {kind: run_cast(kind, x, "fp8_e4m3", "rceil") for kind in ("rowwise", "colwise", "both")}
    runs["fake_quantize_both"] = lambda: mx_kernels.fake_quantize_both(x)
    copy = torch.empty_like(x)
    runs["copy (reference)"] = lambda: copy.copy_(x)
    for run in runs.values():
        run()  # compile outside the profiled range
    torch.cuda.synchronize()
    from mx_kernels.cast_triton import mx_cast_kernel

    for key, kernel in mx_cast_kernel.device_caches[torch.cuda.current_device()][0].items():
        meta = kernel.metadata
        print(f"mx_cast_kernel regs {kernel.n_regs} spills {kernel.n_spills} "
              f"smem {meta.shared} warps {meta.num_warps}: {str(key)[:160]}")  # fmt: skip
    torch.cuda.cudart().cudaProfilerStart()
    for kind, run in runs.items():
        torch.cuda.nvtx.range_push(kind)
        run()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled:", ", ".join(runs))


if __name__ == "__main__":
    main()
