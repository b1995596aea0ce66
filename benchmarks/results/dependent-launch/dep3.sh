#!/usr/bin/env bash
# After the helpers-by-name fix: GPU tests (compile paths included), then the bench pair's step
# shapes without and with dependent launch, alternating.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
end=$((SECONDS + 330))
for f in tests/test_gpu.py tests/test_dependent.py tests/test_compiled.py tests/test_warp_kernel.py tests/test_eagle.py tests/test_exact.py; do
  left=$((end - SECONDS)); [ $left -le 10 ] && { echo "SKIPPED $f (time)" | tee -a "$LOG"; continue; }
  name=$(basename $f .py)
  timeout $left python3 -m pytest -q -rfEs -p no:cacheprovider $f > $OUT/$name.txt 2>&1
  echo "$name rc=$? at $SECONDS s: $(tail -1 $OUT/$name.txt)" | tee -a "$LOG"
done
for spec in "bench-draft 1" "bench-target 1" "bench-draft 2" "bench-target 2"; do
  set -- $spec; m=$1; run=$2
  for v in graph-io graph-dependent; do
    left=$((580 - SECONDS)); [ $left -lt 30 ] && { echo "no time for $m $v" | tee -a "$LOG"; break 2; }
    timeout $(( left < 100 ? left : 100 )) python3 benchmarks/bench_kernels.py steps --model $m --variants $v \
      --out /tmp/$v-$m-$run.json > /tmp/steps-$v-$m-$run.txt 2>&1
    echo "== $m $v run $run rc=$? at $SECONDS s" | tee -a "$LOG"; grep -E "^\| graph" /tmp/steps-$v-$m-$run.txt | cut -c1-170 | tee -a "$LOG"
  done
done
