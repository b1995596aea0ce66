#!/usr/bin/env bash
# Llama 3.1 8B + 3.2 1B and an EAGLE-3 head of the published shape (random weights): the k = 4
# round over its floor with the rewired transformers modules against the owned step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name --format=csv,noheader | tee $LOG
FP=/tmp/fp
timeout 170 python3 benchmarks/family_pairs.py --family llama-3.1 --scale full --out $FP --device cuda --prompts 2 --head > /tmp/build.log 2>&1
echo "== llama build rc=$? at $SECONDS s" | tee -a $LOG
for m in transformers auto; do
  cp $FP/llama-3.1/pair.toml $FP/llama-3.1/$m.toml
  printf '\n[runtime]\nmodeling = "%s"\n' $m >> $FP/llama-3.1/$m.toml
done
for m in transformers auto transformers auto; do
  left=$((590 - SECONDS)); [ $left -lt 60 ] && break
  timeout $(( left < 110 ? left : 110 )) python3 -m specgen.cli.main bench -p $FP/llama-3.1/$m.toml --proposer draft,eagle,ngram --k 4 -t 0 --num-prompts 2 -n 64 \
    --baseline target-only --no-fp32-check --format json > $OUT/llama-$m-$SECONDS.json 2> /tmp/llama.err
  echo "== llama $m rc=$? at $SECONDS s" | tee -a $LOG; tail -3 /tmp/llama.err | tee -a $LOG
done
for f in $OUT/llama-*.json; do python3 - "$f" <<'PY' | tee -a $LOG
import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[1].split("/")[-1], d["environment"]["resolved"].get("modeling"), "startup", d.get("startup_seconds"))
for b in d["baselines"]:
    print("  target-only tok/s %.1f" % b["tokens_per_second"]["median"])
for r in d["results"]:
    print("  ", r["proposer"], "round %.4f ms" % r["round_ms"]["total"], "x floor", r["round_over_floor"] and round(r["round_over_floor"], 3))
PY
done
