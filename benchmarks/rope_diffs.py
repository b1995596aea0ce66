"""Max logit difference per feed between a runner with the decode-attention kernel and one with SDPA,
for the tiny Llama / Mistral (window 24) / Qwen2 / Qwen3 models of tests/test_attention.py, with the
model's rotary embedding and with the kernel's (SPECGEN_ROPE=kernel), float32. The test asserts each
difference < 1e-4; this prints them all, with the logits' scale, to tell rounding from a fault.

    python benchmarks/rope_diffs.py      # CPU: Triton interpreter; GPU: the real kernel
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
import test_attention as cases  # noqa: E402  (sets TRITON_INTERPRET without CUDA)

from specgen.gpu import runner as runner_module  # noqa: E402
from specgen.gpu.runner import GraphRunner  # noqa: E402

FAMILIES = [("llama", {}), ("mistral", {"sliding_window": 24}), ("qwen2", {}), ("qwen3", {"head_dim": 16})]
SCRIPT = [5, 1, -3, 5, 1, 1, -2, 5]  # as the test: feed n tokens, or roll back n


def run(runner, prompt, feeds):
    runner.reset()
    logits = [cases._feed(runner, prompt)]
    for n, ids in zip(SCRIPT, feeds):
        if n < 0:
            runner.truncate(runner.length + n)
        else:
            logits.append(cases._feed(runner, ids))
    return logits


def main() -> None:
    print("device", cases.DEVICE, "interpreted", cases.INTERPRETED)
    for family, extra in FAMILIES:
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, 96, (30,), generator=gen).tolist()
        feeds = [torch.randint(0, 96, (abs(n),), generator=gen).tolist() for n in SCRIPT]
        results = {}
        for rope in (False, True):
            runner_module.ROPE_IN_KERNEL = rope
            model = cases._tiny(family, **extra)
            kernel = GraphRunner(model, 96, 600, use_graphs=False, attention=True)
            sdpa = GraphRunner(model, 96, 600, use_graphs=False, attention=False)
            results[rope] = run(kernel, prompt, feeds)
            results["sdpa"] = run(sdpa, prompt, feeds)
        scale = max(x.abs().max().item() for x in results["sdpa"])
        for name, got, want in (("model-rotary vs sdpa", results[False], results["sdpa"]),
                                ("kernel-rotary vs sdpa", results[True], results["sdpa"]),
                                ("kernel-rotary vs model-rotary", results[True], results[False])):
            diffs = " ".join(f"{(a - b).abs().max().item():.1e}" for a, b in zip(got, want))
            print(f"{family:8s} {name:30s} logits up to {scale:6.1f}: {diffs}", flush=True)


if __name__ == "__main__":
    main()
