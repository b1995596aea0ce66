#!/usr/bin/env bash
# Issue 22: GPU tests (Gemma 2's eager attention, step_io, compiled layers), then the bench pair
# with [kernels] step_io = "torch" and with the default (the kernel), in one call.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
s=$SECONDS
timeout ${TT:-240} python3 -m pytest -q -p no:cacheprovider $TESTS > "$OUT/tests.txt" 2>&1
echo "== tests rc=$? $((SECONDS - s)) s" | tee -a "$LOG"; grep -E "^FAILED|passed|failed" "$OUT/tests.txt" | tail -5 | tee -a "$LOG"
P=$PWD/.pairs/bench
s=$SECONDS
timeout 200 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes ${MIN:-1} > /tmp/pair.txt 2>&1
echo "== make_pair rc=$? $((SECONDS - s)) s" | tee -a "$LOG"
python3 - $P/pair.toml $P/torch-io.toml <<'PY'
import sys
text = open(sys.argv[1]).read()
line = 'step_io = "torch"\n'
text = text.replace("[kernels]\n", "[kernels]\n" + line) if "[kernels]\n" in text else text + "\n[kernels]\n" + line
open(sys.argv[2], "w").write(text)
PY
for run in torch-io pair torch-io pair; do
  left=$((595 - SECONDS)); [ $left -lt 30 ] && { echo "no time for $run" | tee -a "$LOG"; break; }
  timeout $left python3 -m specgen.cli.main bench -p $P/$run.toml --proposer draft --k 4 -t 0,0.8 --top-p 0.95 \
    --num-prompts 10 -n 128 --baseline target-only --no-fp32-check --format json > /tmp/b.json 2> /tmp/b.err
  echo "== $run rc=$?" | tee -a "$LOG"
  python3 - /tmp/b.json <<'PY' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
print(" step_io", d["environment"]["resolved"]["kernels"]["target"]["step_io"], "fallbacks", d["environment"]["resolved"].get("fallbacks"))
for b in d["baselines"]:
    print(" target-only", b["temperature"], "tok/s %.0f" % b["tokens_per_second"]["median"])
for r in d["results"]:
    med = lambda key: (r.get(key) or {}).get("median")
    print("", r["k"], r["temperature"], r.get("coupling"), "tok/s %.0f mal %.2f identical %s" % (med("tokens_per_second"),
          r["mean_accepted_length"], ((r.get("greedy_agreement") or {}).get("target-only") or {}).get("identical_fraction")),
          {k: round(v, 3) for k, v in r["round_ms"].items()})
PY
done
