#!/usr/bin/env bash
# Dependent launch: GPU tests, then captured steps without (graph-io) and with it (graph-dependent),
# alternating, on the 1B and 8B shapes, with kernel profiles. The H100 call ran it with
# TESTS=tests/test_dependent.py SPECS="1b:1 8b:1 1b:2".
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" | tee -a "$LOG"
timeout 200 python3 -m pytest -q -rfEs -p no:cacheprovider ${TESTS:-tests/test_dependent.py tests/test_step_io.py tests/test_norm.py} > "$OUT/tests.txt" 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a "$LOG"
for spec in ${SPECS:-1b:1 1b:2 8b:1}; do
  m=${spec%:*}; run=${spec#*:}
  for v in graph-io graph-dependent; do
    left=$((570 - SECONDS)); [ $left -lt 30 ] && { echo "no time for $m $v" | tee -a "$LOG"; break 2; }
    timeout $(( left < 200 ? left : 200 )) python3 benchmarks/bench_kernels.py steps --model $m --variants $v --profile \
      --out /tmp/$v-$m-$run.json > "$OUT/steps-$v-$m-$run.txt" 2>&1
    echo "== $m $v run $run rc=$? at $SECONDS s" | tee -a "$LOG"; grep -E "^\| graph" "$OUT/steps-$v-$m-$run.txt" | cut -c1-170 | tee -a "$LOG"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(' kernels/step', r.get('kernels_per_step'), 'kernel ms', round(r.get('kernel_ms_per_step',0),4), 'gaps ms', r.get('gap_ms_last_step'))" /tmp/$v-$m-$run.json 2>&1 | tail -1 | tee -a "$LOG"
  done
done
