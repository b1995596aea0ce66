"""Kernel tables of captured one-token steps: Gemma-2-9B and Llama-3.1-8B targets, dependent launch off
and on. argv[1]: out folder."""
import dataclasses, gc, json, sys
sys.path.insert(0, "benchmarks")
import torch
from transformers import AutoConfig, AutoModelForCausalLM
import bench_kernels as bk
import family_pairs
from specgen.core.settings import KernelSpec
from specgen.gpu import tune
from specgen.gpu.kernels import resolve
from specgen.gpu.workspace import Workspace

out = sys.argv[1]
for family, role in (("gemma-2", "target"), ("llama-3.1", "target")):
    values = dict(family_pairs.FAMILIES[family].target.config)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    for dep in ("off", "on"):
        kernels = resolve(KernelSpec(dependent_launch=dep), "cuda", model)
        runner = bk.build_runner(model, config.vocab_size, kernels, Workspace("cuda"), {})
        runner.reset(); runner.forward(torch.randint(0, config.vocab_size, (bk.POSITION,), device="cuda"), want_logits=False)
        step = tune.step_seconds(runner, 1, bk.POSITION) * 1e3
        text, summary = bk.kernel_table(runner, 1)
        with open(f"{out}/prof-{family}-target-{dep}.txt", "w") as f:
            f.write(f"step {step:.4f} ms\n" + text)
        print(family, dep, f"step {step:.4f} ms", {k: v for k, v in summary.items() if k != "sequence"}, flush=True)
        del runner; gc.collect(); torch.cuda.empty_cache()
    del model; gc.collect(); torch.cuda.empty_cache()
