#!/usr/bin/env bash
# Draft picks chosen inside the step: Qwen3 8B + 0.6B k = 4 rounds, HEAD's package table
# (old) against the in-step picks (new), alternating.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
FP=/tmp/fp; P=$FP/qwen3
PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/family_pairs.py --family qwen3 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
for r in 1 2; do for tree in old new; do
  left=$((420 - SECONDS)); [ $left -lt 40 ] && { echo "no time for $tree$r" | tee -a $LOG; continue; }
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  PYTHONPATH=$root/src timeout $(( left < 110 ? left : 110 )) python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > /tmp/$tree$r.json 2> /tmp/$tree$r.err
  echo "$tree$r rc=$? at $SECONDS" | tee -a $LOG; cp /tmp/$tree$r.json $OUT/ 2>/dev/null; tail -2 /tmp/$tree$r.err | cut -c1-200
done; done
python3 benchmarks/bench_summary.py $(ls /tmp/old*.json /tmp/new*.json 2>/dev/null) | tee -a $LOG
