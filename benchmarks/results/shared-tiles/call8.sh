#!/bin/bash
# Split kernel: tokens share a tile. GPU tests (exactness), then steps HEAD vs new alternating.
cd "$(dirname "$0")/.."
NEW=$PWD; OLD=$PWD/.gpu/old
PYTHONPATH=$NEW/src timeout 220 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_attention.py tests/test_exact.py > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $OUT/steps.txt
grep -E "^(FAILED|ERROR)|^E  " /tmp/tests.txt | head -20 | cut -c1-300 | tee -a $OUT/steps.txt
step() { # tag dir model variant
  (cd $2 && PYTHONPATH=$2/src timeout 100 python3 benchmarks/bench_kernels.py steps --model $3 --variants $4) > /tmp/$1.txt 2>&1
  echo "$1: $(grep -E "^\| graph-" /tmp/$1.txt | tail -1) $(grep -i mismatch /tmp/$1.txt | tail -1 | cut -c1-200)" | tee -a $OUT/steps.txt
}
for i in 1 2; do
  for t in head:$OLD new:$NEW; do
    step 8b-${t%%:*}$i ${t#*:} 8b graph-dependent
    step 1b-${t%%:*}$i ${t#*:} 1b graph-draft
  done
done
echo "done at $SECONDS s" | tee -a $OUT/steps.txt
