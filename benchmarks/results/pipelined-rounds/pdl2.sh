#!/usr/bin/env bash
# The sampled round's own kernels (warp, verify) launched dependent, and a draft's probs written
# straight into q: GPU tests, then the bench pair end to end, this tree against .gpu/old_src
# (HEAD before the change), alternating. Trains the pair first (about 195 s).
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
TESTS=${TESTS:-tests/test_dependent.py tests/test_warp_kernel.py tests/test_verify_kernel.py tests/test_round.py}
if [ -n "$TESTS" ]; then
  PYTHONPATH=$PWD/src timeout 170 python3 -m pytest -q -rfEs -p no:cacheprovider $TESTS > "$OUT/tests.txt" 2>&1
  echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a "$LOG"
fi
P=.pairs/bench; s=$SECONDS
[ -f $P/pair.toml ] || PYTHONPATH=$PWD/src timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes 2.5 > "$OUT/pair.txt" 2>&1
echo "make_pair $((SECONDS - s)) s" | tee -a "$LOG"
B="python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 --baseline target-only --no-fp32-check --format json"
run() {  # name tree [options]
  local name=$1 tree=$2; shift 2; local src=$PWD/src; [ $tree = old ] && src=$PWD/.gpu/old_src/src
  local left=$((590 - SECONDS)); [ $left -lt 30 ] && { echo "no time for $name" | tee -a "$LOG"; return; }
  PYTHONPATH=$src timeout $(( left < 120 ? left : 120 )) $B "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc=$? at $SECONDS" | tee -a "$LOG"
}
for r in ${RUNS:-old new old new}; do n=${n:-0}; n=$((n + 1)); run $r$n $r; done
python3 benchmarks/bench_summary.py $(ls $OUT/*[0-9].json) | tee -a "$LOG"
