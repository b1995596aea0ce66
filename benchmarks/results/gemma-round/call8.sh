#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name --format=csv,noheader | tee $LOG
PYTHONPATH=$PWD/src timeout 300 python3 .gpu/target_prof.py $OUT 2>&1 | grep -v Warn | tee -a $LOG
