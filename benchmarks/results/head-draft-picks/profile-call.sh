#!/usr/bin/env bash
# Llama 3.1 8B: k = 4 rounds with the 3.2 1B draft and with an EAGLE-3 head (HEAD), then the
# head round's kernel sequence.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
FP=/tmp/fp; PAIR=$FP/llama-3.1
timeout 240 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 --head > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG; tail -3 /tmp/build.log
timeout 200 python3 -m specgen.cli.main bench -p $PAIR/pair.toml --proposer draft,eagle --k 4 -t 0 --num-prompts 2 -n 64 \
  --baseline target-only --no-fp32-check --format json > $OUT/rounds.json 2> /tmp/rounds.err
echo "== rounds rc=$? at $SECONDS s" | tee -a $LOG; tail -3 /tmp/rounds.err | cut -c1-300
python3 benchmarks/bench_summary.py $OUT/rounds.json 2>&1 | tee -a $LOG
timeout 200 python3 .gpu/head_prof.py $PAIR/pair.toml $OUT > $OUT/prof.log 2>&1
echo "== prof rc=$? at $SECONDS s" | tee -a $LOG; tail -5 $OUT/prof.log | cut -c1-300
