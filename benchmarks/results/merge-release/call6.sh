#!/bin/bash
# Release point of the tensor-core linear kernel: after the walk (HEAD), at exit (v1), at the start (v2).
cd "$(dirname "$0")/.."
NEW=$PWD
for v in v1 v2; do rm -rf /tmp/$v && mkdir -p /tmp/$v && cp -r src benchmarks /tmp/$v/; done
python3 - <<'PY'
import re
for v in ("v1", "v2"):
    p=f"/tmp/{v}/src/specgen/gpu/linear.py"; s=open(p).read()
    a="""            acc_u = _accumulate(acc_u, x, u, DOT, F32_DOT)
    release_next(DEPENDENT)
"""
    assert a in s; s=s.replace(a, "            acc_u = _accumulate(acc_u, x, u, DOT, F32_DOT)\n")
    if v == "v2":
        b="""    wait_previous(DEPENDENT)
    pid = tl.program_id(0)
    tile = pid % tiles"""
        assert b in s; s=s.replace(b, "    wait_previous(DEPENDENT)\n    release_next(DEPENDENT)\n    pid = tl.program_id(0)\n    tile = pid % tiles")
    open(p,"w").write(s)
PY
t0=$(date +%s)
step() { # tag dir model variant
  (cd $2 && PYTHONPATH=$2/src timeout 100 python3 benchmarks/bench_kernels.py steps --model $3 --variants $4) > /tmp/$1.txt 2>&1
  echo "$1: $(grep -E "^\| graph-" /tmp/$1.txt | tail -1)" | tee -a $OUT/steps.txt
}
for i in 1 2; do
  for t in head:$NEW v1:/tmp/v1 v2:/tmp/v2; do
    step 1b-${t%%:*}$i ${t#*:} 1b graph-draft
    step 8b-${t%%:*}$i ${t#*:} 8b graph-dependent
  done
done
echo "done at $(( $(date +%s)-t0 )) s" | tee -a $OUT/steps.txt
