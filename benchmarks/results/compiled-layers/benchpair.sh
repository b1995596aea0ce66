#!/usr/bin/env bash
# Issue 22: the bench pair without compile, with compile of one layer (working tree) and with
# compile of whole steps (.gpu/old = affafce), in one call on the same freshly trained pair.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
P=$PWD/.pairs/bench
s=$SECONDS
PYTHONPATH=$PWD/src timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes 2.5 > /tmp/pair.txt 2>&1
echo "== make_pair rc=$? $((SECONDS - s)) s" | tee -a "$LOG"; cp $P/report.json "$OUT/pair_report.json" 2>/dev/null
B="python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k ${KS:-4} -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 --baseline target-only --no-fp32-check --format json"
for run in ${RUNS:-nocompile layer whole}; do
  dir=.; flag=--no-compile; [ $run = whole ] && dir=.gpu/old; [ $run != nocompile ] && flag=--compile
  left=$((595 - SECONDS)); [ $left -lt 30 ] && { echo "no time for $run" | tee -a "$LOG"; break; }
  s=$SECONDS
  (cd $dir && XDG_CACHE_HOME=/tmp/xdg-$run PYTHONPATH=$PWD/src timeout $left $B $flag > "$OUT/bench_$run.json" 2> /tmp/$run.err)
  echo "== $run rc=$? $((SECONDS - s)) s" | tee -a "$LOG"; tail -2 /tmp/$run.err | cut -c1-200 | tee -a "$LOG"
done
OUT="$OUT" python3 - <<'PY' | tee -a "$LOG"
import json, os
for name in ("nocompile", "layer", "whole"):
    try:
        data = json.load(open(f"{os.environ['OUT']}/bench_{name}.json"))
    except Exception as exc:
        print(name, "unreadable", exc); continue
    print("==", name, data["environment"]["resolved"].get("fallbacks"), "startup", data.get("startup_seconds"))
    for b in data["baselines"]:
        print(" target-only", b["temperature"], "tok/s %.0f" % b["tokens_per_second"]["median"])
    for r in data["results"]:
        med = lambda key: (r.get(key) or {}).get("median")
        print(r["proposer"], r["k"], r["temperature"], r.get("coupling"), "tok/s %.0f mal %.2f x %.2f identical %s" % (
            med("tokens_per_second"), r["mean_accepted_length"],
            r["speedup"]["target-only"]["median"], ((r.get("greedy_agreement") or {}).get("target-only") or {}).get("identical_fraction")),
            {k: round(v, 3) for k, v in r["round_ms"].items()})
PY
