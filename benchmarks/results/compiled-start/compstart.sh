#!/usr/bin/env bash
# Issue 22: starts of `specgen generate` on the Llama 3.1 8B + 3.2 1B random-weight pair with
# compile, prefill chunks uncompiled: cold cache, then cached; one start without compile.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
FP=/tmp/fp; PAIR=$FP/llama-3.1
timeout 220 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"; tail -1 /tmp/build.log | tee -a "$LOG"
PROMPT="def quicksort(items): the quick brown fox jumps over the lazy dog"
for run in plain 1 2; do
  left=$((585 - SECONDS)); [ $left -lt 40 ] && { echo "no time for start $run" | tee -a "$LOG"; break; }
  flag=--compile; [ $run = plain ] && flag=--no-compile
  s=$SECONDS
  timeout $left python3 -m specgen.cli.main generate -p $PAIR/pair.toml $flag -n 32 --ignore-eos --format json -v "$PROMPT" > /tmp/c$run.json 2> /tmp/c$run.err
  echo "== start $run ($flag) rc=$? wall $((SECONDS - s)) s" | tee -a "$LOG"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=r['startup']; print(' load', s['load_seconds'], 'setup', s['setup_seconds'], 'wall', r['wall_seconds'], 'decode', r['stats']['decode_tokens_per_second'])" /tmp/c$run.json 2>&1 | tail -1 | tee -a "$LOG"
  grep -iE "fallback|error|warn" /tmp/c$run.err | head -3 | cut -c1-200 | tee -a "$LOG"
done
