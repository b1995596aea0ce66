#!/usr/bin/env bash
# The EAGLE-3 heads' shapes the package's table lacks, tuned; a head call before and after.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
echo "== before" | tee -a "$LOG"; python3 .gpu/headprof.py --no-profile 2>&1 | tee -a "$LOG"
timeout 400 python3 benchmarks/bench_kernels.py table --models llama-3.1-head,qwen2.5-head,qwen3-head --missing \
  --table "$OUT/heads.json" > "$OUT/table.txt" 2>&1
echo "== table rc=$? at $SECONDS s" | tee -a "$LOG"; tail -12 "$OUT/table.txt" | tee -a "$LOG"
python3 .gpu/merge_table.py "$OUT/heads.json" | tee -a "$LOG"
echo "== after" | tee -a "$LOG"; python3 .gpu/headprof.py --no-profile 2>&1 | tee -a "$LOG"
