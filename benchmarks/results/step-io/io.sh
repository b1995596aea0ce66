#!/usr/bin/env bash
# Issue 22: gpu/step_io.py. GPU tests, then captured steps without it (graph-norm) and with it
# (graph-io), alternating, two runs each, in one call.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
if [ -n "${TESTS:-}" ]; then
  s=$SECONDS
  timeout ${TT:-300} python3 -m pytest -q -p no:cacheprovider -x $TESTS > "$OUT/tests.txt" 2>&1
  echo "== tests rc=$? $((SECONDS - s)) s" | tee -a "$LOG"; tail -3 "$OUT/tests.txt" | tee -a "$LOG"
fi
for m in ${MODELS:-bench-draft bench-target 1b}; do
  for run in 1 2; do
    for v in graph-norm graph-io; do
      left=$((590 - SECONDS)); [ $left -lt 20 ] && { echo "no time for $m $v" | tee -a "$LOG"; break 3; }
      timeout $(( left < 150 ? left : 150 )) python3 benchmarks/bench_kernels.py steps --model "$m" --variants $v --profile \
        --out /tmp/$v-$m-$run.json > /tmp/$v-$m-$run.txt 2>&1
      echo "== $m $v run $run rc=$?" | tee -a "$LOG"; grep -E "^\| graph" /tmp/$v-$m-$run.txt | cut -c1-170 | tee -a "$LOG"
      python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(' kernels/step', r.get('kernels_per_step'), 'kernel ms', round(r.get('kernel_ms_per_step',0),4), 'gaps ms', r.get('gap_ms_last_step'))" /tmp/$v-$m-$run.json 2>&1 | tail -1 | tee -a "$LOG"
    done
  done
done
