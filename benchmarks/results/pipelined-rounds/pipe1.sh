#!/usr/bin/env bash
# Two rounds in flight (core/decode.py) and the round kernels dependent: GPU tests, then the bench
# pair end to end: .gpu/old_src (84924f5, before both), this tree with pipeline = "off", this tree
# (auto: on), alternating. Trains the pair first (about 195 s).
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
TESTS=${TESTS:-tests/test_decode.py tests/test_round.py tests/test_gpu.py tests/test_adaptive.py}
if [ -n "$TESTS" ]; then
  PYTHONPATH=$PWD/src timeout ${TEST_BUDGET:-200} python3 -m pytest -q -rfEs -p no:cacheprovider $TESTS > "$OUT/tests.txt" 2>&1
  echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a "$LOG"
fi
P=.pairs/bench; s=$SECONDS
[ -f $P/pair.toml ] || PYTHONPATH=$PWD/src timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes 2.5 > "$OUT/pair.txt" 2>&1
echo "make_pair $((SECONDS - s)) s" | tee -a "$LOG"
sed 's/^\[speculation\]$/[speculation]\npipeline = "off"/' $P/pair.toml > $P/off.toml
grep -q 'pipeline = "off"' $P/off.toml || printf '\n[speculation]\npipeline = "off"\n' >> $P/off.toml
B="python3 -m specgen.cli.main bench --proposer draft --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 --baseline target-only --no-fp32-check --format json"
run() {  # name tree profile
  local name=$1 tree=$2 prof=$3; local src=$PWD/src; [ $tree = old ] && src=$PWD/.gpu/old_src/src
  local left=$((590 - SECONDS)); [ $left -lt 30 ] && { echo "no time for $name" | tee -a "$LOG"; return; }
  PYTHONPATH=$src timeout $(( left < 120 ? left : 120 )) $B -p $prof > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc=$? at $SECONDS" | tee -a "$LOG"
}
for r in 1 2; do run old$r old $P/pair.toml; run off$r new $P/off.toml; run on$r new $P/pair.toml; done
python3 benchmarks/bench_summary.py $(ls $OUT/*[0-9].json) | tee -a "$LOG"
