#!/usr/bin/env bash
# Before and after in one call on one GPU: a baseline tree against this one, same pairs, same prompts.
#
#   here:   git archive <commit> src | (mkdir -p .base && tar -x -C .base)   # .base/src: the baseline
#   device: bash benchmarks/gpu/ab.sh .base                                    # carry nothing more
#
# 1. the bench pair (benchmarks/make_pair.py --preset bench, trained MINUTES minutes in the call):
#    `specgen bench` k = 4, greedy and t 0.8 / top-p 0.95, target-only baseline, A B A B;
# 2. the Llama 3.1 8B + 3.2 1B random-weight pair with an EAGLE-3 head (benchmarks/family_pairs.py):
#    draft, eagle and ngram rounds against their floor, A B.
# Both trees run this tree's benchmark scripts; each bench JSON and a summary log land in $OUT.
set -u
BASE=$(cd "${1:?a baseline folder with src/}" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/ab-log.txt
export PYTHONUNBUFFERED=1
HERE=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
bench() {  # bench TREE_SRC NAME ARGS...
  local src=$1 name=$2; shift 2
  PYTHONPATH=$src timeout 150 python3 -m specgen.cli.main bench "$@" --format json > "$OUT/$name.json" 2> "/tmp/$name.err"
  echo "== $name rc=$? at $SECONDS s" | tee -a "$LOG"
  PYTHONPATH=$HERE/src python3 benchmarks/bench_summary.py "$OUT/$name.json" 2>&1 | tail -12 | tee -a "$LOG"
  grep -iE "warn|error" "/tmp/$name.err" | head -3 | tee -a "$LOG"
}
PYTHONPATH=$HERE/src timeout 200 python3 benchmarks/make_pair.py --preset bench --seed 0 --out /tmp/bench \
  --minutes "${MINUTES:-1}" --device cuda > /tmp/pair.log 2>&1
echo "== bench pair rc=$? at $SECONDS s" | tee -a "$LOG"
for round in 1 2; do
  for tree in base head; do
    src=$BASE/src; [ $tree = head ] && src=$HERE/src
    bench "$src" "pair-$tree-$round" -p /tmp/bench/pair.toml --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 \
      --baseline target-only
  done
done
PYTHONPATH=$HERE/src timeout 200 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --head \
  --out /tmp/fam --device cuda > /tmp/fam.log 2>&1
echo "== 8B pair rc=$? at $SECONDS s" | tee -a "$LOG"
for tree in base head; do
  src=$BASE/src; [ $tree = head ] && src=$HERE/src
  bench "$src" "8b-$tree" -p /tmp/fam/llama-3.1/pair.toml --proposer draft,eagle,ngram --k 4 -t 0 --num-prompts 2 \
    -n 32 --baseline target-only
done
