#!/usr/bin/env bash
# Matrix-vector projections: GPU tests; captured 1B steps (HEAD before, draft picks before and after
# the early release); the Llama 3.1 8B + 3.2 1B random-weight pair's k = 4 rounds, HEAD before vs now.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 170 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_exact.py tests/test_dependent.py tests/test_linear.py "tests/test_gpu.py::test_greedy_speculative_equals_target_only_float32" > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " /tmp/tests.txt | head -30 | cut -c1-300 | tee -a $LOG
for spec in old:graph-dependent mid:graph-draft new:graph-draft old:graph-dependent new:graph-draft; do
  tree=${spec%%:*}; v=${spec#*:}; root=$PWD; [ $tree != new ] && root=$PWD/.gpu/$tree
  PYTHONPATH=$root/src timeout 60 python3 $root/benchmarks/bench_kernels.py steps --model 1b --variants $v > /tmp/s.txt 2>&1
  echo "== 1b $spec rc=$? at $SECONDS s: $(grep -oE '"step_1_ms": [0-9.]+|"step_1_over_floor": [0-9.]+' /tmp/s.txt | tr '\n' ' ')" | tee -a $LOG
done
FP=/tmp/fp; P=$FP/llama-3.1
PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
for r in 1 2; do for tree in old new; do
  left=$((590 - SECONDS)); [ $left -lt 40 ] && { echo "no time for $tree$r" | tee -a $LOG; continue; }
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  PYTHONPATH=$root/src timeout $(( left < 110 ? left : 110 )) python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > /tmp/$tree$r.json 2> /tmp/$tree$r.err
  echo "$tree$r rc=$? at $SECONDS" | tee -a $LOG; cp /tmp/$tree$r.json $OUT/ 2>/dev/null; tail -2 /tmp/$tree$r.err | cut -c1-200
done; done
python3 benchmarks/bench_summary.py $(ls /tmp/old*.json /tmp/new*.json 2>/dev/null) | tee -a $LOG
