"""Where a split 8B step's time goes: each stretch's graph and each copy of a 1-token
SegmentedGraph replay, timed alone (CUDA events on its device), for the default kernels and
with split-K and dependent launch off; then the profiler's kernel table of ten replays (device
time by kernel, both GPUs), written to argv[2]. Every Triton launch, captures included, is checked
for tensors on another device than the current one (peer access makes such a launch work, slowly)."""
import collections, statistics, sys, torch
import triton.runtime.jit as jit
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM
from specgen.core.settings import KernelSpec, ModelSpec, Profile
from specgen.gpu.backend import CudaBackend

@torch.inference_mode()  # the graphs' buffers are inference tensors
def timed(device, fn, n=20):
    out = []
    for _ in range(4):
        with torch.cuda.device(device):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(n):
                fn()
            b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / n)
    return round(statistics.median(out[1:]), 4)

away = collections.Counter()
_run = jit.JITFunction.run

def checked(self, *args, **kwargs):
    here = torch.cuda.current_device()
    for i, a in enumerate((*args, *kwargs.values())):
        if isinstance(a, torch.Tensor) and a.is_cuda and a.device.index != here:
            away[(self.fn.__name__, i, str(a.device), here)] += 1
    return _run(self, *args, **kwargs)

jit.JITFunction.run = checked

for index, spec in enumerate((KernelSpec(), KernelSpec(split_k="off", dependent_launch="off"))):
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16, device_map="balanced")
    home = model.get_output_embeddings().weight.device
    runner = CudaBackend(home, Profile("p", "<p>", ModelSpec(sys.argv[1]), kernels=spec)).runner(
        model, model.get_output_embeddings().weight.shape[0], 1024, "target", shapes=(1,))
    runner.forward(torch.arange(100, 228, device=home))
    seg = runner.graphs[1].graph
    row = {"spec": f"split_k={spec.split_k} dependent={spec.dependent_launch}", "summary": seg.summary(),
           "whole_replay": timed(home, seg.replay)}
    for i, part in enumerate(seg.parts):
        row[f"part{i}@{part.device}"] = timed(part.device, part.graph.replay)
        for j, (src, dst) in enumerate(part.after):
            row[f"copy{i}.{j} {tuple(src.shape)}"] = timed(src.device, lambda: dst.copy_(src))
    print(row, flush=True)
    print("launches with a tensor on another device:", dict(away) or "none", flush=True)
    away.clear()
    if index == 0:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                seg.replay()
            torch.cuda.synchronize(0), torch.cuda.synchronize(1)
        with open(sys.argv[2], "w") as file:
            file.write(prof.key_averages(group_by_input_shape=False).table(sort_by="cuda_time_total", row_limit=40))
    del runner, model, seg; torch.cuda.empty_cache()
