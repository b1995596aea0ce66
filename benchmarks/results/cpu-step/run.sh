#!/usr/bin/env bash
# CPU step and round costs on the owned step against transformers' modules, a Llama-family pair
# (the shipped demo: 12 layers, hidden 256, and its 2-layer draft) and a Qwen2-family pair of the
# same size (the demo's weights under Qwen2's config, with random q/k/v biases). One thread (the
# default on 2 cores), `specgen bench`, A B A B.
set -u
OUT=${OUT:-benchmarks/results/cpu-step}
W=/tmp/cpu-step
rm -rf $W && mkdir -p $W
DEMO=src/specgen/builtin/demo
python - "$DEMO" "$W" <<'PY'
import json, shutil, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
demo, out = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
for role in ("target", "draft"):
    dst = out / "qwen2" / role
    shutil.copytree(demo / role, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"], use_sliding_window=False,
                  sliding_window=None, max_window_layers=config["num_hidden_layers"])
    config.pop("attention_bias", None), config.pop("mlp_bias", None), config.pop("head_dim", None)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(dst / "model.safetensors")
    for name in list(tensors):
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            rows = tensors[name].shape[0]
            tensors[name[:-len("weight")] + "bias"] = (0.02 * torch.randn(rows)).to(tensors[name].dtype)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
PY
for family in llama qwen2; do
  for m in transformers auto; do
    if [ $family = llama ]; then t=$PWD/$DEMO/target; d=$PWD/$DEMO/draft; else t=$W/qwen2/target; d=$W/qwen2/draft; fi
    printf '[target]\npath = "%s"\n[draft]\npath = "%s"\n[speculation]\nk = 4\n[runtime]\nmodeling = "%s"\n' $t $d $m > $W/$family-$m.toml
  done
done
for family in llama qwen2; do
  for m in transformers auto transformers auto; do
    python -m specgen bench -p $W/$family-$m.toml --k 4 -t 0 --num-prompts 10 -n 64 --prompts-file $DEMO/prompts.jsonl \
      --baseline target-only --no-fp32-check --format json > $W/$family-$m.json 2>/dev/null
    python - $W/$family-$m.json $family <<'PY' | tee -a $OUT/log.txt
import json, sys
d = json.load(open(sys.argv[1]))
b, r = d["baselines"][0], d["results"][0]
print(sys.argv[2], d["environment"]["resolved"]["modeling"], "threads", d["environment"]["cpu_threads"],
      "target-only %.1f tok/s" % b["tokens_per_second"]["median"],
      "k=4 %.1f tok/s" % r["tokens_per_second"]["median"], "round %.2f ms" % r["round_ms"]["total"],
      "(draft %.2f, verify %.2f)" % (r["round_ms"]["draft"], r["round_ms"]["verify"]),
      "mal %.2f" % r["mean_accepted_length"], "startup %.2f s" % d["startup_seconds"])
PY
  done
done
# The demo target's eager steps, interleaved: 200 timings a shape and modeling.
python - <<'PY' | tee -a $OUT/log.txt
import statistics, time, torch
torch.set_num_threads(1)
from specgen.core.models import load_model
from specgen.core.runner import EagerRunner
from specgen.core.settings import ModelSpec
spec = ModelSpec(path="src/specgen/builtin/demo/target", device="cpu")
runners = {m: EagerRunner(load_model(spec, modeling=m), 16384, 512) for m in ("transformers", "auto")}
ids = torch.randint(0, 1000, (128,))
times = {m: {1: [], 5: []} for m in runners}
for rep in range(5):
    for m, r in runners.items():
        r.reset(); r.forward(ids[:100])
        for n in (1, 5):
            for i in range(40):
                r.position.fill_(100)
                t = time.perf_counter(); r.forward(ids[i:i + n]); times[m][n].append(time.perf_counter() - t)
for m in times:
    print("demo target step at position 100,", m, " ".join("%d-token median %.2f ms" % (n, statistics.median(v) * 1e3)
                                                         for n, v in times[m].items()))
PY
# The demo's proposers on HEAD (owned step), three runs: the CPU claim's current table.
for run in 1 2 3; do
  python -m specgen bench -p demo --proposer draft,ngram,hybrid --k 4 -t 0 --num-prompts 10 -n 64 \
    --baseline target-only --no-fp32-check --format json > $W/proposers-$run.json 2>/dev/null
  python benchmarks/bench_summary.py $W/proposers-$run.json | tee -a $OUT/proposers.txt
done
