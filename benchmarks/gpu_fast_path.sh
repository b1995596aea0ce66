#!/usr/bin/env bash
# The GPU fast path's runs, as recorded in docs/benchmarks.md ("GPU fast path"). Logs go to $OUT.
#   bash benchmarks/gpu_fast_path.sh check   # CUDA tests, graph-vs-eager check, random-weight e2e + start-up, 8B shapes
#   bash benchmarks/gpu_fast_path.sh bench   # train the bench pair, then the end-to-end benchmark on it
#   bash benchmarks/gpu_fast_path.sh attention  # SDPA backend choice per step length; 8B shapes with compile
#   bash benchmarks/gpu_fast_path.sh fused   # fused-round tests, kernel profile, fused vs per-phase (random weights)
#   bash benchmarks/gpu_fast_path.sh kernel  # decode-attention kernel: CUDA tests, step profiles vs SDPA, 8B shapes
#   bash benchmarks/gpu_fast_path.sh final   # every CUDA test (compile too), start-up with/without compile
#   bash benchmarks/gpu_fast_path.sh linear  # linear kernel: tests, configurations vs cuBLAS, 8B shapes
#   bash benchmarks/gpu_fast_path.sh splitk  # linear tests, split-K configurations vs the default on 8B shapes
#   bash benchmarks/gpu_fast_path.sh rope    # rotary inside the attention kernel: logit diffs, its tests in full, 8B shapes both ways
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-.out}
mkdir -p "$OUT"
python3 -c "import pytest" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="$PYTHONPATH:/tmp/site"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" | tee -a "$OUT/device.txt"

case "${1:-check}" in
splitk)  # linear tests; split-K configurations against the default on Llama-3-8B's projections
  timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_linear.py 2>&1 \
    | tee "$OUT/pytest_linear.txt" | tail -5
  timeout 400 python3 benchmarks/bench_linear.py --split-k --shapes "${SHAPES:-q_o,qkv,down,gate_up}" \
    --out "$OUT/bench_linear_split_k.json" 2>&1 | grep -v -i warn | tee "$OUT/bench_linear_split_k.txt" | grep -E "^\||Error"
  ;;
rope)
  timeout 100 python3 benchmarks/rope_diffs.py 2>&1 | grep -v -i warn | tee "$OUT/rope_diffs.txt"
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=long tests/test_attention.py 2>&1 \
    | tee "$OUT/pytest_attention.txt" | tail -80
  for r in kernel torch; do
    SPECGEN_ROPE=$r timeout 190 python3 benchmarks/bench_shapes.py --variants compile-linear --profile \
      --out "$OUT/shapes_rope_$r.json" 2>&1 | grep -v -i warn | tee "$OUT/shapes_rope_$r.txt" | grep -E "^\{|floor"
  done
  ;;
check)
  timeout 170 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_gpu.py 2>&1 | tee "$OUT/pytest.txt" | tail -25
  timeout 80 python3 benchmarks/gpu_check.py --out "$OUT/check.json" 2>&1 | tail -40
  timeout 200 python3 benchmarks/bench_e2e.py --random --prompts 4 --hf-prompts 1 --compile \
    --inductor-cache /tmp/inductor --out "$OUT/e2e_random.json" 2>&1 | tee "$OUT/e2e_random.txt" | tail -30
  (cd /tmp && tar czf inductor.tgz inductor && ls -la inductor.tgz && [ "$(stat -c %s inductor.tgz)" -lt 15000000 ] \
    && cp inductor.tgz "$OUT/")
  timeout 120 python3 benchmarks/bench_shapes.py --out "$OUT/shapes.json" 2>&1 | tee "$OUT/shapes.txt" | tail -12
  ;;
bench)
  if [ "${PYTEST:-1}" = 1 ]; then
    timeout 100 python3 -m pytest -q -x -p no:cacheprovider -m "cuda and not slow" tests/test_gpu.py 2>&1 \
      | tee "$OUT/pytest.txt" | tail -3 || exit 1
  fi
  timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out .pairs/bench --minutes "${MINUTES:-4.4}" \
    2>&1 | tee "$OUT/train.txt" | tail -4
  cp .pairs/bench/report.json "$OUT/pair_report.json"
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
  timeout "${E2E_TIMEOUT:-300}" python3 benchmarks/bench_e2e.py --pair .pairs/bench --prompts 20 --hf-prompts "${HF_PROMPTS:-4}" \
    --compile --no-startups --extra-k "${EXTRA_K:-3,6}" ${E2E_FLAGS---phased} --out "$OUT/e2e.json" 2>&1 | tee "$OUT/e2e.txt" | tail -24
  ;;
attention)  # SDPA backends for 1- and multi-token steps, graphs with and without compile; 8B shapes compiled
  for c in "" "--compile"; do for a in "--many default" "--many MATH"; do
    timeout 120 python3 benchmarks/profile_steps.py --rows 8 $a $c 2>&1 | tee -a "$OUT/profile.txt" \
      | grep -E "^## |^attention" ; done; done
  timeout 300 python3 benchmarks/bench_shapes.py --compile --out "$OUT/shapes.json" 2>&1 | tee "$OUT/shapes.txt" | tail -12
  ;;
fused)
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -m "cuda and not slow" tests/test_gpu.py 2>&1 \
    | tee "$OUT/pytest.txt" | tail -25
  timeout 120 python3 benchmarks/profile_steps.py --out "$OUT/profile.txt" 2>&1 | grep -E "^## |Self CUDA time" | head -20
  timeout 150 python3 benchmarks/bench_e2e.py --random --prompts 8 --hf 0 --no-startups --phased --extra-k 6 \
    --out "$OUT/e2e_random.json" 2>&1 | tee "$OUT/e2e_random.txt" | tail -16
  ;;
linear)
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_linear.py 2>&1 | tee "$OUT/pytest.txt" | tail -4
  timeout "${LINEAR_TIMEOUT:-200}" python3 benchmarks/bench_linear.py --rows "${ROWS:-1,5}" --out "$OUT/linear.json" 2>&1 \
    | tee "$OUT/linear.txt" | grep -v "^{" | tail -16
  timeout "${SHAPES_TIMEOUT:-240}" python3 benchmarks/bench_shapes.py --variants "${VARIANTS:-graph-kernel,graph-linear,compile-linear}" \
    --out "$OUT/shapes.json" 2>&1 | tee "$OUT/shapes.txt" | tail -8
  timeout "${GPU_TESTS_TIMEOUT:-90}" python3 -m pytest -q -x -p no:cacheprovider -m "cuda and not slow" tests/test_gpu.py 2>&1 \
    | tee -a "$OUT/pytest.txt" | tail -4
  ;;
kernel)
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_attention.py 2>&1 | tee "$OUT/pytest.txt" | tail -4
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m "cuda and not slow" tests/test_gpu.py 2>&1 \
    | tee -a "$OUT/pytest.txt" | tail -6
  for c in "" "--compile"; do for a in kernel sdpa; do
    timeout 100 python3 benchmarks/profile_steps.py --rows 10 --attention $a $c 2>&1 | tee -a "$OUT/profile.txt" \
      | grep -E "^## |^attention" ; done; done
  timeout 240 python3 benchmarks/bench_shapes.py --variants graph-sdpa,graph-kernel,compile-kernel \
    --out "$OUT/shapes.json" 2>&1 | tee "$OUT/shapes.txt" | tail -12
  ;;
final)
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_attention.py 2>&1 | tee "$OUT/pytest.txt" | tail -3
  timeout 220 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_gpu.py tests/test_kernels.py 2>&1 \
    | tee -a "$OUT/pytest.txt" | tail -4
  timeout 250 python3 benchmarks/bench_e2e.py --random --prompts 4 --hf 0 --compile --inductor-cache /tmp/inductor \
    --out "$OUT/e2e_random.json" 2>&1 | tee "$OUT/e2e_random.txt" | tail -14
  ;;
esac
