#!/bin/bash
# One device call: full-scale random-weight pairs of each family, bench, then the CUDA tests.
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/src
FINAL=$OUT; OUT=/tmp/famlogs; rm -rf $OUT; mkdir -p $OUT
START=$(date +%s); DEADLINE=$((START + 405))
left() { echo $((DEADLINE - $(date +%s))); }
nvidia-smi > $OUT/nvidia-smi.txt 2>&1
python -c "import torch,transformers,triton;print(torch.__version__,transformers.__version__,triton.__version__)" > $OUT/versions.txt 2>&1
df -h /tmp > $OUT/disk.txt
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -l 1 > $OUT/gpu_memory.csv 2>&1 &
MEM=$!
for fam in llama-3.1 qwen2.5 qwen3 gemma-2; do
  [ "$(left)" -lt 90 ] && { echo "$fam: skipped, $(left) s left" >> $OUT/times.txt; continue; }
  s=$(date +%s)
  timeout $(( $(left) < 120 ? $(left) : 120 )) python benchmarks/family_pairs.py --family $fam --scale full \
      --out /tmp/fp --device cuda --prompts 2 > $OUT/$fam.build.log 2>&1
  echo "$fam build rc=$? $(( $(date +%s) - s )) s" >> $OUT/times.txt
  du -sh /tmp/fp/$fam/target /tmp/fp/$fam/draft >> $OUT/times.txt 2>&1
  s=$(date +%s)
  timeout $(( $(left) < 150 ? $(left) : 150 )) python -m specgen.cli.main bench -p /tmp/fp/$fam/pair.toml \
      --k 4 -t 0 --num-prompts 2 -n 32 --baseline target-only --no-fp32-check --format json \
      > $OUT/$fam.bench.json 2> $OUT/$fam.bench.err
  echo "$fam bench rc=$? $(( $(date +%s) - s )) s" >> $OUT/times.txt
  rm -rf /tmp/fp/$fam
done
T=$(left)
if [ "$T" -gt 20 ]; then
  timeout $((T - 5)) python -m pytest -q -x -p no:cacheprovider -m "cuda or slow" tests/test_families.py \
      --durations=15 > $OUT/tests.log 2>&1
  echo "tests rc=$? left $(left) s" >> $OUT/times.txt
fi
kill $MEM
echo "total $(( $(date +%s) - START )) s" >> $OUT/times.txt
tar -cf $FINAL/logs.tar -C /tmp famlogs
cat $OUT/times.txt
