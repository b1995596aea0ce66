#!/usr/bin/env bash
# A draft the profile puts on another GPU than the target: test_stages.py (its new test among
# them), then the 8B pair's bench with the draft on GPU 0 and the target on GPU 1 against both on
# GPU 1, in one call.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_stages.py > $OUT/tests.txt 2>&1
echo "== test_stages rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt | cut -c1-200)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.txt | cut -c1-200 | head -8 | tee -a $LOG
FP=/tmp/fp; P=$FP/llama-3.1
timeout 90 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
sed 's|^path = "./target"|path = "./target"\ndevice = "cuda:1"|; s|^path = "./draft"|path = "./draft"\ndevice = "cuda:1"|' $P/pair.toml > $P/same.toml
sed 's|^path = "./target"|path = "./target"\ndevice = "cuda:1"|; s|^path = "./draft"|path = "./draft"\ndevice = "cuda:0"|' $P/pair.toml > $P/apart.toml
for name in apart same; do
  left=$((560 - SECONDS)); [ $left -lt 45 ] && break
  timeout $(( left < 100 ? left : 100 )) python3 -m specgen.cli.main bench -p $P/$name.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > $OUT/bench8b-draft-$name.json 2> /tmp/$name.err
  echo "== bench $name rc=$? at $SECONDS s" | tee -a $LOG; tail -2 /tmp/$name.err | cut -c1-300 | tee -a $LOG
  python3 benchmarks/bench_summary.py $OUT/bench8b-draft-$name.json 2>&1 | tail -3 | tee -a $LOG
done
