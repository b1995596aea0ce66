#!/usr/bin/env bash
# Draft picks chosen inside the step: GPU tests; Llama 3.1 8B + 3.2 1B k = 4 rounds, HEAD's
# package table (old) against the in-step picks (new), alternating; then captured 1B steps.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_tune.py tests/test_linear.py "tests/test_gpu.py::test_greedy_speculative_equals_target_only_float32" > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " /tmp/tests.txt | head -30 | cut -c1-300 | tee -a $LOG
FP=/tmp/fp; P=$FP/llama-3.1
PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
for r in 1 2; do for tree in old new; do
  left=$((480 - SECONDS)); [ $left -lt 40 ] && { echo "no time for $tree$r" | tee -a $LOG; continue; }
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  PYTHONPATH=$root/src timeout $(( left < 110 ? left : 110 )) python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > /tmp/$tree$r.json 2> /tmp/$tree$r.err
  echo "$tree$r rc=$? at $SECONDS" | tee -a $LOG; cp /tmp/$tree$r.json $OUT/ 2>/dev/null; tail -2 /tmp/$tree$r.err | cut -c1-200
done; done
python3 benchmarks/bench_summary.py $(ls /tmp/old*.json /tmp/new*.json 2>/dev/null) | tee -a $LOG
for tree in old new; do
  left=$((585 - SECONDS)); [ $left -lt 30 ] && break
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  (cd $root && PYTHONPATH=$root/src timeout $left python3 benchmarks/bench_kernels.py steps --model 1b --variants graph-draft) > /tmp/s.txt 2>&1
  echo "1b $tree: $(grep -E '^\| graph-' /tmp/s.txt | tail -1) $(grep -E '^floor' /tmp/s.txt)" | tee -a $LOG
done
