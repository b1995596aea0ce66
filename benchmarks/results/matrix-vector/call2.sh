#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
timeout 240 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_linear.py tests/test_exact.py tests/test_tune.py tests/test_dependent.py > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG; grep -E "^(FAILED|ERROR)" /tmp/tests.txt | head -20 | tee -a $LOG
timeout 200 python3 .gpu/gemv_probe2.py 2>&1 | tee -a $LOG; echo "== probe rc=$? at $SECONDS s" | tee -a $LOG
left=$((590 - SECONDS))
timeout $left python3 benchmarks/bench_kernels.py table --models llama-3.1,bench,qwen2.5,qwen3,gemma-2 --table "$OUT/linear.json" --out "$OUT/table.json" > "$OUT/table.txt" 2>&1
echo "== table rc=$? at $SECONDS s" | tee -a $LOG
