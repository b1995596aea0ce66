#!/usr/bin/env bash
# Current k = 4 rounds on HEAD: Qwen2.5 7B + 0.5B and Llama 3.1 8B + 3.2 1B (random weights, costs only).
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
FP=/tmp/fp
for fam in qwen2.5 llama-3.1; do
  PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/family_pairs.py --family $fam --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
  echo "== build $fam rc=$? at $SECONDS s" | tee -a $LOG
  left=$((590 - SECONDS)); [ $left -lt 50 ] && { echo "no time for $fam" | tee -a $LOG; continue; }
  PYTHONPATH=$PWD/src timeout $(( left < 120 ? left : 120 )) python3 -m specgen.cli.main bench -p $FP/$fam/pair.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > $OUT/$fam.json 2> /tmp/$fam.err
  echo "$fam rc=$? at $SECONDS" | tee -a $LOG; tail -2 /tmp/$fam.err | cut -c1-200
done
python3 benchmarks/bench_summary.py $OUT/qwen2.5.json $OUT/llama-3.1.json | tee -a $LOG
