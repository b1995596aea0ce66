#!/usr/bin/env bash
# EAGLE-3 head's one-row calls on draft picks: tune the heads' undrafted shapes, merge their draft
# picks into the package table, then Llama 3.1 8B + head k = 4 rounds, HEAD (old) against the change
# (new), alternating.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
FP=/tmp/fp; PAIR=$FP/llama-3.1
PYTHONPATH=$PWD/src timeout 240 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 --head > /tmp/build.log 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
PYTHONPATH=$PWD/src timeout 200 python3 benchmarks/bench_kernels.py table --models llama-3.1-head,qwen2.5-head,qwen3-head --undrafted --table $OUT/heads.json --out $OUT/heads-report.json > $OUT/table.txt 2>&1
echo "== table rc=$? at $SECONDS s" | tee -a $LOG; tail -12 $OUT/table.txt | tee -a $LOG
python3 .gpu/merge_drafts.py $OUT/heads.json src/specgen/gpu/linear_configs.json | tee -a $LOG
cp src/specgen/gpu/linear_configs.json $OUT/
for ver in old new old new; do
  left=$((590 - SECONDS)); [ $left -lt 60 ] && { echo "no time for $ver" | tee -a $LOG; break; }
  src=$PWD/src; [ $ver = old ] && src=$PWD/.gpu/old/src
  PYTHONPATH=$src timeout $(( left < 120 ? left : 120 )) python3 -m specgen.cli.main bench -p $PAIR/pair.toml --proposer eagle --k 4 -t 0 --num-prompts 2 -n 64 \
    --baseline "" --no-fp32-check --format json > $OUT/head-$ver-$SECONDS.json 2> /tmp/$ver.err
  echo "== $ver rc=$? at $SECONDS s" | tee -a $LOG; tail -2 /tmp/$ver.err | cut -c1-200
done
python3 - $OUT/head-*.json <<'PY' | tee -a $LOG
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    for r in d["results"]:
        print(path.split("/")[-1], r["proposer"], r["k"], "tok/s %.1f" % r["tokens_per_second"]["median"],
              {k: round(v, 3) for k, v in r["round_ms"].items()})
PY
left=$((590 - SECONDS)); [ $left -gt 40 ] && PYTHONPATH=$PWD/src timeout $left python3 -m pytest -q -p no:cacheprovider tests/test_rewire_head.py 2>&1 | tail -2 | tee -a $LOG
