#!/usr/bin/env bash
# Dependent launch end to end: GPU tests, then k = 4 rounds on Llama 3.1 8B with the 3.2 1B draft
# and with an EAGLE-3 head, [kernels] dependent_launch = "off" against the default (on), alternating.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
timeout 150 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_dependent.py tests/test_gpu.py > "$OUT/tests.txt" 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a "$LOG"
FP=/tmp/fp; PAIR=$FP/llama-3.1
timeout 240 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 --head > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"
python3 - $PAIR <<'PY'
import sys, tomllib, pathlib
pair = pathlib.Path(sys.argv[1])
text = (pair / "pair.toml").read_text()
assert "kernels" not in tomllib.loads(text)
(pair / "pair-off.toml").write_text(text + '\n[kernels]\ndependent_launch = "off"\n')
PY
for ver in off on off on; do
  left=$((585 - SECONDS)); [ $left -lt 60 ] && { echo "no time for $ver" | tee -a "$LOG"; break; }
  prof=$PAIR/pair.toml; [ $ver = off ] && prof=$PAIR/pair-off.toml
  timeout $(( left < 150 ? left : 150 )) python3 -m specgen.cli.main bench -p $prof --proposer draft,eagle --k 4 -t 0 --num-prompts 2 -n 64 \
    --baseline target-only --no-fp32-check --format json > "$OUT/bench-$ver.json" 2> "$OUT/bench-$ver.err"
  echo "== $ver rc=$? at $SECONDS s" | tee -a "$LOG"
  python3 - "$OUT/bench-$ver.json" <<'PY' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print(r["proposer"], r["k"], "tok/s %.1f" % r["tokens_per_second"]["median"], {k: round(v, 3) for k, v in r["round_ms"].items()},
          (r.get("greedy_agreement") or {}).get("target-only", {}).get("identical_fraction"), r.get("kernels", {}).get("dependent_launch"))
b = d.get("baseline") or {}
print("baseline", {k: b.get(k) for k in ("tokens_per_second", "decode_ms_per_token")} if b else None)
PY
done
