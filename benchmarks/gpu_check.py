"""Is CUDA-graph replay trustworthy? Graph vs eager logits on the bench target's shape (random
weights), float32 and bfloat16, plus the probe's setup for comparison.

    python benchmarks/gpu_check.py [--out check.json]

For each dtype: a 100-token prefill, then 30 rounds of a 5-token verification step followed by a
rollback to a random accepted length and a 1-token step, fed identically to a graph runner and to
an eager runner over its own SlotCache. Reported: relative error ||graph - eager|| / ||eager|| and
the largest absolute difference, over all steps; and, as the yardstick for rounding, eager
bfloat16 against eager float32 on the same weights.

"probe": transformers' StaticCache captured the plain way (warm-ups on the live cache, then
capture), replayed once after a prefill, against an eager forward of the same tokens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specgen.gpu.runner import GraphRunner

BENCH_TARGET = dict(vocab_size=16384, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                    num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                    tie_word_embeddings=False)


def model_in(dtype: torch.dtype, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**BENCH_TARGET)).to("cuda", dtype).eval()


def errors(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm()), float((a - b).abs().max())


def graph_vs_eager(model, rounds: int = 30) -> dict:
    vocab = BENCH_TARGET["vocab_size"]
    graph = GraphRunner(model, vocab, 1024, shapes=(1, 5))
    eager = GraphRunner(model, vocab, 1024, use_graphs=False)
    g = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(0, vocab, (100,), device="cuda", generator=g)
    for runner in (graph, eager):
        runner.reset()
        runner.forward(prompt, want_logits=False)
    rel, absolute, logits = [], [], []
    for r in range(rounds):
        for n in (5, 1):
            feed = torch.randint(0, vocab, (n,), device="cuda", generator=g)
            got, want = graph.forward(feed).clone(), eager.forward(feed)
            e = errors(got, want)
            rel.append(e[0])
            absolute.append(e[1])
            logits.append(want)
        keep = graph.length - 6 + 1 + r % 5  # accepted r % 5 of the 4 drafts
        for runner in (graph, eager):
            runner.truncate(keep)
    return {"max_relative": max(rel), "median_relative": sorted(rel)[len(rel) // 2], "max_abs": max(absolute),
            "logit_std": float(torch.cat(logits).std()), "steps": len(rel)}


def bf16_vs_fp32() -> dict:
    fp32, bf16 = model_in(torch.float32), model_in(torch.bfloat16)
    ids = torch.randint(0, BENCH_TARGET["vocab_size"], (1, 105), device="cuda")
    with torch.inference_mode():
        a, b = bf16(ids).logits.float(), fp32(ids).logits
    rel, absolute = errors(a, b)
    return {"relative": rel, "max_abs": absolute}


def probe() -> dict:
    """transformers' StaticCache, warmed up and captured on the live cache, as the probe did."""
    from transformers import StaticCache

    model = model_in(torch.bfloat16)
    ids = torch.randint(0, BENCH_TARGET["vocab_size"], (1, 105), device="cuda")
    prompt, feed = ids[:, :100], ids[:, 100:].clone()
    with torch.inference_mode():
        want = model(ids).logits[0, 100:].float()
        cache = StaticCache(config=model.config, max_cache_len=1024)
        model(prompt, past_key_values=cache, use_cache=True)
        static = feed.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(static, past_key_values=cache, use_cache=True)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static, past_key_values=cache, use_cache=True).logits
        static.copy_(feed)
        graph.replay()
        torch.cuda.synchronize()
        got = out[0].float()
        position = int(cache.layers[0].cumulative_length)
    rel, absolute = errors(got, want)
    return {"relative": rel, "max_abs": absolute, "write_position_after_replay": position, "expected_position": 105}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for dtype in (torch.float32, torch.bfloat16):
        report[f"graph_vs_eager_{str(dtype).split('.')[-1]}"] = graph_vs_eager(model_in(dtype))
    report["eager_bf16_vs_eager_fp32"] = bf16_vs_fp32()
    try:
        report["probe_static_cache_naive_capture"] = probe()
    except Exception as exc:  # noqa: BLE001 (report what the naive capture does, whatever it is)
        report["probe_static_cache_naive_capture"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
