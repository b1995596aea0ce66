#!/usr/bin/env bash
# The k-token round of a random EAGLE-3 head of the published shape on Llama 3.1 8B, beside the
# 3.2 1B draft model and target-only, in one bench (H200).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
FP=/tmp/fp; PAIR=$FP/llama-3.1
timeout 240 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 --head > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"; tail -2 /tmp/build.log | tee -a "$LOG"; du -sh $PAIR/* | tee -a "$LOG"
cp $PAIR/head/config.json "$OUT/head-config.json"
timeout 300 python3 -m specgen.cli.main bench -p $PAIR/pair.toml --proposer draft,eagle --k 4,7 -t 0 --num-prompts 2 -n 64 \
  --baseline target-only --no-fp32-check --format json > "$OUT/bench-head.json" 2> /tmp/b.err
echo "== bench rc=$? at $SECONDS s" | tee -a "$LOG"; tail -3 /tmp/b.err | tee -a "$LOG"
python3 - "$OUT/bench-head.json" <<'PY' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
print("startup", d.get("startup_seconds"), d["environment"]["resolved"].get("fallbacks"))
for b in d["baselines"]:
    print(" target-only tok/s %.1f decode %.1f" % (b["tokens_per_second"]["median"], b["decode_tokens_per_second"]["median"]))
for r in d["results"]:
    print(r["proposer"], r["k"], "tok/s %.1f mal %.2f" % (r["tokens_per_second"]["median"], r["mean_accepted_length"]),
          {k: round(v, 3) for k, v in r["round_ms"].items()}, (r.get("greedy_agreement") or {}).get("target-only", {}).get("identical_fraction"))
PY
