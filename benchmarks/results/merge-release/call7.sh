#!/bin/bash
# Where the 8B's 5-token step spends what its 1-token step does not: profiles of both.
cd "$(dirname "$0")/.."
for t in 1 5; do
  PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/bench_kernels.py steps --model 8b --variants graph-dependent --profile --profile-tokens $t > $OUT/prof8b-$t.txt 2>&1
  echo "8b $t rc=$?: $(grep -E '^\| graph-' $OUT/prof8b-$t.txt | tail -1)"
done
for t in 1 5; do
  PYTHONPATH=$PWD/src timeout 80 python3 benchmarks/bench_kernels.py steps --model 1b --variants graph-draft --profile --profile-tokens $t > $OUT/prof1b-$t.txt 2>&1
  echo "1b $t rc=$?: $(grep -E '^\| graph-' $OUT/prof1b-$t.txt | tail -1)"
done
