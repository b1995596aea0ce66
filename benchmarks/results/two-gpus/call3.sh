#!/usr/bin/env bash
# Call 2 found split and whole logits apart by rounding (float32 1e-4) and SegmentedGraph.replay
# outside inference mode: a per-module diagnosis, the decoding test, then the 8B probe and benches.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
timeout 100 python3 benchmarks/results/two-gpus/diag.py > $OUT/diag.txt 2>&1; echo "== diag rc=$? at $SECONDS s" | tee -a $LOG
grep -E "vs|Error" $OUT/diag.txt | cut -c1-700 | tee -a $LOG
timeout 80 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_stages.py -k "decodes" > $OUT/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a $LOG
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.txt | head -10 | cut -c1-300 | tee -a $LOG
FP=/tmp/fp; P=$FP/llama-3.1
timeout 100 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 > /tmp/build.txt 2>&1
echo "== build rc=$? at $SECONDS s" | tee -a $LOG
sed 's|^path = "./target"|path = "./target"\ndevice_map = "balanced"|' $P/pair.toml > $P/split.toml
timeout 90 python3 benchmarks/two_gpus.py --target $P/target --out $OUT/probe8b.json > /tmp/probe.txt 2>&1
echo "== probe8b rc=$? at $SECONDS s" | tee -a $LOG; tail -4 /tmp/probe.txt | cut -c1-1500 | tee -a $LOG
left=$((400 - SECONDS)); timeout $(( left < 100 ? left : 100 )) python3 -m specgen.cli.main bench -p $P/split.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > $OUT/bench8b-split.json 2> /tmp/split.err
echo "== bench split rc=$? at $SECONDS s" | tee -a $LOG; tail -3 /tmp/split.err | cut -c1-400 | tee -a $LOG
python3 benchmarks/bench_summary.py $OUT/bench8b-split.json 2>&1 | tee -a $LOG
python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['environment']['resolved']; print(r.get('placement'), r.get('fallbacks'))" $OUT/bench8b-split.json 2>&1 | cut -c1-600 | tee -a $LOG
