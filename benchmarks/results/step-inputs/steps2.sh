#!/usr/bin/env bash
# Issue 22: the step's inputs (no mask, rotary tables, positions) and the linear table tuned for
# draft shapes, before/after in one call. Logs to $OUT.
#   .gpu/before: HEAD's src (the profiler-enabled bench_kernels.py in both)
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-.out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
steps() {  # label dir model [extra]
  local label=$1 dir=$2 m=$3; shift 3
  (cd "$dir" && PYTHONPATH=$PWD/src timeout 150 python3 benchmarks/bench_kernels.py steps --model "$m" --variants graph-norm "$@" \
     --out "$OUT/$label-$m.json" > "$OUT/$label-$m.txt" 2>&1)
  echo "== $label $m rc=$?"; grep -E "^\| graph|floor " "$OUT/$label-$m.txt" | cut -c1-160
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(' kernels/step', r.get('kernels_per_step'), 'kernel ms', round(r.get('kernel_ms_per_step',0),3))" "$OUT/$label-$m.json" 2>/dev/null
}
MODELS=${MODELS:-bench-draft bench-target 1b 8b}
OUTABS=$(cd "$OUT" && pwd); OUT=$OUTABS
for m in $MODELS; do steps before .gpu/before $m; steps inputs . $m; done
s=$SECONDS
PYTHONPATH=$PWD/src timeout ${TT:-330} python3 benchmarks/bench_kernels.py table --models llama-3.1,bench,qwen2.5,qwen3,gemma-2 --table "$OUT/linear.json" --out "$OUT/table.json" > "$OUT/table.txt" 2>&1
echo "== table rc=$? $((SECONDS - s)) s"; grep -E "^\|" "$OUT/table.txt" | cut -c1-200
mkdir -p "${XDG_CACHE_HOME:-$HOME/.cache}/specgen/kernels" && cp "$OUT/linear.json" "${XDG_CACHE_HOME:-$HOME/.cache}/specgen/kernels/linear.json"
[ -n "${TUNED:-}" ] && for m in $MODELS; do steps tuned . $m --profile; done
