"""A Llama-3-8B-shaped target (random bf16 weights): one decode step and a 5-token verification
step, eager / CUDA graph / torch.compile + CUDA graph, against the bandwidth floor.

    python benchmarks/bench_shapes.py [--variants eager,graph-kernel,compile-kernel] [--out shapes.json]
        [--inductor 'default;triton.multi_kernel=2']  (compiled variants: one row per inductor set)

Variants: eager (SDPA), graph-<attention> (CUDA graph), compile-<attention> (torch.compile + CUDA
graph), where <attention> is kernel (gpu/attention.py, over the live keys) or sdpa (over the whole
static cache), all with cuBLAS linears; graph-linear and compile-linear add gpu/linear.py's kernel
for every projection (the runner's default); -tuned also autotunes (the runner's `autotune`).
--compile adds compile-kernel. Each row also gives the 5-token step's logits error against an eager
forward (max |difference| / max |eager logit|).

floor = weight bytes / device-to-device copy bandwidth measured in the same run (bytes read plus
bytes written over the time of a 4 GiB copy). Every step runs at position 512 of a 1024-position
static cache (rolled back after each step), timed with CUDA events over 50 steps, median of 5.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import time
from pathlib import Path

import torch

from specgen.gpu.runner import GraphRunner

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                 rope_theta=500000.0, tie_word_embeddings=False)
POSITION = 512
VARIANTS = {
    "eager": dict(use_graphs=False, attention=False, linear=False),
    "graph-sdpa": dict(attention=False, linear=False),
    "graph-kernel": dict(attention=True, linear=False),
    "compile-sdpa": dict(compile=True, attention=False, linear=False),
    "compile-kernel": dict(compile=True, attention=True, linear=False),
    "compile-kernel-tuned": dict(compile=True, attention=True, autotune=True, linear=False),  # runner.AUTOTUNE
    "graph-linear": dict(attention=True, linear=True),  # + gpu/linear.py for every projection
    "compile-linear": dict(compile=True, attention=True, linear=True),  # the runner's default with compile
    "compile-linear-tuned": dict(compile=True, attention=True, autotune=True, linear=True),
}


def copy_bandwidth(gib: int = 4) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and bytes written."""
    a = torch.randn(gib * 2**28, device="cuda")  # float32: gib GiB
    b = torch.empty_like(a)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    assert torch.equal(a, b)
    return 2 * a.numel() * a.element_size() / statistics.median(times[2:])


def random_model(config_kwargs: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**config_kwargs)).eval()
    torch.set_default_dtype(previous)
    return model


def step_seconds(runner: GraphRunner, n: int, steps: int = 50, repeats: int = 5) -> float:
    ids = torch.randint(0, runner.width, (n,), device="cuda")
    runner.reset()
    runner.forward(torch.randint(0, runner.width, (POSITION,), device="cuda"), want_logits=False)
    for _ in range(3):
        runner.forward(ids)
        runner.truncate(POSITION)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            runner.forward(ids)
            runner.truncate(POSITION)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / steps)
    return statistics.median(times)


def step_logits(runner: GraphRunner, ids: torch.Tensor) -> torch.Tensor:
    """Logits of one 5-token step at POSITION after a fixed random prefix."""
    generator = torch.Generator(device="cuda").manual_seed(1)
    runner.reset()
    runner.forward(torch.randint(0, runner.width, (POSITION,), device="cuda", generator=generator), want_logits=False)
    logits = runner.forward(ids).clone()
    runner.truncate(POSITION)
    return logits


def kernel_table(runner: GraphRunner, steps: int = 20) -> str:
    """torch.profiler's CUDA kernel table over `steps` 1-token steps at POSITION."""
    ids = torch.randint(0, runner.width, (1,), device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.forward(ids)
            runner.truncate(POSITION)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60)


def inductor_set(text: str) -> dict:
    """'a.b=2,c=True' -> {"a.b": 2, "c": True}; '' or 'default' -> {}."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if item == "default":
            continue
        key, _, value = item.partition("=")
        value = value.strip()
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip()] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--variants", default="eager,graph-sdpa,graph-kernel", help="comma-separated, see above")
    parser.add_argument("--profile", action="store_true", help="kernel table of each variant's 1-token step")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--inductor", default="",
                        help="torch._inductor.config sets for the compiled variants, `;` between sets, `,` within "
                             "one: 'default;triton.multi_kernel=2;combo_kernels=True' (each set is a row per variant)")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    model = random_model(LLAMA3_8B)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    floor = weight_bytes / bandwidth
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "weight_bytes": weight_bytes,
              "copy_bandwidth_bytes_per_s": bandwidth, "floor_ms": floor * 1e3, "rows": []}
    print(f"{torch.cuda.get_device_name()}: weights {weight_bytes / 1e9:.2f} GB, copy {bandwidth / 1e12:.2f} TB/s, "
          f"floor {floor * 1e3:.2f} ms", flush=True)
    probe = torch.randint(0, LLAMA3_8B["vocab_size"], (5,), device="cuda")
    reference = step_logits(GraphRunner(model, LLAMA3_8B["vocab_size"], 1024, **VARIANTS["eager"]), probe)
    names = args.variants.split(",") + (["compile-kernel"] if args.compile else [])
    variants = []
    for name in dict.fromkeys(names):
        sets = [inductor_set(text) for text in args.inductor.split(";")] if VARIANTS[name].get("compile") else [{}]
        for settings in sets:
            label = name + "".join(f" {key}={value}" for key, value in settings.items())
            variants.append((label, {**VARIANTS[name], **({"inductor": settings} if settings else {})}))
    for name, kwargs in variants:
        torch._dynamo.reset()  # every compiled variant traces afresh (no reuse of another's code)
        start = time.perf_counter()
        runner = GraphRunner(model, LLAMA3_8B["vocab_size"], 1024, shapes=(1, 5), **kwargs)
        setup = time.perf_counter() - start
        one, five = step_seconds(runner, 1), step_seconds(runner, 5)
        error = (step_logits(runner, probe) - reference).abs().max() / reference.abs().max()
        row = {"variant": name, "setup_s": round(setup, 1), "step_1_ms": one * 1e3, "step_5_ms": five * 1e3,
               "step_1_over_floor": one / floor, "step_5_over_step_1": five / one,
               "logits_rel_err": error.item()}
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        if args.profile:
            print(kernel_table(runner), flush=True)
        del runner
        torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n| variant | 1-token step ms | 5-token step ms | 1-token / floor | 5-token / 1-token | logits error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in report["rows"]:
        print(f"| {row['variant']} | {row['step_1_ms']:.2f} | {row['step_5_ms']:.2f} | "
              f"{row['step_1_over_floor']:.2f} | {row['step_5_over_step_1']:.3f} | {row['logits_rel_err']:.1e} |")
    print(f"floor {floor * 1e3:.2f} ms = {weight_bytes / 1e9:.2f} GB / {bandwidth / 1e12:.2f} TB/s")


if __name__ == "__main__":
    main()
