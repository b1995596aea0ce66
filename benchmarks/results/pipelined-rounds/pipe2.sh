#!/usr/bin/env bash
# GPU tests of the pipelined loop, then the Llama 3.1 8B / 3.2 1B random-weight pair: rounds with
# pipeline off and on (auto), alternating.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
TESTS=${TESTS:-tests/test_decode.py tests/test_gpu.py tests/test_round.py tests/test_adaptive.py tests/test_hybrid.py}
PYTHONPATH=$PWD/src timeout ${TEST_BUDGET:-220} python3 -m pytest -q -rfE -p no:cacheprovider $TESTS > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a "$LOG"
grep -E "^(FAILED|ERROR)|^E  " /tmp/tests.txt | head -40 | cut -c1-300 | tee -a "$LOG"
FP=/tmp/fp; P=$FP/llama-3.1
PYTHONPATH=$PWD/src timeout 200 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"
sed 's/^\[speculation\]$/[speculation]\npipeline = "off"/' $P/pair.toml > $P/off.toml
grep -q 'pipeline = "off"' $P/off.toml || printf '\n[speculation]\npipeline = "off"\n' >> $P/off.toml
B="python3 -m specgen.cli.main bench --proposer draft --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json"
for r in 1 2; do for v in off on; do
  left=$((590 - SECONDS)); [ $left -lt 40 ] && { echo "no time for $v$r" | tee -a "$LOG"; continue; }
  prof=$P/pair.toml; [ $v = off ] && prof=$P/off.toml
  PYTHONPATH=$PWD/src timeout $(( left < 150 ? left : 150 )) $B -p $prof > /tmp/$v$r.json 2> /tmp/$v$r.err
  echo "$v$r rc=$? at $SECONDS" | tee -a "$LOG"; cp /tmp/$v$r.json $OUT/ 2>/dev/null
done; done
python3 benchmarks/bench_summary.py $(ls /tmp/off*.json /tmp/on*.json 2>/dev/null) | tee -a "$LOG"
