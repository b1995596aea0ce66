#!/usr/bin/env bash
# The round's bookkeeping in two kernels (gpu/commit.py): GPU tests, then the bench pair (trained
# here briefly) and Llama 3.1 8B + 3.2 1B rounds, HEAD (old) against the change (new), alternating.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_commit.py tests/test_gpu.py > $OUT/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a $LOG
PYTHONPATH=$PWD/src timeout 120 python3 benchmarks/make_pair.py --preset bench --seed 0 --out /tmp/bench --minutes 1 --device cuda > /tmp/pair.log 2>&1
echo "== pair rc=$? at $SECONDS s" | tee -a $LOG; tail -2 /tmp/pair.log | cut -c1-200
for ver in old new old new; do
  left=$((560 - SECONDS)); [ $left -lt 50 ] && { echo "no time for $ver" | tee -a $LOG; break; }
  src=$PWD/src; [ $ver = old ] && src=$PWD/.gpu/old/src
  PYTHONPATH=$src timeout $(( left < 90 ? left : 90 )) python3 -m specgen.cli.main bench -p /tmp/bench/pair.toml --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 \
    --baseline "" --format json > $OUT/bench-$ver-$SECONDS.json 2> /tmp/$ver.err
  echo "== bench $ver rc=$? at $SECONDS s" | tee -a $LOG; tail -1 /tmp/$ver.err | cut -c1-200
done
python3 - $OUT/bench-*.json <<'PY' | tee -a $LOG
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    for r in d["results"]:
        print(path.split("/")[-1], r["proposer"], r["k"], r["temperature"], "tok/s %.1f" % r["tokens_per_second"]["median"],
              "decode %.1f" % (r.get("decode_tokens_per_second") or {}).get("median", 0), {k: round(v, 4) for k, v in r["round_ms"].items()})
PY
FP=/tmp/fp; PAIR=$FP/llama-3.1
left=$((560 - SECONDS))
if [ $left -gt 200 ]; then
  PYTHONPATH=$PWD/src timeout 100 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.log 2>&1
  for ver in old new; do
    left=$((585 - SECONDS)); [ $left -lt 50 ] && break
    src=$PWD/src; [ $ver = old ] && src=$PWD/.gpu/old/src
    PYTHONPATH=$src timeout $(( left < 80 ? left : 80 )) python3 -m specgen.cli.main bench -p $PAIR/pair.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 \
      --baseline "" --no-fp32-check --format json > $OUT/llama-$ver.json 2> /tmp/l$ver.err
    echo "== llama $ver rc=$? at $SECONDS s" | tee -a $LOG
    python3 -c "import json,sys; d=json.load(open('$OUT/llama-$ver.json')); [print('$ver', r['proposer'], {k: round(v, 4) for k, v in r['round_ms'].items()}) for r in d['results']]" | tee -a $LOG
  done
fi
