#!/usr/bin/env bash
# The bench pair end to end on HEAD: trained here as run F was (4.4 minutes), then specgen bench
# against target-only (10 prompts x 128 tokens), and the Hugging Face baselines on one prompt.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
timeout 330 python3 benchmarks/make_pair.py --preset bench --seed 0 --out /tmp/bench --minutes 4.4 --device cuda > $OUT/pair.txt 2>&1
echo "== pair rc=$? at $SECONDS s" | tee -a $LOG; tail -2 $OUT/pair.txt | cut -c1-200 | tee -a $LOG
left=$((585 - SECONDS))
timeout $(( left < 150 ? left : 150 )) python3 -m specgen.cli.main bench -p /tmp/bench/pair.toml --k 3,4 -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 \
  --baseline target-only --format json > $OUT/bench.json 2> $OUT/bench.err
echo "== bench rc=$? at $SECONDS s" | tee -a $LOG; tail -12 $OUT/bench.err | tee -a $LOG
left=$((585 - SECONDS))
[ $left -gt 40 ] && timeout $left python3 -m specgen.cli.main bench -p /tmp/bench/pair.toml --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 1 -n 128 \
  --baseline target-only,hf,hf-static,hf-assisted --no-fp32-check --format json > $OUT/bench-hf.json 2> $OUT/bench-hf.err
echo "== hf rc=$? at $SECONDS s" | tee -a $LOG; tail -12 $OUT/bench-hf.err | tee -a $LOG
