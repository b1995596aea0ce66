#!/usr/bin/env bash
# Issue 22: the 8B step with the tuned table; the k = 4 round on the Llama 3.1 8B + 3.2 1B pair
# (random weights); then, with time left, two compiled starts over the default cache folder.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
timeout 200 python3 benchmarks/bench_kernels.py steps --model 8b --variants graph-norm --out "$OUT/steps-8b.json" > /tmp/s8.txt 2>&1
echo "== steps 8b rc=$? at $SECONDS s" | tee -a "$LOG"; grep -E "^\| graph|floor " /tmp/s8.txt | tee -a "$LOG"
FP=/tmp/fp; PAIR=$FP/llama-3.1
timeout 200 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"; tail -2 /tmp/build.log | tee -a "$LOG"
timeout 150 python3 -m specgen.cli.main bench -p $PAIR/pair.toml --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only \
  --no-fp32-check --format json > "$OUT/bench-8b1b.json" 2> /tmp/b.err
echo "== bench rc=$? at $SECONDS s" | tee -a "$LOG"; tail -3 /tmp/b.err | tee -a "$LOG"
python3 - "$OUT/bench-8b1b.json" <<'PY' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
print("startup", d.get("startup_seconds"), d["environment"]["resolved"].get("fallbacks"))
for b in d["baselines"]:
    print(" target-only tok/s %.1f decode %.1f" % (b["tokens_per_second"]["median"], b["decode_tokens_per_second"]["median"]))
for r in d["results"]:
    print(r["proposer"], r["k"], "tok/s %.1f mal %.2f" % (r["tokens_per_second"]["median"], r["mean_accepted_length"]),
          {k: round(v, 3) for k, v in r["round_ms"].items()}, (r.get("greedy_agreement") or {}).get("target-only", {}).get("identical_fraction"))
PY
PROMPT="def quicksort(items): the quick brown fox jumps over the lazy dog"
for run in 1 2; do
  left=$((570 - SECONDS)); [ $left -lt 60 ] && { echo "no time for compiled start $run" | tee -a "$LOG"; break; }
  s=$SECONDS
  timeout $left python3 -m specgen.cli.main generate -p $PAIR/pair.toml --compile -n 32 --ignore-eos --format json -v "$PROMPT" > /tmp/c$run.json 2> /tmp/c$run.err
  echo "== compiled start $run rc=$? wall $((SECONDS - s)) s" | tee -a "$LOG"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=r['startup']; print(' load', s['load_seconds'], 'setup', s['setup_seconds'], 'wall', r['wall_seconds'], 'decode', r['stats']['decode_tokens_per_second'])" /tmp/c$run.json 2>&1 | tail -1 | tee -a "$LOG"
  grep -iE "fallback|error" /tmp/c$run.err | head -3 | cut -c1-200 | tee -a "$LOG"
done
