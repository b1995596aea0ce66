#!/usr/bin/env bash
# Gemma-2-2B draft picks re-chosen inside its step now that its norms run the norm kernel;
# then a Gemma 2 9B + 2B k = 4 round with the package's picks (HEAD).
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 400 python3 benchmarks/bench_kernels.py step-table --models gemma-2 --table $OUT/table.json --out $OUT/step-table.json > $OUT/step-table.txt 2>&1
echo "== step-table rc=$? at $SECONDS s" | tee -a $LOG
grep -E "gemma-2:" $OUT/step-table.txt | tee -a $LOG
FP=/tmp/fp; P=$FP/gemma-2
PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/family_pairs.py --family gemma-2 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG; tail -3 /tmp/build.txt
left=$((590 - SECONDS))
PYTHONPATH=$PWD/src timeout $(( left < 150 ? left : 150 )) python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > $OUT/gemma-head.json 2> /tmp/b.err
echo "round rc=$? at $SECONDS" | tee -a $LOG; tail -3 /tmp/b.err | cut -c1-300 | tee -a $LOG
python3 benchmarks/bench_summary.py $OUT/gemma-head.json | tee -a $LOG
