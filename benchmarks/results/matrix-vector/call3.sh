#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 330 python3 benchmarks/bench_kernels.py table --models llama-3.1,bench,qwen2.5,qwen3,gemma-2 --table "$OUT/linear.json" --out /tmp/table.json > "$OUT/table.txt" 2>&1
echo "== table rc=$? at $SECONDS s" | tee -a $LOG
mkdir -p ~/.cache/specgen/kernels && cp $OUT/linear.json ~/.cache/specgen/kernels/linear.json
for spec in new:graph-draft old:graph-dependent new:graph-dependent new:graph-draft; do
  tree=${spec%%:*}; v=${spec#*:}; src=$PWD/src; [ $tree = old ] && src=$PWD/.gpu/old/src
  left=$((585 - SECONDS)); [ $left -lt 40 ] && { echo "no time for $spec" | tee -a $LOG; break; }
  if [ $tree = old ]; then mv ~/.cache/specgen/kernels/linear.json /tmp/l.json; fi
  PYTHONPATH=$src timeout $left python3 $([ $tree = old ] && echo .gpu/old/benchmarks || echo benchmarks)/bench_kernels.py steps --model 1b --variants $v > /tmp/steps-$tree-$v.txt 2>&1
  echo "== 1b $spec rc=$? at $SECONDS s" | tee -a $LOG; grep -E "^\{|^floor" /tmp/steps-$tree-$v.txt | cut -c1-400 | tee -a $LOG
  if [ $tree = old ]; then mv /tmp/l.json ~/.cache/specgen/kernels/linear.json; fi
done
