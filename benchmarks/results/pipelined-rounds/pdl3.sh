#!/usr/bin/env bash
# Probe: the round's warp/verify kernels plain against dependent in one process (.gpu/pdlprobe.py)
# on a briefly trained bench pair.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
P=.pairs/bench; s=$SECONDS
[ -f $P/pair.toml ] || PYTHONPATH=$PWD/src timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes ${MINUTES:-0.6} > "$OUT/pair.txt" 2>&1
echo "make_pair $((SECONDS - s)) s" | tee -a "$LOG"
PYTHONPATH=$PWD/src timeout $((580 - SECONDS)) python3 .gpu/pdlprobe.py $P/pair.toml $OUT 2>&1 | grep -v USDT | tee -a "$LOG" | head -c 20000
