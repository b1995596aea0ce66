#!/usr/bin/env bash
# Split kernel without software pipelining for steps of several tokens: GPU exactness tests;
# captured 1B (draft picks) and 8B steps, HEAD (old) against the change (new), alternating.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_exact.py tests/test_attention.py -k "not interpreter" > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " /tmp/tests.txt | head -30 | cut -c1-300 | tee -a $LOG
cp /tmp/tests.txt $OUT/tests.txt
for r in 1 2; do for tree in old new; do
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  PYTHONPATH=$root/src timeout 90 python3 benchmarks/bench_kernels.py steps --model 1b --variants graph-draft > /tmp/s$tree.txt 2>&1
  echo "1b $tree$r rc=$? at $SECONDS: $(grep -E '^\| graph-' /tmp/s$tree.txt | tail -1)" | tee -a $LOG
done; done
for tree in old new; do
  left=$((585 - SECONDS)); [ $left -lt 60 ] && { echo "no time for 8b $tree" | tee -a $LOG; continue; }
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  PYTHONPATH=$root/src timeout $(( left < 120 ? left : 120 )) python3 benchmarks/bench_kernels.py steps --model 8b --variants graph-dependent > /tmp/e$tree.txt 2>&1
  echo "8b $tree rc=$? at $SECONDS: $(grep -E '^\| graph-' /tmp/e$tree.txt | tail -1) $(grep -E '^floor' /tmp/e$tree.txt)" | tee -a $LOG
done
