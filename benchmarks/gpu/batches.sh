#!/usr/bin/env bash
# Batches on one GPU, in one call: the CUDA batch tests, then `specgen bench --batch-size` on the
# bench pair (trained MINUTES minutes in the call; greedy, and t 0.8 with Gumbel coupling) and on
# Llama 3.1 8B + 3.2 1B random-weight shapes (greedy: costs only), each run's round against its
# floor (the weights once a step, plus each row's keys and values: core/bench/floors.py), then
# where a batch round's time goes (benchmarks/gpu/batch_kernels.py). BASE=folder adds the greedy
# sweep on that folder's src/ (a baseline: before/after in one call); where head_trees.sh trained a
# head on this machine (/tmp/head), the head's batches too.
#   bash benchmarks/gpu/batches.sh          # logs and the bench JSON in $OUT
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/batches-log.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
. benchmarks/gpu/common.sh
(bench_pair
 [ -f /tmp/fam/llama-3.1/pair.toml ] || PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/family_pairs.py \
   --family llama-3.1 --scale full --prompts 16 --out /tmp/fam --device cuda --dtype bfloat16 > /tmp/fam.log 2>&1) &
gpu_tests 6 "tests/gpu/test_batch_gpu.py tests/gpu/test_batch_tree_gpu.py tests/gpu/test_batch_hybrid_gpu.py tests/gpu/kernels/test_commit.py tests/gpu/kernels/test_noise.py
  tests/core/bench/test_batch_floors.py tests/core/round/test_batch_staging.py tests/core/round/test_batch_head.py"
wait
echo "== pairs at $SECONDS s: $(tail -1 /tmp/pair.log | cut -c1-120) | $(tail -1 /tmp/fam.log | cut -c1-120)" | tee -a "$LOG"
bench() {  # name, limit, args...
  local name=$1 limit=$2; shift 2
  PYTHONPATH=${PYTHONPATH%%:*} timeout "$limit" python3 -m specgen.cli.main bench "$@" --format json > "$OUT/$name.json" 2> "/tmp/$name.err"
  echo "== $name rc=$? at $SECONDS s" | tee -a "$LOG"
  tail -2 "/tmp/$name.err" | cut -c1-300 | tee -a "$LOG"
  python3 - "$OUT/$name.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
f = d.get("floor") or {}
bw = f.get("copy_bandwidth_bytes_per_s")
print("floor: copy GB/s", round(bw / 1e9) if bw else None, "streamed", f.get("streamed_bytes"),
      "cache B/position", f.get("cache_bytes_per_position"))
fmt = lambda v, n=3: None if v is None else round(v, n)
print("B method k tok/s row_ms/tok mean_len | rounds rows/round round_ms floor_ms x_floor floor_GB(target,draft)")
for r in d.get("results", []):
    parts = r.get("round_floor_bytes") or {}
    print(r["batch_size"], r["method"], r["k"], round(r["tokens_per_second"], 1),
          fmt((r.get("row_ms_per_token") or {}).get("median")), fmt(r.get("mean_accepted_length")), "|",
          r.get("rounds"), fmt(r.get("rows_per_round"), 2), fmt(r.get("round_ms")), fmt(r.get("round_floor_ms")),
          fmt(r.get("round_over_floor")), [fmt(v / 1e9 if v is not None else None) for v in parts.values()])
for r in d.get("recommendations", []):
    print("B", r["batch_size"], r["choice"], r.get("speedup"))
print("stops paying at", d.get("speculation_stops_paying_at"))
PY
}
bench pair-greedy 120 -p /tmp/bench/pair.toml --batch-size 1,4,8,16,32 --k 2,4 --num-prompts 64 -n 128
if [ -n "${BASE:-}" ]; then  # the same sweep on a baseline tree's src/ (before/after in one call)
  PYTHONPATH=$BASE/src:$PWD/tests bench pair-greedy-base 120 -p /tmp/bench/pair.toml --batch-size 1,4,8,16,32 --k 2,4 \
    --num-prompts 64 -n 128
fi
# the single-prompt decoder on the same 64 prompts: what batch 1 of the batch loop compares with
PYTHONPATH=$PWD/src timeout 90 python3 -m specgen.cli.main bench -p /tmp/bench/pair.toml --k 2,4 -t 0 \
  --num-prompts 64 -n 128 --baseline target-only --no-fp32-check --format json > "$OUT/pair-single.json" 2> /tmp/single.err
echo "== pair-single rc=$? at $SECONDS s" | tee -a "$LOG"
PYTHONPATH=$PWD/src python3 benchmarks/bench_summary.py "$OUT/pair-single.json" 2>&1 | tail -6 | tee -a "$LOG"
bench pair-gumbel 90 -p /tmp/bench/pair.toml --batch-size 1,8,32 --k 4 -t 0.8 --top-p 0.95 --coupling gumbel \
  --num-prompts 64 -n 128
if [ -f /tmp/head/profile.toml ]; then  # a head another script trained on this machine (head_trees.sh)
  bench pair-eagle 90 -p /tmp/bench/pair.toml --proposer eagle --head /tmp/head --batch-size 1,8,32 --k 4,6 \
    --num-prompts 64 -n 128
fi
[ "${EIGHT_B:-1}" = 0 ] || bench 8b-greedy 150 -p /tmp/fam/llama-3.1/pair.toml --batch-size 1,4,16 --k 4 --num-prompts 16 -n 32
# where a batch round's time goes: the device's kernels against the host's settling (KERNELS=0: not here;
# EIGHT_B=0 leaves out the 8B sweep above)
[ "${KERNELS:-1}" = 0 ] || PYTHONPATH=$PWD/src timeout 120 python3 benchmarks/gpu/batch_kernels.py /tmp/bench/pair.toml --batch-sizes 1,8,32 \
  --k 0,2 --prompts 32 -n 64 --top 14 > "$OUT/batch-kernels.txt" 2>&1
echo "== batch kernels rc=$? at $SECONDS s" | tee -a "$LOG"
grep "^==" "$OUT/batch-kernels.txt" | tee -a "$LOG"
