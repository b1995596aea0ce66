#!/usr/bin/env bash
# llama.cpp's speculative decoding beside specgen's, on one GPU, same pair, same prompts.
#
#   bash benchmarks/peers/fetch_llama_cpp.sh            # here, once: the stripped source in .peers/
#   bash benchmarks/peers/llama_cpp.sh all [PAIR]       # on the GPU machine, carrying .peers: build while
#                                                       # the pair trains, then run
#   bash benchmarks/peers/llama_cpp.sh build            # only the build, into .peers/build
#   bash benchmarks/peers/llama_cpp.sh run [PAIR]       # only the run, with .peers/build/bin built
#   bash benchmarks/peers/llama_cpp.sh 8b [PAIR]        # on the GPU machine, carrying .peers: the Llama 3.1 8B +
#                                                       # 3.2 1B random-weight shapes, made while llama.cpp builds
#
# build: llama.cpp's CUDA build for Hopper only (sm_90), only the programs used here. The GPU
# machine's CUDA has nvcc but maybe no cuBLAS: its headers and libraries come from PyTorch's
# nvidia-cublas wheel (CUBLAS_DIR, default found under python3's site-packages; elsewhere pip
# downloads the wheel), and the link takes a stub of the driver's libcuda (the real one is loaded
# at run time). Needs no GPU: it also builds on a machine with nvcc alone, slowly.
# run: trains the bench pair unless PAIR exists, converts both models to GGUF in bf16 with
# llama.cpp's converter (benchmarks/peers/convert_pair.py), checks that llama.cpp tokenizes every
# prompt as specgen does, times `specgen bench`, then llama.cpp (target-only greedy, speculative
# greedy and at t 0.8 / top-p 0.95 over draft lengths, every layer on the GPU, flash attention,
# CUDA graphs as llama.cpp enables them by default) on the same 10 prompts x 128 tokens, and
# compares the greedy texts. Output under $OUT (default benchmarks/results/llama-cpp).
# 8b: one call of at most 600 s. The build (niced, as in `all`) runs while the GPU makes the pair
# (benchmarks/family_pairs.py --family llama-3.1 --scale full, bf16, into PAIR unless it exists:
# default /tmp/fam/llama-3.1, a folder named llama-3.1 as family_pairs.py names it) and both
# models convert to GGUF bf16 at once; then one prompt's tokens are
# compared, `specgen bench` times the draft model at k = 4 greedy against target-only, and llama.cpp
# times its target-only step (llama-bench) and its greedy rounds (llama-speculative-simple, k = 4,
# then 2 and 8 until DEADLINE), 2 prompts x 64 tokens, past end-of-text as specgen bench goes.
# Random weights accept nothing: what counts is a step's and a round's cost, printed at the end as
# one table against the floor of the bytes each streams. Expected on 16 cores: pair ~40 s; target
# conversion ~100-150 s (the draft's ~25 s beside it); build ~300 s (ends the wait); tokens ~5 s;
# specgen bench ~40-60 s (Triton compiles on a bare machine); llama.cpp ~15 s of llama-bench and
# ~15 s a draft length: ~430 s in all. Output: $OUT/log-8b.txt, specgen-8b.json, llama-cpp-8b.json
# and 8b-logs/ (build, pair, conversions, both engines' stderr).
#
# Settings (environment): LLAMA_CPP_SRC (.peers/llama.cpp), LLAMA_CPP_BUILD (.peers/build),
# PAIR_MINUTES (4.4: the pair's training time), DEADLINE (540: seconds of the whole script after
# which llama.cpp's sweep starts no new configuration), NEW_TOKENS (128), CUBLAS_DIR, BUILD_LIMIT
# (3600, 8b: 420: seconds of the whole script after which the build is stopped).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=${OUT:-benchmarks/results/llama-cpp}
mkdir -p "$OUT"
SRC=${LLAMA_CPP_SRC:-.peers/llama.cpp}
BUILD=${LLAMA_CPP_BUILD:-.peers/build}
BIN=$BUILD/bin
MODE=${1:-}
if [ "$MODE" = 8b ]; then LOG=$OUT/log-8b.txt PAIR=${2:-/tmp/fam/llama-3.1}; else LOG=$OUT/log.txt PAIR=${2:-/tmp/bench}; fi
DEADLINE=${DEADLINE:-540}
N=${NEW_TOKENS:-128}
SITE=$(python3 -c "import site; print(site.getsitepackages()[0])")

budget() {  # budget END [MOST]: seconds from now to second END of the script, at least 1 (timeout 0 never ends)
  local n=$(($1 - SECONDS)) most=${2:-$1}
  n=$((n < most ? n : most))
  echo $((n > 1 ? n : 1))
}

build() {  # log to /tmp/build.log; exit status of the build
  local cublas=${CUBLAS_DIR:-$SITE/nvidia/cu13} deps
  deps=$(mktemp -d)
  if [ ! -f "$cublas/include/cublas_v2.h" ] && header=$(find / -xdev -name cublas_v2.h 2>/dev/null | head -1) && [ -n "$header" ]; then
    cublas=$(dirname "$(dirname "$header")")
  fi
  if [ ! -f "$cublas/include/cublas_v2.h" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_27_x86_64 \
      -d "$deps" nvidia-cublas==13.0.0.19 && (cd "$deps" && python3 -m zipfile -e nvidia_cublas-*.whl x) || return 1
    cublas=$deps/x/nvidia/cu13
  fi
  # the CUDA driver's entry points that ggml-cuda calls, for the linker only
  printf 'void %s(void) {}\n' cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve \
    cuMemCreate cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap > "$deps/cuda.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$deps/libcuda.so" "$deps/cuda.c" && ln -s libcuda.so "$deps/libcuda.so.1"
  cmake -G Ninja -S $SRC -B $BUILD -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
    -DCUDA_cuda_driver_LIBRARY="$deps/libcuda.so" -DCUDA_cublas_LIBRARY="$(ls "$cublas"/lib*/libcublas.so*[0-9] | head -1)" \
    -DCUDA_cublasLt_LIBRARY="$(ls "$cublas"/lib*/libcublasLt.so*[0-9] | head -1)" -DCMAKE_CUDA_FLAGS="-I$cublas/include" \
    > /tmp/build.log 2>&1 || return 1
  timeout "$(budget "${BUILD_LIMIT:-3600}")" nice -n 10 cmake --build $BUILD -j "$(nproc)" \
    --target llama-tokenize llama-simple llama-speculative-simple llama-bench >> /tmp/build.log 2>&1
}

pair() {
  timeout 330 python3 benchmarks/make_pair.py --preset bench --seed 0 --out "$PAIR" --minutes "${PAIR_MINUTES:-4.4}" \
    --device cuda > /tmp/pair.log 2>&1
  echo "== pair rc=$? at $SECONDS s" | tee -a "$LOG"; tail -2 /tmp/pair.log | cut -c1-200 | tee -a "$LOG"
}

family() {  # the Llama 3.1 8B + 3.2 1B shapes, random weights in bf16, made on the GPU into PAIR
  timeout 150 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --prompts 2 --out "$(dirname "$PAIR")" \
    --device cuda > /tmp/family.log 2>&1
  echo "== 8B pair rc=$? at $SECONDS s" | tee -a "$LOG"; tail -2 /tmp/family.log | cut -c1-200 | tee -a "$LOG"
}

convert() {  # both models at once: the 8B target's conversion is CPU-bound on one core for minutes
  local role pids=()
  for role in target draft; do
    ( timeout 330 python3 benchmarks/peers/convert_pair.py $SRC "$PAIR/$role" "$PAIR/$role.gguf" --outtype bf16 \
        > /tmp/convert-$role.log 2>&1
      echo "== convert $role rc=$? at $SECONDS s" | tee -a "$LOG" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
}

built() {  # after the background build: its outcome into the log
  cat /tmp/build.done | tee -a "$LOG"; grep -E "error|Error" /tmp/build.log | head -5 | tee -a "$LOG"; tail -2 /tmp/build.log | tee -a "$LOG"
}

libraries() {  # llama.cpp's programs find their own libraries and PyTorch's CUDA ones
  LD_LIBRARY_PATH=$BIN:$(python3 -c "import glob, sys; print(':'.join(sorted(glob.glob(sys.argv[1] + '/nvidia/*/lib'))))" "$SITE"):${LD_LIBRARY_PATH:-}
  export LD_LIBRARY_PATH
  missing=$(ldd $BIN/llama-speculative-simple $BIN/llama-bench | grep "not found" | sort -u)
  [ -z "$missing" ] || echo "== llama.cpp's programs miss libraries: $missing" | tee -a "$LOG"
}

run() {
  libraries
  python3 benchmarks/peers/llama_cpp.py tokens $BIN "$PAIR" --num-prompts 64 2>&1 | tail -3 | tee -a "$LOG"
  echo "== tokens at $SECONDS s" | tee -a "$LOG"
  timeout 150 python3 -m specgen.cli.main bench -p "$PAIR/pair.toml" --k 3,4,5,6 -t 0,0.8 --top-p 0.95 \
    --coupling rejection --num-prompts 10 -n $N --baseline target-only --no-fp32-check --format json \
    > "$OUT/specgen.json" 2> /tmp/specgen.err
  echo "== specgen bench rc=$? at $SECONDS s" | tee -a "$LOG"; tail -3 /tmp/specgen.err | cut -c1-300 >> "$LOG"
  python3 benchmarks/bench_summary.py "$OUT/specgen.json" | tee -a "$LOG"
  timeout 60 python3 -m specgen.cli.main generate -p "$PAIR/pair.toml" --prompts-file "$PAIR/prompts.jsonl" -n $N \
    --ignore-eos --proposer none -t 0 --format jsonl 2>/dev/null | head -10 > /tmp/specgen-greedy.jsonl
  echo "== specgen greedy texts: $(wc -l < /tmp/specgen-greedy.jsonl) at $SECONDS s" | tee -a "$LOG"
  timeout $((DEADLINE + 50 - SECONDS)) python3 benchmarks/peers/llama_cpp.py run $BIN "$PAIR" --gpu --k 4,6,8,2 -t 0,0.8 \
    -n $N --num-prompts 10 --deadline $((DEADLINE - SECONDS)) --out "$OUT/llama-cpp.json" 2> /tmp/llama-cpp.err
  echo "== llama.cpp rc=$? at $SECONDS s" | tee -a "$LOG"; grep -v "^speculative\|^target" /tmp/llama-cpp.err | tail -3 >> "$LOG"
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print('llama-bench', {k: v for k, v in (d['llama_bench'] or {}).items() if k != 'samples_ts'}); [print(k, v) for k, v in d['summary'].items()]; print('skipped', d.get('skipped'), 'errors', d.get('errors'))" \
    "$OUT/llama-cpp.json" | tee -a "$LOG"
  python3 benchmarks/peers/llama_cpp.py compare "$PAIR" "$OUT/llama-cpp.json" /tmp/specgen-greedy.jsonl | tee -a "$LOG"
}

run_8b() {  # random weights: one prompt's tokens are enough to show the same tokenizer
  libraries
  timeout 60 python3 benchmarks/peers/llama_cpp.py tokens $BIN "$PAIR" --num-prompts 1 2>&1 | tail -2 | tee -a "$LOG"
  echo "== tokens at $SECONDS s" | tee -a "$LOG"
  timeout "$(budget $((DEADLINE - 60)) 150)" python3 -m specgen.cli.main bench -p "$PAIR/pair.toml" --proposer draft --k 4 \
    -t 0 --num-prompts 2 -n 64 --baseline target-only --no-fp32-check --format json > "$OUT/specgen-8b.json" 2> /tmp/specgen-8b.err
  echo "== specgen bench rc=$? at $SECONDS s" | tee -a "$LOG"; tail -3 /tmp/specgen-8b.err | cut -c1-300 >> "$LOG"
  python3 benchmarks/bench_summary.py "$OUT/specgen-8b.json" | tee -a "$LOG"
  timeout "$(budget $((DEADLINE + 45)))" python3 benchmarks/peers/llama_cpp.py run $BIN "$PAIR" --gpu --k 4,2,8 -t 0 -n 64 \
    --num-prompts 2 --no-simple --ignore-eos --deadline $((DEADLINE - SECONDS)) --out "$OUT/llama-cpp-8b.json" \
    2> /tmp/llama-cpp-8b.err
  echo "== llama.cpp rc=$? at $SECONDS s" | tee -a "$LOG"; tail -4 /tmp/llama-cpp-8b.err >> "$LOG"
  python3 benchmarks/peers/llama_cpp.py table "$OUT/llama-cpp-8b.json" "$OUT/specgen-8b.json" | tee -a "$LOG"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
  nvcc --version | tail -1; nproc
} 2>&1 | tee "$LOG"
case "$MODE" in
build)
  build; echo "== build rc=$? at $SECONDS s" | tee -a "$LOG"; tail -3 /tmp/build.log | tee -a "$LOG" ;;
run)
  [ -d "$PAIR/target" ] || pair
  convert; run ;;
all)
  # the build (niced) beside the pair's training, which is GPU-bound on one Python thread
  ( build; echo "== build rc=$? at $SECONDS s" > /tmp/build.done ) &
  [ -d "$PAIR/target" ] || pair
  convert
  wait
  built
  run ;;
8b)
  # the build (niced) beside the pair's making on the GPU and the conversions on two cores
  BUILD_LIMIT=${BUILD_LIMIT:-420}
  ( build; echo "== build rc=$? at $SECONDS s" > /tmp/build.done ) &
  [ -d "$PAIR/target" ] || family
  convert
  du -sh "$PAIR"/*.gguf 2>&1 | tee -a "$LOG"; df -h "$PAIR" | tail -1 | tee -a "$LOG"
  wait
  built
  run_8b
  mkdir -p "$OUT/8b-logs"
  cp /tmp/build.log /tmp/family.log /tmp/convert-target.log /tmp/convert-draft.log /tmp/specgen-8b.err /tmp/llama-cpp-8b.err \
    "$OUT/8b-logs/" 2>/dev/null
  echo "== done at $SECONDS s" | tee -a "$LOG" ;;
*)
  echo "usage: $0 all | build | run [PAIR] | 8b [PAIR]" >&2; exit 2 ;;
esac
