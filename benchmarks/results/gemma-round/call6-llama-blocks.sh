#!/usr/bin/env bash
# Experiment: 32-key blocks and splits for Llama's 64- and 128-wide heads (1B and 8B steps).
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name --format=csv,noheader | tee $LOG
for r in 1 2; do for tree in old new; do
  root=$PWD; [ $tree = new ] && root=$PWD/.gpu/exp
  PYTHONPATH=$root/src timeout 60 python3 benchmarks/bench_kernels.py steps --model 1b --variants graph-draft > /tmp/s.txt 2>&1
  echo "1b $tree$r rc=$? at $SECONDS: $(grep -E '^\| graph-' /tmp/s.txt | tail -1)" | tee -a $LOG
done; done
for tree in old new; do
  root=$PWD; [ $tree = new ] && root=$PWD/.gpu/exp
  PYTHONPATH=$root/src timeout 80 python3 benchmarks/bench_kernels.py steps --model 8b --variants graph-dependent > /tmp/e.txt 2>&1
  echo "8b $tree rc=$? at $SECONDS: $(grep -E '^\| graph-' /tmp/e.txt | tail -1)" | tee -a $LOG
done
