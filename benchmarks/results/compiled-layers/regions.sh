#!/usr/bin/env bash
# Issue 22: compile per decoder layer (gpu/compiled.py) against compile of whole steps (.gpu/old =
# affafce): GPU tests, then starts of `specgen generate` on the Llama 3.1 8B + 3.2 1B random-weight
# pair: one without compile, then each version cold (its own empty cache) and cached.
# .gpu/old: `mkdir -p .gpu/old && git archive affafce src benchmarks | tar -x -C .gpu/old`.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
if [ -n "${TESTS:-}" ]; then
  s=$SECONDS
  PYTHONPATH=$PWD/src timeout ${TT:-300} python3 -m pytest -q -p no:cacheprovider -x $TESTS > "$OUT/tests.txt" 2>&1
  echo "== tests rc=$? $((SECONDS - s)) s" | tee -a "$LOG"; tail -3 "$OUT/tests.txt" | tee -a "$LOG"
fi
[ -n "${RUNS:-}" ] || exit 0
FP=/tmp/fp; PAIR=$FP/llama-3.1
PYTHONPATH=$PWD/src timeout 220 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"; tail -1 /tmp/build.log | tee -a "$LOG"
PROMPT="def quicksort(items): the quick brown fox jumps over the lazy dog"
for run in $RUNS; do  # plain | new-1 | new-2 | old-1 | old-2
  left=$((590 - SECONDS)); [ $left -lt 40 ] && { echo "no time for $run" | tee -a "$LOG"; break; }
  ver=${run%-*}; dir=.; flag=--compile
  [ $ver = old ] && dir=.gpu/old; [ $run = plain ] && flag=--no-compile
  s=$SECONDS
  (cd $dir && XDG_CACHE_HOME=/tmp/xdg-$ver TORCH_LOGS=recompiles PYTHONPATH=$PWD/src timeout $left python3 -m specgen.cli.main generate \
     -p $PAIR/pair.toml $flag -n 64 --ignore-eos --format json -v "$PROMPT" > /tmp/c$run.json 2> /tmp/c$run.err)
  echo "== $run ($flag) rc=$? wall $((SECONDS - s)) s; dynamo recompiles: $(grep -c 'Recompiling function' /tmp/c$run.err)" | tee -a "$LOG"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=r['startup']; print(' load', round(s['load_seconds'],1), 'setup', round(s['setup_seconds'],1), 'wall', round(r['wall_seconds'],1), 'decode tok/s', round(r['stats']['decode_tokens_per_second'],1), 'fallbacks', r.get('environment', {}).get('resolved', {}).get('fallbacks'))" /tmp/c$run.json 2>&1 | tail -1 | tee -a "$LOG"
  grep -iE "fallback|error|warn" /tmp/c$run.err | grep -v Recompil | head -3 | cut -c1-200 | tee -a "$LOG"
done
cp /tmp/c*.err "$OUT/" 2>/dev/null; ls "$OUT" | head -3 >/dev/null
