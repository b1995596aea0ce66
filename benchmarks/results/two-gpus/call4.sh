#!/usr/bin/env bash
# Call 3 measured a split 8B step 2.7 ms slower than on one GPU: the GPU tests of the final tree
# (tests/test_stages.py, tests/test_gpu.py), then each stretch and copy timed alone and the
# profiler's kernel table. Not run yet (written when the session's device time was spent).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
timeout 200 python3 -m pytest -q -rfEx -p no:cacheprovider tests/test_stages.py tests/test_gpu.py > $OUT/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR|XPASS)|^E  " $OUT/tests.txt | head -20 | cut -c1-300 | tee -a $LOG
FP=/tmp/fp; P=$FP/llama-3.1
timeout 60 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
timeout 120 python3 benchmarks/results/two-gpus/parts.py $P/target $OUT/kernels.txt 2>&1 | grep -v "Loading weights" | tail -8 | cut -c1-1500 | tee -a $LOG
echo "== parts at $SECONDS s" | tee -a $LOG
