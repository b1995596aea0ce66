#!/usr/bin/env bash
# The GPU machine's check of a tree: the test suite on the GPU (CUDA tests included), logs in $OUT.
#   bash benchmarks/gpu/check.sh [pytest args...]
# Default: the files whose tests need a GPU first, then the rest. Each test's outcome is written to
# $OUT/tests.txt as it ends (-v), so a run cut short by the call's time limit still names its
# failures; the tracebacks (one line each) follow at the end.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.device_count())" >> "$OUT/gpu.txt" 2>&1
if python3 -c "import xdist" 2>/dev/null; then par="-n ${WORKERS:-12} --dist loadfile"; else par=""; fi
first="tests/gpu/kernels/test_exact.py tests/gpu/test_gpu_ops.py tests/gpu/test_gpu.py tests/core/drafters/test_heads.py
       tests/gpu/test_stages.py tests/gpu/test_round_ops.py tests/core/test_decode.py tests/core/drafters/test_hybrid.py
       tests/gpu/kernels/test_attention.py tests/core/step/test_step.py"
[ $# -gt 0 ] || set -- $first  # the default list, one word per file
# shellcheck disable=SC2086
timeout ${LIMIT:-520} python3 -m pytest -v -p no:cacheprovider -p no:benchmark $par -rfE --tb=line "$@" \
  > "$OUT/tests.txt" 2>&1
echo "rc=$?" >> "$OUT/tests.txt"
grep -E "FAILED|ERROR|rc=" "$OUT/tests.txt" | tail -60
