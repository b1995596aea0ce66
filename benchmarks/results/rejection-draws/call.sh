#!/usr/bin/env bash
# A rejection round's draws in four host calls (ac29301): GPU tests (two GPUs: a draft on another GPU
# than the target, a split target), then the bench pair (trained here briefly), 8e6a511 (old) against
# the change (new), alternating.
set -u
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $LOG
python3 - <<'PY' | tee -a $LOG
import torch
for n in (5, 4, 128256 * 5):
    a = torch.empty(n, device="cuda").uniform_(0, 1, generator=torch.Generator("cuda").manual_seed(3)).neg_().add_(1.0)
    b = torch.empty(n, device="cuda").uniform_(-1, 0, generator=torch.Generator("cuda").manual_seed(3)).neg_()
    print("uniforms equal on cuda", n, torch.equal(a, b), bool((b > 0).all()), float(b.max()))
PY
PYTHONPATH=$PWD/src timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_stages.py tests/test_round.py tests/test_commit.py tests/test_gpu.py > $OUT/tests.txt 2>&1
echo "== tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt)" | tee -a $LOG
PYTHONPATH=$PWD/src timeout 120 python3 benchmarks/make_pair.py --preset bench --seed 0 --out /tmp/bench --minutes 1 --device cuda > /tmp/pair.log 2>&1
echo "== pair rc=$? at $SECONDS s" | tee -a $LOG; tail -2 /tmp/pair.log | cut -c1-200
for ver in old new old new; do
  left=$((570 - SECONDS)); [ $left -lt 50 ] && { echo "no time for $ver" | tee -a $LOG; break; }
  src=$PWD/src; [ $ver = old ] && src=$PWD/.gpu/old/src
  PYTHONPATH=$src timeout $(( left < 90 ? left : 90 )) python3 -m specgen.cli.main bench -p /tmp/bench/pair.toml --k 4 -t 0,0.8 --top-p 0.95 --num-prompts 10 -n 128 \
    --baseline "" --format json > $OUT/bench-$ver-$SECONDS.json 2> /tmp/$ver.err
  echo "== bench $ver rc=$? at $SECONDS s" | tee -a $LOG; tail -1 /tmp/$ver.err | cut -c1-200
done
python3 - $OUT/bench-*.json <<'PY' | tee -a $LOG
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    for r in d["results"]:
        print(path.split("/")[-1], r["proposer"], r["k"], r["temperature"], r.get("coupling"), "tok/s %.1f" % r["tokens_per_second"]["median"],
              "decode %.1f" % (r.get("decode_tokens_per_second") or {}).get("median", 0), {k: round(v, 4) for k, v in r["round_ms"].items()},
              r["counts"]["accepted"], r["counts"]["recovered"])
PY
