#!/usr/bin/env bash
# Compile with the step kernels as operators (gpu/opaque.py): GPU tests, then captured steps
# without compile, with compile (this tree) and with compile before the change (.gpu/old_src),
# alternating, per shape. Env: TESTS, SPECS ("model run ..."), BUDGET.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"; BUDGET=${BUDGET:-570}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
TESTS=${TESTS:-tests/test_opaque.py tests/test_compiled.py tests/test_dependent.py tests/test_kernels.py}
if [ -n "$TESTS" ]; then
  PYTHONPATH=$PWD/src timeout 240 python3 -m pytest -q -rfEs -p no:cacheprovider $TESTS > "$OUT/tests.txt" 2>&1
  echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a "$LOG"
fi
for spec in ${SPECS:-1b bench-draft bench-target}; do
  for v in ${VARIANTS:-new:graph-dependent new:compile-dependent old:compile-default}; do
    tree=${v%%:*}; variant=${v#*:}; src=$PWD/src; bk=$PWD/benchmarks/bench_kernels.py; [ $tree = old ] && { src=$PWD/.gpu/old_src/src; bk=$PWD/.gpu/old_src/benchmarks/bench_kernels.py; }
    left=$((BUDGET - SECONDS)); [ $left -lt 40 ] && { echo "no time for $spec $v" | tee -a "$LOG"; break 2; }
    PYTHONPATH=$src timeout $(( left < 200 ? left : 200 )) python3 $bk steps --model $spec \
      --variants $variant --compile-cache /tmp/cc-$tree --out /tmp/$tree-$variant-$spec.json > "$OUT/steps-$tree-$variant-$spec.txt" 2>&1
    echo "== $spec $tree $variant rc=$? at $SECONDS s" | tee -a "$LOG"
    grep -E "^\| (graph|compile)" "$OUT/steps-$tree-$variant-$spec.txt" | cut -c1-170 | tee -a "$LOG"
  done
done
