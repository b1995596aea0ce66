#!/usr/bin/env bash
# Issue 22, Gemma 2's soft-capping in the attention kernel (branch gemma). One H200, under 400 s:
#   1. check: the CUDA runs of the soft-capping and Gemma tests (kernel against reference, runners
#      against the plain model, greedy speculative against target-only, bf16 row invariance at
#      the Gemma-2-9B widths);
#   2. measure: Gemma 2 9B + 2B with random bf16 weights (benchmarks/family_pairs.py), `specgen
#      bench` k = 4 against target-only with the attention kernel (auto), then, time permitting,
#      the same bench with attention = "sdpa" (Gemma 2's own eager attention: the old path).
# Logs to $OUT. A CPU dry run of the plumbing: SCALE=tiny DEVICE=cpu SKIP_TESTS=1 bash .gpu/gemma.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"
SCALE=${SCALE:-full}; DEVICE=${DEVICE:-cuda}
DEADLINE=$((SECONDS + ${BUDGET:-395}))
left() { echo $((DEADLINE - SECONDS)); }
cap() { local want=$1 l; l=$(left); l=$(( l < 1 ? 1 : l )); echo $(( l < want ? l : want )); }  # within the budget

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
  python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'triton', triton.__version__)"; } | tee "$OUT/device.txt"

if [ -z "${SKIP_TESTS:-}" ]; then
  s=$SECONDS
  timeout "$(cap 170)" python3 -m pytest -q -x -p no:cacheprovider tests/test_attention.py tests/test_families.py \
    -k "gemma or softcap" --durations=8 > "$OUT/pytest.txt" 2>&1
  echo "pytest rc=$? $((SECONDS - s)) s"; tail -14 "$OUT/pytest.txt"
  s=$SECONDS
  timeout "$(cap 90)" python3 -m pytest -q -p no:cacheprovider tests/test_exact.py \
    -k "attention_tokens or gemma2 or on_gpu" > "$OUT/pytest_exact.txt" 2>&1
  echo "pytest exact rc=$? $((SECONDS - s)) s"; tail -4 "$OUT/pytest_exact.txt"
fi

s=$SECONDS
rm -rf /tmp/fp
timeout "$(cap 110)" python3 benchmarks/family_pairs.py --family gemma-2 --scale "$SCALE" --out /tmp/fp \
  --device "$DEVICE" --prompts 2 > "$OUT/build.log" 2>&1
echo "build rc=$? $((SECONDS - s)) s"; du -sh /tmp/fp/gemma-2/target /tmp/fp/gemma-2/draft 2>/dev/null
P=/tmp/fp/gemma-2
[ -f "$P/pair.toml" ] || { echo "no pair built"; tail -5 "$OUT/build.log"; exit 1; }
printf '\n[kernels]\nattention = "sdpa"\n' | cat "$P/pair.toml" - > "$P/sdpa.toml"

bench() {  # bench <label> <profile>
  local s=$SECONDS
  timeout "$(cap 100)" python3 -m specgen.cli.main bench -p "$2" --k 4 -t 0 --num-prompts 2 -n 32 \
    --baseline target-only --no-fp32-check --format json > "$OUT/bench_$1.json" 2> "$OUT/bench_$1.err"
  echo "bench $1 rc=$? $((SECONDS - s)) s"
  python3 - "$OUT/bench_$1.json" <<'EOF' || tail -5 "$OUT/bench_$1.err"
import json, sys
d = json.load(open(sys.argv[1]))
resolved = d["environment"]["resolved"]
kernels = {role: k["attention"] for role, k in resolved.get("kernels", {}).items()} or resolved["backend"]
print(f"  {d['environment']['device_name']}, start-up {d['startup_seconds']:.1f} s, attention {kernels}")
for b in d["baselines"]:
    tps = b["tokens_per_second"]["median"]
    print(f"  {b['method']}: {tps:.1f} tok/s ({1e3 / tps:.2f} ms/token), decode "
          f"{b['decode_tokens_per_second']['median']:.1f} tok/s, peak {(b['peak_gpu_memory_bytes'] or 0) / 2**30:.1f} GiB")
for r in d["results"]:
    ms = r["round_ms"]
    same = (r.get("greedy_agreement") or {}).get("target-only", {}).get("identical_fraction")
    print(f"  k={r['k']}: {r['tokens_per_second']['median']:.1f} tok/s, round ms draft {ms['draft']:.2f} / verify "
          f"{ms['verify']:.2f} / sample {ms['sample']:.2f} / other {ms['other']:.2f} = {ms['total']:.2f}, "
          f"mean accepted length {r['mean_accepted_length']:.2f}, identical to target-only {same}")
EOF
}
bench kernel "$P/pair.toml"
if [ "$(left)" -gt 60 ]; then bench sdpa "$P/sdpa.toml"; else echo "bench sdpa skipped: $(left) s left"; fi
rm -rf /tmp/fp
echo "total $((SECONDS)) s"
