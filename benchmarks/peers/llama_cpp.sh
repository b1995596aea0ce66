#!/usr/bin/env bash
# llama.cpp's speculative decoding beside specgen's, on one GPU, same pair, same prompts.
#
#   bash benchmarks/peers/fetch_llama_cpp.sh            # here, once: the stripped source in .peers/
#   bash benchmarks/peers/llama_cpp.sh build            # on the GPU machine, carry .peers (about 8 min)
#   bash benchmarks/peers/llama_cpp.sh run [PAIR]       # right after, on the same warm machine
#
# build: llama.cpp's CUDA build for Hopper only (sm_90), only the programs used here, into
# .peers/build (kept while the machine stays warm). run: trains the bench pair unless PAIR exists,
# converts both models to GGUF in bf16 with llama.cpp's converter (benchmarks/peers/convert_pair.py),
# checks that llama.cpp tokenizes every prompt as specgen does, then times llama.cpp (target-only
# greedy, speculative greedy and at t 0.8 / top-p 0.95, draft lengths 2-8, every layer on the GPU,
# flash attention, CUDA graphs as llama.cpp enables them by default) and `specgen bench` on the same
# 10 prompts x 128 tokens. Output under $OUT (default benchmarks/results/llama-cpp).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-benchmarks/results/llama-cpp}
mkdir -p "$OUT"
SRC=.peers/llama.cpp
BUILD=.peers/build
LOG=$OUT/log.txt
case "${1:-}" in
build)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOG"
  cmake -S $SRC -B $BUILD -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/cmake.log 2>&1
  echo "== configure rc=$? at $SECONDS s" | tee -a "$LOG"
  cmake --build $BUILD --target llama-tokenize llama-simple llama-speculative-simple -j "$(nproc)" > /tmp/build.log 2>&1
  echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"; tail -3 /tmp/build.log | tee -a "$LOG"
  ;;
run)
  PAIR=${2:-/tmp/bench}
  if [ ! -d "$PAIR/target" ]; then
    timeout 330 python3 benchmarks/make_pair.py --preset bench --seed 0 --out "$PAIR" --minutes 4.4 --device cuda > /tmp/pair.log 2>&1
    echo "== pair rc=$? at $SECONDS s" | tee -a "$LOG"
  fi
  for role in target draft; do
    python3 benchmarks/peers/convert_pair.py $SRC "$PAIR/$role" "$PAIR/$role.gguf" --outtype bf16 > /tmp/convert.log 2>&1
    echo "== convert $role rc=$? at $SECONDS s" | tee -a "$LOG"
  done
  python3 benchmarks/peers/llama_cpp.py tokens $BUILD/bin "$PAIR" --num-prompts 64 | tail -3 | tee -a "$LOG"
  python3 benchmarks/peers/llama_cpp.py run $BUILD/bin "$PAIR" --gpu --k 2,4,6,8 -t 0,0.8 -n 128 --num-prompts 10 \
    > "$OUT/llama-cpp.json" 2> /tmp/llama-cpp.err
  echo "== llama.cpp rc=$? at $SECONDS s" | tee -a "$LOG"
  python3 -c "import json, sys; [print(k, v) for k, v in json.load(open(sys.argv[1]))['summary'].items()]" \
    "$OUT/llama-cpp.json" | tee -a "$LOG"
  python3 -m specgen.cli.main bench -p "$PAIR/pair.toml" --k 2,3,4,5,6 -t 0,0.8 --top-p 0.95 --coupling rejection \
    --num-prompts 10 -n 128 --baseline target-only --format json > "$OUT/specgen.json" 2> /tmp/specgen.err
  echo "== specgen rc=$? at $SECONDS s" | tee -a "$LOG"; python3 benchmarks/bench_summary.py "$OUT/specgen.json" | tee -a "$LOG"
  python3 -m specgen.cli.main generate -p "$PAIR/pair.toml" --prompts-file "$PAIR/prompts.jsonl" -n 128 --ignore-eos \
    --format jsonl 2>/dev/null | head -10 > /tmp/specgen-greedy.jsonl
  python3 - "$OUT/llama-cpp.json" /tmp/specgen-greedy.jsonl <<'PY' | tee -a "$LOG"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]["target-only"]
ours = [json.loads(line) for line in open(sys.argv[2])]
same = sum(r["text"].startswith(o["prompt"] + o["text"]) or r["text"].endswith(o["text"]) for r, o in zip(runs, ours))
print(f"greedy target-only text: llama.cpp and specgen agree on {same} of {len(ours)} prompts")
PY
  ;;
*)
  echo "usage: $0 build | run [PAIR]" >&2; exit 2 ;;
esac
