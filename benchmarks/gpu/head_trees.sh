#!/usr/bin/env bash
# Token trees drafted by an EAGLE-3 head, on one GPU in one call: the head tree tests (captured
# rounds, bf16 greedy identity), a head trained HEAD_MINUTES minutes on the bench pair, `specgen
# bench` of the head's chains against its trees (greedy, and t 0.8 / top-p 0.95 with both couplings), and what a round
# costs on Llama 3.1 8B + EAGLE-3 head shapes (random weights) with a chain and with trees
# (ROUNDS_8B=0 leaves those to another GPU).
#   bash benchmarks/gpu/head_trees.sh          # logs, the bench JSON and kernel tables in $OUT
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/head-trees-log.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
. benchmarks/gpu/common.sh
(bench_pair
 PYTHONPATH=$PWD/src timeout 200 python3 -m specgen.cli.main train-head -p /tmp/bench/pair.toml --out /tmp/head \
   --minutes "${HEAD_MINUTES:-2}" --device cuda > /tmp/head.log 2>&1
 echo "== head rc=$? at $SECONDS s: $(tail -3 /tmp/head.log | tr '\n' ' ' | cut -c1-300)" | tee -a "$LOG") &
[ "${ROUNDS_8B:-1}" = 0 ] || (PYTHONPATH=$PWD/src timeout 200 python3 benchmarks/family_pairs.py --family llama-3.1 \
   --scale full --head --out /tmp/famhead --device cuda > /tmp/famhead.log 2>&1; echo "== 8B pair rc=$? at $SECONDS s" | tee -a "$LOG") &
gpu_tests 6 "tests/core/round/test_head_tree_round.py tests/core/round/test_tree_insight.py
  tests/core/drafters/test_heads.py"
wait
PYTHONPATH=$PWD/src timeout ${BENCH_LIMIT:-240} python3 -m specgen.cli.main bench -p /tmp/bench/pair.toml \
  --proposer eagle --head /tmp/head --k 4,6 --tree-width 1,2,4 --tree-nodes 16 -t 0,0.8 --top-p 0.95 \
  --num-prompts 5 -n 128 --baseline target-only --no-fp32-check --format json \
  > "$OUT/head-trees.json" 2> /tmp/bench.err
echo "== bench rc=$? at $SECONDS s" | tee -a "$LOG"
tail -3 /tmp/bench.err | cut -c1-300 | tee -a "$LOG"
PYTHONPATH=$PWD/src python3 benchmarks/bench_summary.py "$OUT/head-trees.json" 2>&1 | tail -30 | tee -a "$LOG"
# the 8B shapes: what a tree round costs against the chain round of the same depth (ROUNDS_8B=0: not here)
[ "${ROUNDS_8B:-1}" = 0 ] && exit 0
PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/gpu/round_kernels.py /tmp/famhead/llama-3.1/pair.toml --proposer eagle \
  --k 6 --shapes 1:0,2:16,4:32 -n 32 --top 12 > "$OUT/head-round-kernels-8b.txt" 2>&1
echo "== 8B head round kernels rc=$? at $SECONDS s" | tee -a "$LOG"
grep "^==" "$OUT/head-round-kernels-8b.txt" | tee -a "$LOG"
