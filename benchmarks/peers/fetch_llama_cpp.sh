#!/usr/bin/env bash
# llama.cpp's source as the GPU machine can take it: PyPI's source distribution of
# llama-cpp-python (which vendors llama.cpp), stripped to what a CUDA build of its speculative
# examples and its GGUF converter need, into DEST (default .peers/llama.cpp, which git ignores
# through .git/info/exclude: the device tool carries it with `carry: [".peers"]`).
#     bash benchmarks/peers/fetch_llama_cpp.sh [VERSION] [DEST]
set -euo pipefail
VERSION=${1:-0.3.36}
DEST=${2:-.peers/llama.cpp}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work" >/dev/null
tar xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
# not built or not read: vocabulary test files, docs, benchmarks' data, other GPUs' backends, web UI
rm -rf "$src"/{models,docs,media,benches,.devops,ci,tests} "$src"/tools/ui  # tests and ui: not configured without LLAMA_BUILD_TESTS and LLAMA_BUILD_SERVER
for backend in "$src"/ggml/src/ggml-*/; do
  case $(basename "$backend") in ggml-cpu|ggml-cuda|ggml-blas) ;; *) rm -rf "$backend" ;; esac
done
rm -rf "$src"/examples/{llama.android,llama.swiftui,sycl}
# llama-speculative-simple logs through a worker thread and returns without flushing it: its last
# lines (the rate and the acceptance counts) were lost in about half the runs on a CPU. One flush
# before it returns, after everything it times.
python - "$src/examples/speculative-simple/speculative-simple.cpp" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
end = '    LOG("\\n\\n");\n\n    return 0;\n}'
assert text.count(end) == 1, "llama-speculative-simple's end changed: update fetch_llama_cpp.sh"
open(path, "w").write(text.replace(end, end.replace("return 0;", "common_log_flush(common_log_main());\n\n    return 0;")))
PY
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST"
cp -r "$src" "$DEST"
grep -qx '/.peers/' .git/info/exclude 2>/dev/null || echo '/.peers/' >> .git/info/exclude
du -sh "$DEST"
