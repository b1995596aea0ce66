#!/usr/bin/env bash
# Token trees on one GPU, in one call: their tests (captured tree rounds on the GPU), then
# `specgen bench` of chains against trees on the bench pair (trained MINUTES minutes in the call).
#   bash benchmarks/gpu/trees.sh          # logs and the bench JSON in $OUT
#   BASE=folder bash benchmarks/gpu/trees.sh   # the same sweep on that folder's src/ too
#   PROPOSERS=draft,hybrid bash benchmarks/gpu/trees.sh   # proposers swept (default: draft)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/trees-log.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
. benchmarks/gpu/common.sh
bench_pair &
gpu_tests 8 "tests/core/round/test_tree_round.py tests/core/round/test_tree.py tests/gpu/kernels/test_tree_walk_kernel.py
  tests/gpu/kernels/test_tree_build_kernel.py tests/gpu/kernels/test_topw_kernel.py tests/gpu/kernels/test_compact.py
  tests/gpu/test_round_ops.py tests/core/test_engine_tree_auto.py tests/core/round/test_hybrid_tree_round.py
  tests/core/round/test_lookup_tree_round.py tests/gpu/kernels/test_tree_merge_kernel.py
  tests/core/round/test_hybrid_tree_source.py"
wait
echo "== bench pair at $SECONDS s: $(tail -1 /tmp/pair.log | cut -c1-160)" | tee -a "$LOG"
trees() {  # name, src: the sweep on that tree's src/
  PYTHONPATH=$2 timeout ${BENCH_LIMIT:-200} python3 -m specgen.cli.main bench -p /tmp/bench/pair.toml --k 4 --proposer ${PROPOSERS:-draft} \
    --tree-width 1,2,4 --tree-nodes 8,16 -t 0,0.8 --top-p 0.95 --coupling rejection --num-prompts 5 -n 128 \
    --baseline target-only --no-fp32-check --format json > "$OUT/$1.json" 2> /tmp/$1.err
  echo "== $1 rc=$? at $SECONDS s" | tee -a "$LOG"
  tail -3 /tmp/$1.err | cut -c1-300 | tee -a "$LOG"
  PYTHONPATH=$PWD/src python3 benchmarks/bench_summary.py "$OUT/$1.json" 2>&1 | tail -20 | tee -a "$LOG"
}
trees trees "$PWD/src"
[ -z "${BASE:-}" ] || trees trees-base "$BASE/src"  # before/after in one call: a baseline tree's src/
# what `auto` makes of the rows that bench just measured (kept under runtime.measured)
PYTHONPATH=$PWD/src timeout 60 python3 -m specgen.cli.main generate -p /tmp/bench/pair.toml --k 4 --tree-width auto \
  --tree-nodes auto -n 64 -v "def fib(n):" 2>&1 >/dev/null | grep -i "tree" | tee -a "$LOG"
