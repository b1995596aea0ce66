#!/usr/bin/env bash
# Start-up and decode of `specgen generate` on Llama 3.1 8B with the EAGLE-3 head against the 3.2 1B
# draft model (random weights), each started twice (the second from a warm page cache).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
FP=/tmp/fp; PAIR=$FP/llama-3.1
timeout 240 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 --head > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"
PROMPT="def quicksort(items): the quick brown fox jumps over the lazy dog"
for proposer in eagle draft eagle draft; do
  s=$SECONDS
  timeout 120 python3 -m specgen.cli.main generate -p $PAIR/pair.toml --proposer $proposer -n 64 --ignore-eos --format json -v "$PROMPT" > /tmp/g.json 2> /tmp/g.err
  echo "== $proposer rc=$? wall $((SECONDS - s)) s" | tee -a "$LOG"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=r['startup']; t=r['stats']; print(' load', s['load_seconds'], 'setup', s['setup_seconds'], 'wall', r['wall_seconds'], 'ttft', t['time_to_first_token_seconds'], 'decode', t['decode_tokens_per_second'])" /tmp/g.json 2>&1 | tail -1 | tee -a "$LOG"
  tail -1 /tmp/g.err | cut -c1-300 | tee -a "$LOG"
done
