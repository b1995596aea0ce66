"""Captured one-token (and two- and five-token) steps of Gemma 2's draft and target shapes (random
bf16 weights of the public configs), with the kernels `auto` resolves; PYTHONPATH picks the tree."""
import dataclasses, gc, json, sys, time
sys.path.insert(0, "benchmarks")
import torch
from transformers import AutoConfig, AutoModelForCausalLM
import bench_kernels as bk
import family_pairs
from specgen.core.settings import KernelSpec
from specgen.gpu import tune
from specgen.gpu.kernels import resolve
from specgen.gpu.workspace import Workspace

bandwidth = bk.copy_bandwidth()
for role in sys.argv[1].split(","):
    values = dict(getattr(family_pairs.FAMILIES["gemma-2"], role).config)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    kernels = resolve(KernelSpec(), "cuda", model)
    if role == "draft":
        kernels = dataclasses.replace(kernels, linear_table=kernels.linear_table.for_drafts())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    runner = bk.build_runner(model, config.vocab_size, kernels, Workspace("cuda"), {})
    ids = torch.randint(0, config.vocab_size, (5,), device="cuda")
    runner.reset(); runner.forward(torch.randint(0, config.vocab_size, (300,), device="cuda"), want_logits=False)
    logits = runner.forward(ids).float()
    times = {t: tune.step_seconds(runner, t, bk.POSITION) * 1e3 for t in (1, 2, 5)}
    floor = weight_bytes / bandwidth * 1e3
    print(json.dumps({"role": role, "kernels": kernels.as_dict(), "floor_ms": round(floor, 4),
                      **{f"step_{t}_ms": round(v, 4) for t, v in times.items()},
                      "step_1_over_floor": round(times[1] / floor, 3), "logits_sum": logits.sum().item(),
                      "logits_abs_max": logits.abs().max().item()}), flush=True)
    del runner, model; gc.collect(); torch.cuda.empty_cache()
