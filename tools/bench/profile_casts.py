"""Profile one launch of each Triton cast at 16384x8192 bf16 (run on a GPU, under ncu).

Prints each kernel's registers, spills and shared memory, then runs each cast (and a
device-to-device copy of x, the reference) once
between cudaProfilerStart/Stop so that ``ncu --profile-from-start off`` sees only those
launches. From tools/bench (PYTHONPATH as run_all.sh sets it):
  ncu --clock-control none --profile-from-start off --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section InstructionStats \
      python3 profile_casts.py
"""

from __future__ import annotations

import torch
from casts import run_cast

import mx_kernels


def main() -> None:
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
