#!/usr/bin/env bash
# Gemma 2's rotary in the attention kernel and its layer's adds in the norm kernel: GPU tests;
# Gemma 2 draft and target steps, HEAD (norms only) against the change.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name --format=csv,noheader | tee $LOG
for tree in old new; do
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  PYTHONPATH=$root/src timeout 60 python3 .gpu/gemma_step.py draft,target 2>&1 | grep -v Warn | sed "s/^/$tree /" | tee -a $LOG
done
PYTHONPATH=$PWD/src timeout 80 python3 -m pytest -q -x -rfE -p no:cacheprovider tests/test_exact.py tests/test_norm.py -k "gemma or captured" > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " /tmp/tests.txt | head -20 | cut -c1-300 | tee -a $LOG
