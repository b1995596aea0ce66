#!/usr/bin/env bash
# Does a second compiled start reuse specgen's compile cache? Tiny Llama-3.1 pair, default cache
# folder ($XDG_CACHE_HOME/specgen/inductor) under a fresh XDG_CACHE_HOME (not /tmp).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src XDG_CACHE_HOME=$HOME/cc-test
rm -rf "$XDG_CACHE_HOME"
timeout 60 python3 benchmarks/family_pairs.py --family llama-3.1 --scale tiny --out /tmp/fpt --device cuda --prompts 1 > /dev/null 2>&1
echo "tiny build rc=$?"
for i in 1 2; do
  s=$(date +%s.%N)
  timeout 150 python3 -m specgen.cli.main generate -p /tmp/fpt/llama-3.1/pair.toml -n 16 --ignore-eos --compile --format json -v \
    "def f(x): return x" > /tmp/cc$i.json 2> /tmp/cc$i.err
  echo "compiled start $i rc=$? wall $(awk -v a=$s -v b=$(date +%s.%N) 'BEGIN{printf "%.1f", b-a}') s; cache files $(find $XDG_CACHE_HOME -type f | wc -l)"
  grep -iE "fallback|could not|error" /tmp/cc$i.err | head -3 | cut -c1-250
done
