#!/usr/bin/env bash
# bf16 greedy identity end to end through specgen bench: Llama 3.1 8B + 3.2 1B (random weights) and
# a quickly trained bench-shaped pair. Logs to $OUT.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"
summ() { python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("  resolved dtype/kernels:", {r: k.get("linear") for r, k in d["environment"]["resolved"].get("kernels", {}).items()})
for b in d["baselines"]:
    print(f"  {b['method']} t={b['temperature']}: {b['tokens_per_second']['median']:.1f} tok/s")
for r in d["results"]:
    g = (r.get("greedy_agreement") or {}).get("target-only", {})
    print(f"  {r['proposer']} k={r['k']}: {r['tokens_per_second']['median']:.1f} tok/s, mal {r['mean_accepted_length']:.2f}, greedy agreement {json.dumps(g)[:200]}")
PY
}
timeout 80 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out /tmp/fp --device cuda --prompts 4 > "$OUT/build.log" 2>&1
echo "llama build rc=$?"
timeout 120 python3 -m specgen.cli.main bench -p /tmp/fp/llama-3.1/pair.toml --k 4 -t 0 --num-prompts 4 -n 64 \
  --baseline target-only --no-fp32-check --format json > "$OUT/llama.json" 2> "$OUT/llama.err"
echo "llama bench rc=$?"; summ "$OUT/llama.json"
rm -rf /tmp/fp
timeout 150 python3 benchmarks/make_pair.py --preset bench --seed 0 --out /tmp/bp --minutes 0.5 2>&1 | tail -1
grep -n "dtype" /tmp/bp/pair.toml
timeout 90 python3 -m specgen.cli.main bench -p /tmp/bp/pair.toml --k 4,5 -t 0 --num-prompts 10 -n 128 \
  --baseline target-only --no-fp32-check --format json > "$OUT/benchpair.json" 2> "$OUT/benchpair.err"
echo "bench pair rc=$?"; summ "$OUT/benchpair.json"
