#!/usr/bin/env bash
# Issue 22: the MLP's residual add in the down projection (c7cc20a, attention merge reverted):
# steps before (.gpu/before = 3fc66eb) and now in one call, then the k = 4 round on the
# Llama 3.1 8B + 3.2 1B random-weight pair.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
steps() {  # label dir model [extra]
  local label=$1 dir=$2 m=$3; shift 3
  (cd "$dir" && PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/bench_kernels.py steps --model "$m" --variants graph-norm "$@" \
     --out /tmp/$label-$m.json > /tmp/$label-$m.txt 2>&1)
  echo "== $label $m rc=$?" | tee -a "$LOG"; grep -E "^\| graph" /tmp/$label-$m.txt | cut -c1-160 | tee -a "$LOG"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(' kernels/step', r.get('kernels_per_step'), 'kernel ms', round(r.get('kernel_ms_per_step',0),3), 'gaps ms', r.get('gap_ms_last_step'))" /tmp/$label-$m.json 2>&1 | tail -1 | tee -a "$LOG"
}
for m in ${MODELS:-bench-draft 1b 8b}; do
  for r in 1 2; do steps before .gpu/before $m --profile; steps now . $m --profile; done
done
export PYTHONPATH=$PWD/src
FP=/tmp/fp; PAIR=$FP/llama-3.1
timeout 200 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"; tail -2 /tmp/build.log | tee -a "$LOG"
for dir in .gpu/before .; do
  (cd $dir && PYTHONPATH=$PWD/src timeout 120 python3 -m specgen.cli.main bench -p $PAIR/pair.toml --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only \
    --no-fp32-check --format json > /tmp/bench.json 2> /tmp/b.err)
  echo "== bench $dir rc=$? at $SECONDS s" | tee -a "$LOG"; tail -2 /tmp/b.err | tee -a "$LOG"
  python3 - /tmp/bench.json <<'PY' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
for b in d["baselines"]:
    print(" target-only tok/s %.1f decode %.1f" % (b["tokens_per_second"]["median"], b["decode_tokens_per_second"]["median"]))
for r in d["results"]:
    print(r["proposer"], r["k"], "tok/s %.1f" % r["tokens_per_second"]["median"],
          {k: round(v, 3) for k, v in r["round_ms"].items()}, (r.get("greedy_agreement") or {}).get("target-only", {}).get("identical_fraction"))
PY
done
