#!/usr/bin/env bash
# The owned model step on CUDA: GPU tests, then the bench pair (trained 1 minute here) with the
# rewired transformers modules ([runtime] modeling = "transformers") against the owned step
# ("auto"), alternating, same GPU, same prompts.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a $LOG
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_ops.py tests/test_exact.py tests/test_step.py > /tmp/tests.txt 2>&1; grep -E '^E |FAILED' /tmp/tests.txt | head -5 | tee -a $LOG
echo "== tests at $SECONDS s: $(tail -1 /tmp/tests.txt)" | tee -a $LOG
timeout 200 python3 benchmarks/make_pair.py --preset bench --seed 0 --out /tmp/bench --minutes 1 --device cuda > /tmp/pair.log 2>&1
echo "== pair rc=$? at $SECONDS s" | tee -a $LOG; tail -2 /tmp/pair.log | cut -c1-160 | tee -a $LOG
for m in transformers auto; do
  cp /tmp/bench/pair.toml /tmp/bench/$m.toml
  printf '\n[runtime]\nmodeling = "%s"\n' $m >> /tmp/bench/$m.toml
done
for round in 1 2; do  # alternating: A B A B
  for m in transformers auto; do
    timeout 100 python3 -m specgen.cli.main bench -p /tmp/bench/$m.toml --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 \
      --baseline target-only --format json > $OUT/bench-$m-$round.json 2> $OUT/bench-$m-$round.err
    echo "== bench $m $round rc=$? at $SECONDS s" | tee -a $LOG
    python3 benchmarks/bench_summary.py $OUT/bench-$m-$round.json 2>&1 | tee -a $LOG
    grep -o "\"modeling\": \"[a-z]*\"" $OUT/bench-$m-$round.json | head -1 | tee -a $LOG; grep -i "warn\|error" $OUT/bench-$m-$round.err | head -3 | tee -a $LOG
  done
done
