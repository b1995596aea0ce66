#!/usr/bin/env bash
# The bench pair end to end (draft model, k = 4): without compile, dependent launch off then on
# (the default), then with compile (which takes it off).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
P=.pairs/bench; s=$SECONDS
[ -f $P/pair.toml ] || timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes 2.5 > /tmp/pair.txt 2>&1
echo "make_pair $((SECONDS - s)) s" | tee -a "$LOG"
python3 - $P <<'PY'
import sys, tomllib, pathlib
pair = pathlib.Path(sys.argv[1]); text = (pair / "pair.toml").read_text()
assert "kernels" not in tomllib.loads(text)
(pair / "pair-off.toml").write_text(text + '\n[kernels]\ndependent_launch = "off"\n')
PY
B="python3 -m specgen.cli.main bench --proposer draft --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 --baseline target-only --no-fp32-check --format json"
timeout 120 $B -p $P/pair-off.toml > "$OUT/bench_off.json" 2> /tmp/off.err; echo "off rc=$? at $SECONDS" | tee -a "$LOG"
timeout 120 $B -p $P/pair.toml > "$OUT/bench_on.json" 2> /tmp/on.err; echo "on rc=$? at $SECONDS" | tee -a "$LOG"
timeout 120 $B -p $P/pair-off.toml > "$OUT/bench_off2.json" 2> /tmp/off2.err; echo "off2 rc=$? at $SECONDS" | tee -a "$LOG"
timeout 120 $B -p $P/pair.toml > "$OUT/bench_on2.json" 2> /tmp/on2.err; echo "on2 rc=$? at $SECONDS" | tee -a "$LOG"
left=$((590 - SECONDS)); timeout $left $B -p $P/pair.toml --compile > "$OUT/bench_compile.json" 2> /tmp/c.err; echo "compile rc=$? at $SECONDS" | tee -a "$LOG"
OUT="$OUT" python3 - <<'PY' | tee -a "$LOG"
import json, os
for name in ("bench_off", "bench_on", "bench_off2", "bench_on2", "bench_compile"):
    try:
        data = json.load(open(f"{os.environ['OUT']}/{name}.json"))
    except Exception as exc:
        print(name, "unreadable", exc); continue
    kern = data["environment"]["resolved"]["kernels"]["target"].get("dependent_launch")
    print("==", name, "dependent", kern, "startup", data.get("startup_seconds"))
    for b in data["baselines"]:
        print(" target-only", b["temperature"], "tok/s %.0f" % b["tokens_per_second"]["median"])
    for r in data["results"]:
        med = lambda key: (r.get(key) or {}).get("median")
        print(r["proposer"], r["k"], r["temperature"], "tok/s %.0f mal %.2f x %.2f identical %s" % (
            med("tokens_per_second"), r["mean_accepted_length"],
            r["speedup"]["target-only"]["median"], ((r.get("greedy_agreement") or {}).get("target-only") or {}).get("identical_fraction")),
            {k: round(v, 3) for k, v in r["round_ms"].items()})
PY
