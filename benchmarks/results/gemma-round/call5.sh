#!/usr/bin/env bash
# Experiment: attention splits of one 32-key block for head_dim 256 (Gemma 2) instead of 64 keys.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_exact.py -k "not interpreter" > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " /tmp/tests.txt | head -30 | cut -c1-300 | tee -a $LOG
for r in 1 2; do for tree in old new; do
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  PYTHONPATH=$root/src timeout 90 python3 .gpu/gemma_step.py draft,target 2>&1 | grep -v Warn | grep '^{' | tee -a $OUT/steps.txt | python3 -c "import json,sys; [print('$tree$r', *(f'{k}={v}' for k, v in json.loads(l).items() if k != 'kernels')) for l in sys.stdin]" | tee -a $LOG
done; done
