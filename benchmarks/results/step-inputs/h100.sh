#!/usr/bin/env bash
# Issue 22: the H200-tuned linear table on an H100: 1-token steps with the table of 554bba7
# (.gpu/oldtable: HEAD with that json) and HEAD's, alternating, in one call.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
steps() {  # label dir model
  local label=$1 dir=$2 m=$3; shift 3
  (cd "$dir" && PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/bench_kernels.py steps --model "$m" --variants graph-norm "$@" \
     --out /tmp/$label-$m.json > /tmp/$label-$m.txt 2>&1)
  echo "== $label $m rc=$?" | tee -a "$LOG"; grep -E "^\| graph|floor " /tmp/$label-$m.txt | cut -c1-160 | tee -a "$LOG"
}
for m in 1b 8b; do steps oldtable .gpu/oldtable $m; steps now . $m; steps oldtable .gpu/oldtable $m; steps now . $m; done
