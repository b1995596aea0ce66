#!/usr/bin/env bash
# Call 3 measured a split 8B step 2.7 ms slower than on one GPU: each stretch and copy timed alone.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
FP=/tmp/fp; P=$FP/llama-3.1
timeout 60 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
timeout 90 python3 benchmarks/results/two-gpus/parts.py $P/target 2>&1 | grep -v "Loading weights" | tail -8 | cut -c1-1500 | tee -a $LOG
echo "== parts at $SECONDS s" | tee -a $LOG
