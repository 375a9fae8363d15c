#!/usr/bin/env bash
# Every H200 measurement the BENCHMARKS.md tables need, in one device call (its limit is
# 10 minutes; each step has its own timeout so that a slow step leaves the others'
# results). From the repository root on the GPU machine:
#   bash tools/bench/run_all.sh            # writes $OUT/{casts,gemm,linear}{.md,_log.txt}
#   GEMM_DESIGNS=dequant_bf16 bash tools/bench/run_all.sh   # skip the slow fused designs
#   STEPS="casts profile linear" bash tools/bench/run_all.sh  # a subset; profile = ncu
# Steps: casts gemm linear (the default), profile (ncu over diagnostics/profile_casts.py),
# host (per-op host time), tp (the seven linears of a Llama-3-8B layer at TP per-rank
# shapes), tp_path (the same with the layer's norms and SwiGLU), tp_profile (where the
# TP=8 step's time goes), dtensor (the sharding rules at
# tp=1), parallelize (parallelize at tp=1 against convert), train (mx-train, bf16 against
# mxfp8 on a larger model), gpu_check (every Triton kernel against mx-core's reference,
# tools/gpu_check.py; gemm_check: its GEMM designs alone, every format pair), fused (the fused producers against copy bandwidth), inline_ab
# (inline casts against ops at TP=8 and 4), repro (diagnostics/repro_both_fp4.py). Each script's docstring says what it measures and its target.
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
steps=" ${STEPS:-casts gemm linear} "
[[ $steps == *" casts "* ]] && step casts 250 python3 casts.py --check quick --sweep
[[ $steps == *" gemm "* ]] && step gemm 200 python3 gemm.py --designs "$designs"
[[ $steps == *" linear "* ]] && step linear 170 python3 linear.py --compile
[[ $steps == *" gpu_check "* ]] && step gpu_check 300 python3 ../gpu_check.py --quick --budget-s 240
[[ $steps == *" gemm_check "* ]] && step gemm_check 300 python3 ../gpu_check.py --quick --parts gemms --budget-s 240
[[ $steps == *" fused "* ]] && step fused 200 python3 fused.py --colwise
[[ $steps == *" repro "* ]] && step repro 60 python3 diagnostics/repro_both_fp4.py
[[ $steps == *" host "* ]] && step host 120 python3 host_cost.py --check
[[ $steps == *" tp "* ]] && step tp 240 python3 tp_layer.py --cudagraphs
[[ $steps == *" tp_path "* ]] && step tp_path 240 python3 tp_layer.py --layer --cudagraphs
[[ $steps == *" tp_profile "* ]] && step tp_profile 200 python3 tp_layer.py --profile --tp 8
[[ $steps == *" inline_ab "* ]] && step inline_ab 200 python3 tp_layer.py --inline-ab --tp 8,4
[[ $steps == *" dtensor "* ]] && step dtensor 150 python3 dtensor_overhead.py --compile
[[ $steps == *" parallelize "* ]] && step parallelize 100 python3 parallelize_overhead.py
[[ $steps == *" train "* ]] && step train 240 python3 -m mx_nn.train --compare --compile \
  --device cuda --steps 300 --layers 8 --dim 2048 --heads 16 --kv-heads 4 --seq 2048 \
  --batch 8 --out "$OUT/train"
[[ $steps == *" profile "* ]] && step profile 100 ncu --clock-control none \
  --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section InstructionStats \
  --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_requests_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  python3 diagnostics/profile_casts.py
grep -h "check\|FAIL\|fused vs" "$OUT"/*_log.txt | head -20
exit $status
