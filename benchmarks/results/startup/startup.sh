#!/usr/bin/env bash
# Issue 22, start-up of the Llama 3.1 8B + 3.2 1B random-weight pair on one GPU. Logs under $OUT.
#  1. build the pair (benchmarks/family_pairs.py --scale full), which leaves it in the page cache;
#  2. the target's load alone, in fresh processes: the old way (from_pretrained on the CPU, then
#     .to(cuda)) against the placement specgen now asks for (device_map={"": cuda:0});
#  3. `specgen generate` three times (the first also JIT-compiles specgen's Triton kernels into
#     Triton's own cache): load, setup (capture), time to first token, decode rate, wall time;
#  4. `specgen generate --compile` twice over one fresh compile cache folder (first, second start),
#     with the cache's files counted after each (a second start that recompiles writes new graphs).
# CPU dry run of the plumbing: SCALE=tiny DEVICE=cpu bash .gpu/startup.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src SPECGEN_DEBUG=1
OUT=${OUT:-.out}; mkdir -p "$OUT"
SCALE=${SCALE:-full}; DEVICE=${DEVICE:-cuda}; BUDGET=${BUDGET:-530}
FP=/tmp/fp; PAIR=$FP/llama-3.1; CC=/tmp/specgen-cc
PROMPT="def quicksort(items): the quick brown fox jumps over the lazy dog and keeps running"
SPECGEN="python3 -m specgen.cli.main"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
left() { echo $((BUDGET - SECONDS)); }
files() { find "$1" -type f 2>/dev/null | wc -l; }

summary() {  # one line from generate's JSON record
  python3 - "$1" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"(no record: {exc})"); sys.exit()
s, st = r["startup"], r["stats"]
print(f"load {s['load_seconds']:.2f} s, setup {s['setup_seconds']:.2f} s, TTFT {st['time_to_first_token_seconds'] * 1e3:.0f} ms, "
      f"decode {st['decode_tokens_per_second']:.1f} tok/s ({st['generated_tokens']} tokens), in-process {r['wall_seconds']:.1f} s")
EOF
}

generate() {  # label timeout profile [options]
  local label=$1 limit=$2 profile=$3; shift 3
  local s; s=$(now)
  timeout "$limit" $SPECGEN generate -p "$profile" --device "$DEVICE" -n 32 --ignore-eos --format json -v "$@" \
    "$PROMPT" > "$OUT/$label.json" 2> "$OUT/$label.err"
  local rc=$?
  echo "$label: rc=$rc wall $(since "$s") s; $(summary "$OUT/$label.json")"
  grep -iE "warning|error|fallback" "$OUT/$label.err" | grep -v "^fallbacks: \[\]" | head -5 | cut -c1-300
}

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
id; echo "USER=${USER:-} HOME=${HOME:-} TMPDIR=${TMPDIR:-}"
python3 - <<'EOF'
import getpass, tempfile
import torch, transformers, triton
import torch._functorch.config as functorch
import torch._inductor.config as inductor
print(f"torch {torch.__version__}, transformers {transformers.__version__}, triton {triton.__version__}; "
      f"user {getpass.getuser()}, temp {tempfile.gettempdir()}")
print(f"inductor defaults: fx_graph_cache {inductor.fx_graph_cache}, bundle_triton_into_fx_graph_cache "
      f"{inductor.bundle_triton_into_fx_graph_cache}, autotune_local_cache {inductor.autotune_local_cache}, "
      f"aot autograd cache {functorch.enable_autograd_cache}")
EOF
ls -ld /tmp/torchinductor_* ~/.triton/cache 2>/dev/null

echo "== build ($SCALE)"
s=$(now)
timeout 150 python3 benchmarks/family_pairs.py --family llama-3.1 --scale "$SCALE" --out $FP --device "$DEVICE" \
  --prompts 2 > "$OUT/build.log" 2>&1
echo "build rc=$? $(since "$s") s; $(du -sh $PAIR/target $PAIR/draft | tr '\n' ' ')"
cat $PAIR/*/*.safetensors > /dev/null  # warm page cache (the build just wrote them)

echo "== target load alone, fresh processes: moved (.to(device) after a CPU load, as before), placed (load_model now)"
for how in moved placed; do
  timeout 90 python3 - "$PAIR/target" "$DEVICE" "$how" <<'EOF' 2>> "$OUT/load.err"
import sys, time
folder, device, how = sys.argv[1:]
t0 = time.perf_counter()
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401 (modeling imports, outside the load's time)
from transformers.utils import logging
from specgen.core.models import load_model
from specgen.core.settings import ModelSpec
logging.disable_progress_bar()
torch.zeros(1, device=device)  # the CUDA context, outside the load's time too
t1 = time.perf_counter()
if how == "moved":
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    t2 = time.perf_counter()
    model = model.to(device)
else:  # what specgen now does: core/models.py's load_model
    model = load_model(ModelSpec(path=folder, dtype="bfloat16", device=device), modeling="transformers")
    t2 = time.perf_counter()
if device != "cpu":
    torch.cuda.synchronize()
t3 = time.perf_counter()
gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
print(f"{how}: imports + context {t1 - t0:.2f} s, from_pretrained {t2 - t1:.2f} s, .to {t3 - t2:.2f} s, "
      f"load {t3 - t1:.2f} s for {gib:.3f} GiB = {gib / (t3 - t1):.2f} GiB/s")
EOF
done

echo "== generate, no compile, three starts"
echo "triton cache files before: $(files ~/.triton/cache)"
for run in 1 2 3; do
  generate "plain$run" 120 $PAIR/pair.toml
  [ "$run" = 1 ] && echo "triton cache files after the first: $(files ~/.triton/cache)"
done
grep -E "^(backend|device|modeling|kernels\.)" "$OUT/plain1.err" | head -12

echo "== generate --compile, cache folder $CC: first start, second start"
rm -rf "$CC"
sed "/^\[speculation\]/a compile_cache = \"$CC\"" $PAIR/pair.toml > $PAIR/pair-cc.toml
inductor_tmp=/tmp/torchinductor_$(python3 -c "import getpass; print(getpass.getuser())")
echo "system temp inductor folder $inductor_tmp: $(files "$inductor_tmp") files before"
cold=$(( $(left) - 130 )); [ $cold -gt 300 ] && cold=300
generate compile1 "$cold" $PAIR/pair-cc.toml --compile
echo "cache after the first start: $(files "$CC") files, $(files "$CC/fxgraph") FX graph, $(files "$CC/aotautograd") AOT autograd, $(files "$CC/triton") Triton; $inductor_tmp: $(files "$inductor_tmp")"
find "$CC" -type f | sort > "$OUT/cache1.txt"
warm=$(( $(left) - 5 )); [ $warm -gt 200 ] && warm=200
generate compile2 "$warm" $PAIR/pair-cc.toml --compile
find "$CC" -type f | sort > "$OUT/cache2.txt"
echo "cache after the second start: $(files "$CC") files; new in the second start: $(comm -13 "$OUT/cache1.txt" "$OUT/cache2.txt" | wc -l)"
comm -13 "$OUT/cache1.txt" "$OUT/cache2.txt" | sed "s|$CC/||" | head -8
echo "== done in ${SECONDS} s"
