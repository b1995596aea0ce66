#!/bin/bash
# Release points: combine releases after its loads (new), plus the split kernel releasing after its stores (news).
cd "$(dirname "$0")/.."
NEW=$PWD; OLD=$PWD/.gpu/old
rm -rf /tmp/news && mkdir -p /tmp/news && cp -r src benchmarks /tmp/news/
python3 - <<'PY'
p="/tmp/news/src/specgen/gpu/attention.py"; s=open(p).read()
a="""        m = m_new
    release_next(DEPENDENT)
"""
assert a in s; s=s.replace(a, "        m = m_new\n")
b="""        tl.store(lse_ptr + row_id * SPLITS + split, lse, mask=row_ok)
"""
assert b in s; s=s.replace(b, b + "    release_next(DEPENDENT)\n")
open(p,"w").write(s)
PY
t0=$(date +%s)
step() { # tag dir model variant
  (cd $2 && PYTHONPATH=$2/src timeout 100 python3 benchmarks/bench_kernels.py steps --model $3 --variants $4) > /tmp/$1.txt 2>&1
  echo "$1: $(grep -E "^\| graph-" /tmp/$1.txt | tail -1)" | tee -a $OUT/steps.txt
}
for i in 1 2; do
  for t in old:$OLD new:$NEW news:/tmp/news; do
    step 1b-${t%%:*}$i ${t#*:} 1b graph-draft
    step 8b-${t%%:*}$i ${t#*:} 8b graph-dependent
  done
done
echo "done at $(( $(date +%s)-t0 )) s" | tee -a $OUT/steps.txt
