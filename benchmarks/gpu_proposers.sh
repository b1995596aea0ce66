#!/usr/bin/env bash
# Proposers on the GPU (docs/benchmarks.md, "Proposers (GPU)"): the bench pair is trained first,
# then `specgen bench` compares the n-gram proposer, the draft with fixed k and the draft with
# adaptive k / draft_p_min against target-only, on a repetitive "copy" workload (each held-out
# prompt, a blank line, then its first third again) and on the plain prompts. Logs go to $OUT.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-.out}
PAIR=${PAIR:-.pairs/bench}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
[ -f "$PAIR/target/config.json" ] || timeout 330 python3 benchmarks/make_pair.py --preset bench --seed 0 \
  --out "$PAIR" --minutes "${MINUTES:-4.5}" 2>&1 | tail -4
python3 - "$PAIR" <<'PY'
import json, sys
pair = sys.argv[1]
texts = [json.loads(line)["prompt"] for line in open(f"{pair}/prompts.jsonl", encoding="utf-8")][:12]
with open(f"{pair}/copy.jsonl", "w", encoding="utf-8") as f:
    for t in texts:
        f.write(json.dumps({"prompt": t + "\n\n" + t[: len(t) // 3]}) + "\n")
PY
profile() {  # name, extra [proposer] lines
  printf '[target]\npath = "%s/target"\n[draft]\npath = "%s/draft"\n[proposer]\n%b\n' \
    "$PWD/$PAIR" "$PWD/$PAIR" "$2" > "$OUT/$1.toml"
}
profile ngram 'kind = "ngram"\nngram_min = 1\nngram_max = 4'
profile draft 'kind = "draft"'
profile adaptive 'kind = "draft"\nadaptive_k = true\ndraft_p_min = 0.4'
for run in ${RUNS:-copy:ngram copy:draft copy:adaptive plain:ngram}; do
  workload=${run%%:*}; p=${run##*:}
  prompts="$PAIR/$workload.jsonl"; [ "$workload" = plain ] && prompts="$PAIR/prompts.jsonl"
  {
    timeout 150 python3 -m specgen.cli.main bench -p "$OUT/$p.toml" --prompts "$prompts" --num-prompts "${NP:-12}" \
      -n "${N:-128}" --k 4,8 -t 0 --format json > "$OUT/${workload}_$p.json" 2> "$OUT/${workload}_$p.err"
    echo "$workload $p: exit $?"
    python3 - "$OUT/${workload}_$p.json" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as exc:
    print("  no JSON:", exc); sys.exit()
for r in doc["results"]:
    s = r["speedup"].get("target-only") or {}
    print(f"  k={r['k']}: {r['tokens_per_second']['median']:.0f} tok/s, x{s.get('median', float('nan')):.2f} target-only,"
          f" acceptance {r['acceptance_rate']:.2f}, mean len {r['mean_accepted_length']:.2f}, mean k {r['counts']['mean_k']:.2f}")
PY
  }
done
