#!/usr/bin/env bash
# call4.sh, run (next session): each stretch and copy of a split 8B step timed alone, with every
# Triton launch checked for tensors on another GPU, the profiler's kernel table; then the GPU tests
# of the final tree (tests/test_stages.py, tests/test_gpu.py).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
nvidia-smi topo -m | head -4 | tee -a $LOG
FP=/tmp/fp; P=$FP/llama-3.1
timeout 90 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
timeout 150 python3 benchmarks/results/two-gpus/parts.py $P/target $OUT/kernels.txt 2>&1 | grep -v "Loading weights" | tail -12 | cut -c1-2500 | tee -a $LOG
echo "== parts at $SECONDS s" | tee -a $LOG
timeout $((560 - SECONDS)) python3 -m pytest -q -rfEx -p no:cacheprovider tests/test_stages.py tests/test_gpu.py > $OUT/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR|XPASS)|^E  " $OUT/tests.txt | head -20 | cut -c1-300 | tee -a $LOG
