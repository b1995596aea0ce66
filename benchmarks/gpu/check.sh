#!/usr/bin/env bash
# The GPU machine's check of a tree: the test suite on the GPU (CUDA tests included), logs in $OUT.
#   bash benchmarks/gpu/check.sh [pytest args...]     (default: every test file, 12 workers)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.device_count())" >> "$OUT/gpu.txt" 2>&1
if python3 -c "import xdist" 2>/dev/null; then par="-n ${WORKERS:-12} --dist loadfile"; else par=""; fi
timeout ${LIMIT:-520} python3 -m pytest -q -p no:cacheprovider $par -rfE "${@:-tests}" > "$OUT/tests.txt" 2>&1
echo "rc=$?" >> "$OUT/tests.txt"
tail -40 "$OUT/tests.txt"
