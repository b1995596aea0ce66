#!/usr/bin/env bash
# Call 7: with the rewiring no longer shadowed, a split 8B step costs +0.07 ms and matches one GPU
# bit for bit. Here: the GPU tests in one process (the split runner test no longer xfail), then
# test_gpu.py alone if that fails; then the 2x target (64 layers): the probe and both benches.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
timeout 220 python3 -m pytest -v -rfE -p no:cacheprovider tests/test_stages.py tests/test_gpu.py > $OUT/tests.txt 2>&1
rc=$?; echo "== tests rc=$rc at $SECONDS s: $(tail -1 $OUT/tests.txt | cut -c1-200)" | tee -a $LOG
grep -E "(FAILED|ERROR)" $OUT/tests.txt | cut -c1-160 | head -8 | tee -a $LOG
if [ $rc -ne 0 ]; then
  timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_gpu.py > $OUT/tests-gpu-alone.txt 2>&1
  echo "== test_gpu alone rc=$? at $SECONDS s: $(tail -1 $OUT/tests-gpu-alone.txt | cut -c1-200)" | tee -a $LOG
fi
FP=/tmp/fp64; P=$FP/llama-3.1
timeout 150 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --target-layers 64 --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build 64 layers rc=$? at $SECONDS s" | tee -a $LOG; tail -2 /tmp/build.txt | cut -c1-300 | tee -a $LOG
timeout 150 python3 benchmarks/two_gpus.py --target $P/target --out $OUT/probe16b.json > /tmp/probe.txt 2>&1
echo "== probe 64 layers rc=$? at $SECONDS s" | tee -a $LOG; tail -1 /tmp/probe.txt | cut -c1-1500 | tee -a $LOG
sed 's|^path = "./target"|path = "./target"\ndevice_map = "balanced"|' $P/pair.toml > $P/split.toml
for name in split pair; do
  left=$((580 - SECONDS)); [ $left -lt 45 ] && break
  timeout $(( left < 110 ? left : 110 )) python3 -m specgen.cli.main bench -p $P/$name.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > $OUT/bench16b-$name.json 2> /tmp/$name.err
  echo "== bench $name rc=$? at $SECONDS s" | tee -a $LOG; tail -2 /tmp/$name.err | cut -c1-300 | tee -a $LOG
  python3 benchmarks/bench_summary.py $OUT/bench16b-$name.json 2>&1 | tail -3 | tee -a $LOG
done
