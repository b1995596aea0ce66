#!/usr/bin/env bash
# The one-time 0.29 s in an 8B bench's first timed lookup run (docs/benchmarks.md), traced in one
# call: `specgen bench` of the Llama 3.1 8B + 3.2 1B random-weight pair with an EAGLE-3 head, three
# proposers and lookup alone, on a baseline tree and on this one, each under bench_trace.py (which run
# each cycle collection, capture, re-allocation, round built and Triton compile fell in).
#
#   here:   git archive <commit> src | (mkdir -p .base && tar -x -C .base)   # .base/src: the baseline
#   device: bash benchmarks/gpu/first_lookup.sh .base                          # traces and JSON in $OUT
set -u
BASE=$(cd "${1:?a baseline folder with src/}" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/first-lookup.txt
export PYTHONUNBUFFERED=1
HERE=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" | tee -a "$LOG"
PYTHONPATH=$HERE/src timeout 200 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --head \
  --out /tmp/fam --device cuda > /tmp/fam.log 2>&1
echo "== 8B pair rc=$? at $SECONDS s" | tee -a "$LOG"
for plan in draft,eagle,ngram ngram; do
  for tree in base head; do
    src=$BASE/src; [ $tree = head ] && src=$HERE/src
    name=$tree-${plan//,/-}
    PYTHONPATH=$src timeout 150 python3 benchmarks/gpu/bench_trace.py "$OUT/$name.txt" bench \
      -p /tmp/fam/llama-3.1/pair.toml --proposer $plan --k 4 -t 0 --num-prompts 2 -n 32 --baseline target-only \
      --no-fp32-check --format json > "$OUT/$name.json" 2> "/tmp/$name.err"
    echo "== $name rc=$? at $SECONDS s" | tee -a "$LOG"
    grep -iE "warn|error" "/tmp/$name.err" | head -3 | tee -a "$LOG"
    sed -n '3,$p' "$OUT/$name.txt" | cut -c1-220 | tee -a "$LOG"
  done
done
