#!/usr/bin/env bash
# The bench pair end to end (draft model, k = 4): without compile, with compile (this tree: the
# step kernels as operators, dependent launch on) and with compile before the change
# (.gpu/old_src: a copy of src/ at 293deec), alternating. Trains the pair first (about 195 s).
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG"
P=.pairs/bench; s=$SECONDS
[ -f $P/pair.toml ] || PYTHONPATH=$PWD/src timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes 2.5 > "$OUT/pair.txt" 2>&1
echo "make_pair $((SECONDS - s)) s" | tee -a "$LOG"
B="python3 -m specgen.cli.main bench -p $P/pair.toml --proposer draft --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 --baseline target-only --no-fp32-check --format json"
run() {  # name tree [options]
  local name=$1 tree=$2; shift 2; local src=$PWD/src; [ $tree = old ] && src=$PWD/.gpu/old_src/src
  local left=$((590 - SECONDS)); [ $left -lt 30 ] && { echo "no time for $name" | tee -a "$LOG"; return; }
  PYTHONPATH=$src timeout $(( left < 150 ? left : 150 )) $B "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc=$? at $SECONDS" | tee -a "$LOG"
}
run on new; run compile new --compile; run compile_old old --compile
run on2 new; run compile2 new --compile; run compile_old2 old --compile
python3 benchmarks/bench_summary.py $(for n in on compile compile_old on2 compile2 compile_old2; do echo "$OUT/$n.json"; done) | tee -a "$LOG"
