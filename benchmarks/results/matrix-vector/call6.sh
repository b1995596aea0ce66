#!/usr/bin/env bash
# GPU test_linear (which test failed in the last two calls); the linear table tuned for the shapes
# the package lists without a draft pick; the Qwen3 8B + 0.6B pair's k = 4 rounds with the package
# table against the tuned one over it (alternating).
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_linear.py -k "not runner_with_kernel" > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  |^tests/.*(Error|assert)" /tmp/tests.txt | head -30 | cut -c1-300 | tee -a $LOG
cp /tmp/tests.txt $OUT/
PYTHONPATH=$PWD/src timeout 260 python3 benchmarks/bench_kernels.py table --undrafted --table "$OUT/linear.json" --out $OUT/table.json > "$OUT/table.txt" 2>&1
echo "== table rc=$? at $SECONDS s" | tee -a $LOG
tail -30 $OUT/table.txt | cut -c1-250 | tee -a $LOG
FP=/tmp/fp; P=$FP/qwen3
PYTHONPATH=$PWD/src timeout 120 python3 benchmarks/family_pairs.py --family qwen3 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG; tail -3 /tmp/build.txt
T=~/.cache/specgen/kernels
for r in 1 2; do for tree in package tuned; do
  left=$((590 - SECONDS)); [ $left -lt 35 ] && { echo "no time for $tree$r" | tee -a $LOG; continue; }
  rm -rf $T; [ $tree = tuned ] && mkdir -p $T && cp $OUT/linear.json $T/linear.json
  PYTHONPATH=$PWD/src timeout $(( left < 100 ? left : 100 )) python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > /tmp/$tree$r.json 2> /tmp/$tree$r.err
  echo "$tree$r rc=$? at $SECONDS" | tee -a $LOG; tail -2 /tmp/$tree$r.err | cut -c1-200
done; done
python3 benchmarks/bench_summary.py $(ls /tmp/package*.json /tmp/tuned*.json 2>/dev/null) | tee -a $LOG
