#!/usr/bin/env bash
# A target over two GPUs (after call1 found the eager forward deriving positions on the wrong
# device): the GPU tests of gpu/stages.py; Llama 3.1 8B + 3.2 1B (random weights)
# on one GPU and with the target split in two: bitwise logits and step costs (two_gpus.py), then
# `specgen bench` of both placements.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
nvidia-smi topo -m 2>&1 | head -5 | tee -a $LOG
timeout 140 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_stages.py > $OUT/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.txt | head -30 | cut -c1-300 | tee -a $LOG
FP=/tmp/fp; P=$FP/llama-3.1
timeout 100 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG; tail -2 /tmp/build.txt | cut -c1-300 | tee -a $LOG
sed 's|^path = "./target"|path = "./target"\ndevice_map = "balanced"|' $P/pair.toml > $P/split.toml
timeout 120 python3 benchmarks/two_gpus.py --target $P/target --out $OUT/probe8b.json > /tmp/probe.txt 2>&1
echo "== probe8b rc=$? at $SECONDS s" | tee -a $LOG; tail -4 /tmp/probe.txt | cut -c1-1500 | tee -a $LOG
for prof in pair split; do
  left=$((560 - SECONDS)); [ $left -lt 30 ] && { echo "no time for $prof" | tee -a $LOG; continue; }
  timeout $(( left < 100 ? left : 100 )) python3 -m specgen.cli.main bench -p $P/$prof.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > $OUT/bench8b-$prof.json 2> /tmp/$prof.err
  echo "== bench $prof rc=$? at $SECONDS s" | tee -a $LOG; tail -3 /tmp/$prof.err | cut -c1-400 | tee -a $LOG
done
python3 benchmarks/bench_summary.py $OUT/bench8b-pair.json $OUT/bench8b-split.json 2>&1 | tee -a $LOG
for p in pair split; do python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['environment']['resolved']; print(sys.argv[1][-16:], r.get('placement'), r.get('fallbacks'))" $OUT/bench8b-$p.json 2>&1 | cut -c1-600 | tee -a $LOG; done
# A target twice as large (64 layers of Llama 3.1 8B's widths, 15B parameters): only if the split
# 8B bench ran.
python3 -c "import json; json.load(open('$OUT/bench8b-split.json'))" 2>/dev/null || { echo "no 16B: the split 8B bench failed" | tee -a $LOG; exit 0; }
rm -rf $FP; FP=/tmp/fp2; P=$FP/llama-3.1
timeout 150 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --target-layers 64 --out $FP --device cuda --prompts 2 > /tmp/build2.txt 2>&1
echo "== build 16b rc=$? at $SECONDS s" | tee -a $LOG; tail -2 /tmp/build2.txt | cut -c1-300 | tee -a $LOG
sed 's|^path = "./target"|path = "./target"\ndevice_map = "balanced"|' $P/pair.toml > $P/split.toml
left=$((570 - SECONDS)); timeout $(( left < 130 ? left : 130 )) python3 benchmarks/two_gpus.py --target $P/target --out $OUT/probe16b.json > /tmp/probe2.txt 2>&1
echo "== probe16b rc=$? at $SECONDS s" | tee -a $LOG; tail -4 /tmp/probe2.txt | cut -c1-1500 | tee -a $LOG
for prof in pair split; do
  left=$((575 - SECONDS)); [ $left -lt 40 ] && { echo "no time for 16b $prof" | tee -a $LOG; continue; }
  timeout $(( left < 120 ? left : 120 )) python3 -m specgen.cli.main bench -p $P/$prof.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > $OUT/bench16b-$prof.json 2> /tmp/$prof.err
  echo "== bench 16b $prof rc=$? at $SECONDS s" | tee -a $LOG; tail -3 /tmp/$prof.err | cut -c1-400 | tee -a $LOG
done
python3 benchmarks/bench_summary.py $OUT/bench16b-pair.json $OUT/bench16b-split.json 2>&1 | tee -a $LOG
