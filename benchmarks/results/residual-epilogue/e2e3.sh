#!/usr/bin/env bash
# Issue 22 after the step inputs and the tuned package table: steps per shape, then the bench pair
# with and without compile (draft model). Logs to $OUT; few files (the device returns 8 at most).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/steps.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
for m in ${MODELS:-bench-draft bench-target 1b 8b}; do
  timeout 150 python3 benchmarks/bench_kernels.py steps --model "$m" --variants graph-norm --profile --out /tmp/steps-$m.json > /tmp/steps-$m.txt 2>&1
  echo "== $m rc=$?" | tee -a "$LOG"; grep -E "^\| graph|floor " /tmp/steps-$m.txt | tee -a "$LOG"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(' kernels/step', r.get('kernels_per_step'), 'kernel ms', round(r.get('kernel_ms_per_step',0),3), 'gaps ms', r.get('gap_ms_last_step'))" /tmp/steps-$m.json | tee -a "$LOG"
done
python3 - /tmp/steps-*.json > "$OUT/steps.json" <<'PY'
import json, sys
print(json.dumps({p: json.load(open(p)) for p in sys.argv[1:]}, indent=1))
PY
[ -n "${NO_E2E:-}" ] && exit 0
P=.pairs/bench
s=$SECONDS
[ -f $P/pair.toml ] || timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes 2.5 > /tmp/pair.txt 2>&1
echo "make_pair $((SECONDS - s)) s"; cp $P/report.json "$OUT/pair_report.json" 2>/dev/null
B="python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k ${KS:-4,6} -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 --baseline target-only --no-fp32-check --format json"
timeout 120 $B > "$OUT/bench_nocompile.json" 2> /tmp/nc.err; echo "nocompile rc=$?"; tail -3 /tmp/nc.err
timeout 300 $B --compile > "$OUT/bench_compile.json" 2> /tmp/c.err; echo "compile rc=$?"; tail -3 /tmp/c.err
OUT="$OUT" python3 - <<'PY'
import json, os
for name in ("bench_nocompile", "bench_compile"):
    try:
        data = json.load(open(f"{os.environ['OUT']}/{name}.json"))
    except Exception as exc:
        print(name, "unreadable", exc); continue
    print("==", name, data["environment"]["resolved"].get("fallbacks"), "startup", data.get("startup_seconds"))
    for b in data["baselines"]:
        print(" target-only", b["temperature"], "tok/s %.0f" % b["tokens_per_second"]["median"])
    for r in data["results"]:
        med = lambda key: (r.get(key) or {}).get("median")
        print(r["proposer"], r["k"], r["temperature"], "tok/s %.0f decode %.0f mal %.2f x %.2f identical %s" % (
            med("tokens_per_second"), med("decode_tokens_per_second"), r["mean_accepted_length"],
            r["speedup"]["target-only"]["median"], ((r.get("greedy_agreement") or {}).get("target-only") or {}).get("identical_fraction")),
            {k: round(v, 3) for k, v in r["round_ms"].items()})
PY
