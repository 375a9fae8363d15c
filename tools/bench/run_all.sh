#!/usr/bin/env bash
# Every H200 measurement the BENCHMARKS.md tables need, in one device call (its limit is
# 10 minutes; each step has its own timeout so that a slow step leaves the others'
# results). From the repository root on the GPU machine:
#   bash tools/bench/run_all.sh            # writes $OUT/{casts,gemm,linear}{.md,_log.txt}
#   GEMM_DESIGNS=dequant_bf16 bash tools/bench/run_all.sh   # skip the slow fused designs
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$root/packages/mx-core/src:$root/packages/mx-kernels/src:$root/packages/mx-dtensor/src:$root/packages/mx-nn/src
export OUT=${OUT:-$root/bench-out}
mkdir -p "$OUT"
cd "$root/tools/bench" || exit 2
designs=${GEMM_DESIGNS:-dot_scaled,fp8_mma,dequant_bf16}
status=0
step() {  # step NAME SECONDS COMMAND...
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" "$@" >"$OUT/${name}_log.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc"
  ((rc == 0)) || status=1
}
step casts 220 python3 casts.py --check quick --sweep
step gemm 200 python3 gemm.py --designs "$designs"
step linear 150 python3 linear.py --compile
grep -h "check\|FAIL\|fused vs" "$OUT"/*_log.txt | head -20
exit $status
