#!/usr/bin/env bash
# Issue 21 after the head moved onto the step kernels. Logs to $OUT.
#   bash .gpu/eagle2.sh a   train the bench pair, then train-head on it (timed)
#   bash .gpu/eagle2.sh b   (same warm machine) CUDA tests; benches: head on kernels vs torch, k sweep, compile
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-.out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
P=.pairs/bench
B="python3 -m specgen.cli.main bench"
COMMON="-t 0,0.8 --top-p 0.95 --coupling rejection --num-prompts 10 -n 128 --no-fp32-check --format json"
case "${1:-a}" in
a)
  s=$SECONDS
  [ -f $P/pair.toml ] || timeout 300 python3 benchmarks/make_pair.py --preset bench --seed 0 --out $P --minutes 2.5 2>&1 | tail -2
  echo "make_pair $((SECONDS - s)) s"; cp $P/report.json "$OUT/pair_report.json" 2>/dev/null
  s=$SECONDS
  timeout 290 python3 -m specgen.cli.main train-head -p $P/pair.toml -o $P/head --minutes "${HEAD_MINUTES:-4}" --format json \
    > "$OUT/head_report.json" 2> "$OUT/head.err"
  echo "train-head rc=$? wall=$((SECONDS - s)) s"; tail -2 "$OUT/head.err"
  [ -n "${TESTS:-}" ] && timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_rewire_head.py 2>&1 | tail -2
  [ -n "${TESTS:-}" ] && timeout 110 python3 -m pytest -q -x -p no:cacheprovider -m cuda tests/test_heads.py tests/test_kernels.py 2>&1 | tail -2
  ;;
b)
  cp $P/head/profile.toml $P/head/torch.toml && printf '\n[kernels]\nhead = "torch"\n' >> $P/head/torch.toml
  grep -q '^\[kernels\]' $P/head/profile.toml && echo "WARNING: profile already has [kernels]"
  timeout 100 $B -p $P/head/torch.toml --proposer eagle --k 5,7 $COMMON > "$OUT/bench_head_torch.json" 2> "$OUT/bench_head_torch.err"
  echo "bench head=torch rc=$?"; grep -E "eagle|heads" "$OUT/bench_head_torch.err" | head -8 | cut -c1-170
  timeout 150 $B -p $P/head/profile.toml --proposer draft,eagle --k 4,5,6,7,8 $COMMON > "$OUT/bench_nocompile.json" 2> "$OUT/bench_nocompile.err"
  echo "bench nocompile rc=$?"; grep -E "recommend|best" "$OUT/bench_nocompile.err" | cut -c1-170
  timeout 240 $B -p $P/head/profile.toml --proposer draft,eagle --k ${KS:-6,7} --compile $COMMON > "$OUT/bench_compile.json" 2> "$OUT/bench_compile.err"
  echo "bench compile rc=$?"; grep -E "recommend|best" "$OUT/bench_compile.err" | cut -c1-170
  OUT="$OUT" python3 - <<'PY'
import json, os
for name in ("bench_head_torch", "bench_nocompile", "bench_compile"):
    try:
        data = json.load(open(f"{os.environ['OUT']}/{name}.json"))
    except Exception as exc:
        print(name, "unreadable", exc); continue
    print("==", name, data["environment"]["resolved"].get("heads"), data["environment"]["resolved"].get("fallbacks"))
    for r in data["results"]:
        med = lambda key: (r.get(key) or {}).get("median")
        print(r["proposer"], r["k"], r["temperature"], "tok/s %.0f decode %.0f ttft_ms %.2f mal %.2f x %.2f" % (
            med("tokens_per_second"), med("decode_tokens_per_second"), 1e3 * med("time_to_first_token_seconds"),
            r["mean_accepted_length"], r["speedup"]["target-only"]["median"]),
            "round_ms", {k: round(v, 3) for k, v in r["round_ms"].items()})
    print("recommendation", json.dumps(data.get("recommendation_per_proposer"))[:400])
PY
  ;;
esac
