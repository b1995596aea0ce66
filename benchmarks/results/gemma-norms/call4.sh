#!/usr/bin/env bash
# Gemma's (1 + w) norms in the norm kernel: GPU tests; Gemma 2 draft and target steps, old and new.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_norm.py tests/test_opaque.py tests/test_exact.py -k "not interpreter" > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " /tmp/tests.txt | head -20 | cut -c1-300 | tee -a $LOG
for tree in old new; do
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  PYTHONPATH=$root/src timeout 150 python3 .gpu/gemma_step.py draft,target 2>&1 | grep -v Warn | sed "s/^/$tree /" | tee -a $LOG
done
