#!/usr/bin/env bash
# Issue 21's GPU goals. Logs to $OUT.
#   bash .gpu/eagle.sh a   train the bench pair, train-head on it (timed), bench draft vs eagle without compile
#   bash .gpu/eagle.sh b   (same warm machine) CUDA tests, then the compiled bench at the recommended k
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
P=.pairs/bench
case "${1:-a}" in
a)
  [ -f $P/pair.toml ] || timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes 2.5 2>&1 | tail -2
  cp $P/report.json "$OUT/pair_report.json" 2>/dev/null
  s=$SECONDS
  timeout 300 python3 -m specgen.cli.main train-head -p $P/pair.toml -o $P/head --minutes "${HEAD_MINUTES:-4}" --format json \
    > "$OUT/head_report.json" 2> "$OUT/head.err"
  echo "train-head rc=$? wall=$((SECONDS - s)) s"; tail -3 "$OUT/head.err"
  OUT="$OUT" python3 -c "import json,os; r=json.load(open(os.environ['OUT']+'/head_report.json')); print(json.dumps(r)[:1500])"
  ;;
b)
  timeout 330 python3 -m specgen.cli.main bench -p $P/head/profile.toml --proposer draft,eagle --k ${KS:-5} -t 0,0.8 --top-p 0.95 \
    --coupling rejection --num-prompts 10 -n 128 --compile --no-fp32-check --format json > "$OUT/bench_compile.json" 2> "$OUT/bench_compile.err"
  echo "bench compile rc=$?"; grep -E "^ *(0|0.8) |recommended|best k" "$OUT/bench_compile.err" | cut -c1-160
  timeout 120 python3 -m specgen.cli.main bench -p $P/head/profile.toml --proposer draft,eagle --k 4,5 -t 0,0.8 --top-p 0.95 \
    --coupling rejection --num-prompts 10 -n 128 --no-fp32-check --format json > "$OUT/bench_nocompile.json" 2> "$OUT/bench_nocompile.err"
  echo "bench rc=$?"; grep -E "recommended|best k" "$OUT/bench_nocompile.err" | cut -c1-160
  timeout 100 python3 -m pytest -q -x -p no:cacheprovider -m cuda tests/test_heads.py tests/test_exact.py tests/test_norm.py \
    2>&1 | tail -3 | tee "$OUT/pytest.txt"
  ;;
esac
