#!/usr/bin/env bash
# specgen bench's round floor (8497905): the GPU test, then the floors it reports for Llama 3.1 8B
# with 3.2 1B, an EAGLE-3 head and prompt lookup (random weights), and for the bench pair.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_floors.py > $OUT/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a $LOG
show() {
python3 - "$1" <<'PY' | tee -a $LOG
import json, sys
d = json.load(open(sys.argv[1]))
e = d["environment"]
print(sys.argv[1].split("/")[-1], "bandwidth %.3f TB/s" % (e["copy_bandwidth_bytes_per_s"] / 1e12), "streamed", e["streamed_bytes"])
for b in d["baselines"]:
    print("  ", b["method"], "tok/s %.1f" % b["tokens_per_second"]["median"])
for r in d["results"]:
    print("  ", r["proposer"], r["k"], r["temperature"], "round %.4f ms" % r["round_ms"]["total"],
          "floor", r["round_floor_ms"] and round(r["round_floor_ms"], 4), "x floor", r["round_over_floor"] and round(r["round_over_floor"], 3),
          "tok/s %.1f" % r["tokens_per_second"]["median"])
PY
}
FP=/tmp/fp
PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 --head > /tmp/build.log 2>&1
echo "== llama build rc=$? at $SECONDS s" | tee -a $LOG
PYTHONPATH=$PWD/src timeout 150 python3 -m specgen.cli.main bench -p $FP/llama-3.1/pair.toml --proposer draft,eagle,ngram --k 4 -t 0 --num-prompts 2 -n 64 \
  --baseline target-only --no-fp32-check --format json > $OUT/llama.json 2> $OUT/llama.err
echo "== llama bench rc=$? at $SECONDS s" | tee -a $LOG; show $OUT/llama.json
tail -25 $OUT/llama.err > $OUT/llama-table.txt
rm -rf $FP
PYTHONPATH=$PWD/src timeout 120 python3 benchmarks/make_pair.py --preset bench --seed 0 --out /tmp/bench --minutes 1 --device cuda > /tmp/pair.log 2>&1
echo "== pair rc=$? at $SECONDS s" | tee -a $LOG
PYTHONPATH=$PWD/src timeout 90 python3 -m specgen.cli.main bench -p /tmp/bench/pair.toml --k 4 -t 0 --num-prompts 10 -n 128 --baseline target-only --no-fp32-check --format json > $OUT/bench.json 2> $OUT/bench.err
echo "== bench pair rc=$? at $SECONDS s" | tee -a $LOG; show $OUT/bench.json
left=$((560 - SECONDS))
if [ $left -gt 200 ]; then
  PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/family_pairs.py --family qwen2.5 --scale full --out $FP --device cuda --prompts 2 > /tmp/build2.log 2>&1
  echo "== qwen build rc=$? at $SECONDS s" | tee -a $LOG
  left=$((585 - SECONDS))
  PYTHONPATH=$PWD/src timeout $left python3 -m specgen.cli.main bench -p $FP/qwen2.5/pair.toml --proposer draft --k 4 -t 0 --num-prompts 2 -n 64 \
    --baseline target-only --no-fp32-check --format json > $OUT/qwen.json 2> $OUT/qwen.err
  echo "== qwen bench rc=$? at $SECONDS s" | tee -a $LOG; show $OUT/qwen.json
fi
