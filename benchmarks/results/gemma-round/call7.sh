#!/usr/bin/env bash
# Gemma 2: this session's changes together (e04f528 = old, HEAD = new): GPU tests; steps; k = 4 rounds.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_attention.py -k "not interpreter" > /tmp/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " /tmp/tests.txt | head -30 | cut -c1-300 | tee -a $LOG
cp /tmp/tests.txt $OUT/tests.txt
for r in 1; do for tree in old new; do
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  roles=draft; [ $r = 1 ] && roles=draft,target
  PYTHONPATH=$root/src timeout 90 python3 .gpu/gemma_step.py $roles 2>&1 | grep -v Warn | grep '^{' | tee -a $OUT/steps.txt | python3 -c "import json,sys; [print('$tree$r', *(f'{k}={v}' for k, v in json.loads(l).items() if k != 'kernels')) for l in sys.stdin]" | tee -a $LOG
done; done
FP=/tmp/fp; P=$FP/gemma-2
PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/family_pairs.py --family gemma-2 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
for tree in old new; do
  left=$((590 - SECONDS)); [ $left -lt 50 ] && { echo "no time for $tree" | tee -a $LOG; continue; }
  root=$PWD; [ $tree = old ] && root=$PWD/.gpu/old
  PYTHONPATH=$root/src timeout $(( left < 110 ? left : 110 )) python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > $OUT/gemma-$tree.json 2> /tmp/$tree.err
  echo "$tree rc=$? at $SECONDS" | tee -a $LOG; tail -2 /tmp/$tree.err | cut -c1-200
done
python3 benchmarks/bench_summary.py $OUT/gemma-old.json $OUT/gemma-new.json | tee -a $LOG
