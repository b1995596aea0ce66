#!/usr/bin/env bash
# Call 5 stopped at two bugs: parts.py timed copies of inference tensors outside inference mode, and
# tests/test_gpu.py, run after test_stages.py, failed three tests and crashed (illegal address).
# Fixed: "cuda" resolves to the current GPU by index; tests restore the current GPU. Again, tests
# one by one (-v: a crash names its test), then parts.py.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
timeout 330 python3 -m pytest -v -rfEx -p no:cacheprovider tests/test_stages.py tests/test_gpu.py > $OUT/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt | cut -c1-200)" | tee -a $LOG
grep -E "(FAILED|ERROR|XPASS)|^E  " $OUT/tests.txt | head -20 | cut -c1-300 | tee -a $LOG
grep -E "PASSED|FAILED|XFAIL|SKIPPED|ERROR" $OUT/tests.txt | tail -2 | cut -c1-200 | tee -a $LOG
FP=/tmp/fp; P=$FP/llama-3.1
timeout 90 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
timeout $((590 - SECONDS)) python3 benchmarks/results/two-gpus/parts.py $P/target $OUT/kernels.txt 2>&1 | grep -v "Loading weights" | tail -12 | cut -c1-2500 | tee -a $LOG
echo "== parts at $SECONDS s" | tee -a $LOG
