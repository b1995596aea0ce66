#!/usr/bin/env bash
# The draft pick's argmax kernel: its tests on the GPU, then the k = 4 rounds before (torch.argmax)
# and after on Llama 3.1 8B with the 3.2 1B draft and with the EAGLE-3 head, alternating.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
rm -rf /tmp/before && cp -r src /tmp/before && cp .gpu/round_before.py /tmp/before/specgen/core/round.py
PYTHONPATH=$PWD/src timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_warp_kernel.py -k argmax tests/test_round.py 2>&1 | tail -2 | tee -a "$LOG"
FP=/tmp/fp; PAIR=$FP/llama-3.1
PYTHONPATH=$PWD/src timeout 240 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 --head > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"
for ver in before after before after; do
  src=$PWD/src; [ $ver = before ] && src=/tmp/before
  PYTHONPATH=$src timeout 150 python3 -m specgen.cli.main bench -p $PAIR/pair.toml --proposer draft,eagle --k 4 -t 0 --num-prompts 2 -n 64 \
    --baseline target-only --no-fp32-check --format json > "$OUT/bench-$ver.json" 2> /tmp/b.err
  echo "== $ver rc=$? at $SECONDS s" | tee -a "$LOG"
  python3 - "$OUT/bench-$ver.json" <<'PY' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print(r["proposer"], r["k"], "tok/s %.1f" % r["tokens_per_second"]["median"], {k: round(v, 3) for k, v in r["round_ms"].items()},
          (r.get("greedy_agreement") or {}).get("target-only", {}).get("identical_fraction"))
PY
done
