"""Verification micro-benchmark: warp + verify + recover per round, Triton kernels against the torch reference.

    python3 benchmarks/bench_verify.py [--out DIR] [--skip-tests]

Validate first, then time (as llm.c's dev/cuda does); the test files run last, streamed, because
their many kernel compiles take minutes:
1. Kernel == reference at vocab 151936 and 128256 for every configuration below: argmax, sampled
   ids (same Exp(1) draws) and verification output with torch.equal; kept sets compared too, where a
   difference is allowed only as the documented float32 top-p tie (mass-above within 1e-5 of top_p).
2. If they pass, one round at vocab 128256, k = 4, batch 1 and 32: the draws (uniforms [B k],
   exponentials [B, V]), the target warp of B (k + 1) rows, random verification with draft probabilities (recovered and
   bonus tokens inside), or greedy verification. Triton through core/verifier.py (the dispatcher the
   loop calls), torch through core/sampling.py + core/rejection.py. Median of triton.testing.do_bench:
   CUDA events around each Python call with L2 flushed before it, so host dispatch counts wherever
   the GPU waits for it (the reference's own host syncs included). Also the Triton round replayed
   from a CUDA graph (GPU time alone). Logits: float32 N(0, 3^2); drafts drawn from q = the warp of
   the target logits plus N(0, 1) noise. Penalty rows (full chain) are built before timing: they are
   the sampling state's work, not the verifier's.
3. tests/test_kernels.py (CUDA-only tests first) and tests/test_lossless.py on the GPU, with
   TRITON_INTERPRET unset (compiled kernels), verbose so a cut-off run still shows what passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
import triton.testing

from specgen.core import rejection, sampling, verifier

VOCAB = 128256
K = 4
BATCHES = (1, 32)
CONFIGS = {
    "greedy": dict(temperature=0.0),
    "temperature 1": dict(temperature=1.0),
    "top-k 50 + top-p 0.9": dict(temperature=0.8, top_k=50, top_p=0.9),
    "full chain": dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                       presence_penalty=0.2, frequency_penalty=0.2),
}
DEFAULTS = dict(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                frequency_penalty=0.0)


def params_for(rows: int, config: dict) -> sampling.WarpParams:
    values = {**DEFAULTS, **config}
    return sampling.WarpParams(**{
        name: torch.full((rows,), value, dtype=torch.int32 if name == "top_k" else torch.float32, device="cuda")
        for name, value in values.items()
    })


def round_inputs(batch: int, vocab: int, config: dict, seed: int = 0) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = batch * (K + 1)
    logits = torch.randn(rows, vocab, device="cuda", generator=gen) * 3
    params = params_for(rows, config)
    penalties = None
    if "repetition_penalty" in config:
        counts = (torch.rand(vocab, device="cuda", generator=gen) < 0.01).to(torch.int32)
        drafted = torch.randint(0, vocab, (K,), device="cuda", generator=gen)
        one = sampling.penalty_rows(counts, counts > 0, drafted)  # the same history for every request
        penalties = sampling.PenaltyRows(one.counts.repeat(batch, 1), one.seen.repeat(batch, 1))
    draft_rows = torch.tensor([b * (K + 1) + i for b in range(batch) for i in range(K)], device="cuda")
    draft_logits = logits[draft_rows] + torch.randn(batch * K, vocab, device="cuda", generator=gen)
    draft_params = params_for(batch * K, {**config, "temperature": config["temperature"] or 1.0})
    _, q = sampling.warp(draft_logits, draft_params)
    drafted = sampling.sample_race(q, sampling.exponentials(q.shape, gen, "cuda"))
    cu = (torch.arange(1, batch + 1, device="cuda") * K).to(torch.int32)
    return dict(logits=logits, params=params, penalties=penalties, q=q, drafted=drafted, cu=cu, batch=batch,
                vocab=vocab, gen=gen)


def round_fn(inputs: dict, impl: str):
    """One round as the decode loop runs it: draws, target warp, verification."""
    warp = verifier.warp if impl == "triton" else sampling.warp
    verify_random = verifier.verify_random if impl == "triton" else rejection.verify_random
    verify_greedy = verifier.verify_greedy if impl == "triton" else rejection.verify_greedy
    logits, params, penalties, q = inputs["logits"], inputs["params"], inputs["penalties"], inputs["q"]
    drafted, cu, batch, vocab, gen = inputs["drafted"], inputs["cu"], inputs["batch"], inputs["vocab"], inputs["gen"]

    def run():
        argmax, probs = warp(logits, params, penalties, None)
        if probs is None:
            return verify_greedy(drafted, cu, argmax, K)
        uniform = sampling.uniforms((batch * K,), gen, "cuda")
        expo = sampling.exponentials((batch, vocab), gen, "cuda")
        return verify_random(drafted, cu, q, probs, uniform, expo, K)

    return run


def run_tests(log) -> bool:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    codes = []
    for selection in (["tests/test_kernels.py", "-m", "cuda"], ["tests/test_lossless.py"],
                      ["tests/test_kernels.py", "-m", "not cuda"]):
        start = time.perf_counter()
        command = [sys.executable, "-m", "pytest", *selection, "-v", "-p", "no:cacheprovider", "--durations=5"]
        codes.append(subprocess.run(command, env=env).returncode)  # streamed: a cut-off run leaves its log
        log(f"tests {' '.join(selection)}: exit {codes[-1]} in {time.perf_counter() - start:.0f} s")
    return all(code == 0 for code in codes)


def check_equal(vocab: int, log) -> list[dict]:
    """Kernel == reference on the GPU for each configuration, batch 2 (10 target rows)."""
    results = []
    for name, config in CONFIGS.items():
        inputs = round_inputs(2, vocab, config, seed=vocab % 97)
        logits, params, penalties = inputs["logits"], inputs["params"], inputs["penalties"]
        ref_argmax, ref_probs = sampling.warp(logits, params, penalties)
        argmax, probs = verifier.warp(logits, params, penalties)
        row = dict(vocab=vocab, config=name, argmax_equal=bool(torch.equal(argmax, ref_argmax)))
        gen = torch.Generator(device="cuda").manual_seed(1)
        if probs is None:
            out = verifier.verify_greedy(inputs["drafted"], inputs["cu"], argmax, K)
            ref = rejection.verify_greedy(inputs["drafted"], inputs["cu"], ref_argmax, K)
        else:
            expo_rows = sampling.exponentials(probs.shape, gen, "cuda")
            row["sampled_equal"] = bool(torch.equal(sampling.sample_race(probs, expo_rows),
                                                    sampling.sample_race(ref_probs, expo_rows)))
            differ = ((probs > 0) != (ref_probs > 0)).any(dim=-1)
            row["rows_with_kept_set_differences"] = int(differ.sum())
            row["differences_are_top_p_ties"] = all(_is_top_p_tie(logits[r], params, penalties, r, probs[r], ref_probs[r])
                                                    for r in differ.nonzero().flatten().tolist())
            row["max_abs_prob_diff"] = float((probs - ref_probs).abs().max())
            uniform = sampling.uniforms((2 * K,), gen, "cuda")
            expo = sampling.exponentials((2, vocab), gen, "cuda")
            out = verifier.verify_random(inputs["drafted"], inputs["cu"], inputs["q"], probs, uniform, expo, K)
            ref = rejection.verify_random(inputs["drafted"], inputs["cu"], inputs["q"], ref_probs, uniform, expo, K)
        row["verify_equal"] = bool(torch.equal(out, ref))
        row["emitted"] = rejection.num_emitted(ref).tolist()
        results.append(row)
        log(json.dumps(row))
    return results


def _is_top_p_tie(logits, params, penalties, row, probs, ref_probs) -> bool:
    one = params.slice(row, row + 1)
    pen = None if penalties is None else sampling.PenaltyRows(penalties.counts[row:row + 1], penalties.seen[row:row + 1])
    flat = sampling.apply_penalties(logits[None], one, pen, None)[0]
    e = torch.exp((flat - flat.max()) / one.temperature)
    if one.flags.top_k:
        e = torch.where(flat >= flat.sort(descending=True).values[int(one.top_k) - 1], e, 0.0)
    p = (e / e.sum()).double()
    ids = ((probs > 0) != (ref_probs > 0)).nonzero().flatten()
    return all(abs(float(p[flat > flat[i]].sum()) - float(one.top_p)) < 1e-5 for i in ids.tolist())


def time_rounds(log) -> list[dict]:
    results = []
    for name, config in CONFIGS.items():
        for batch in BATCHES:
            inputs = round_inputs(batch, VOCAB, config)
            row = dict(config=name, batch=batch)
            for impl in ("triton", "torch"):
                fn = round_fn(inputs, impl)
                fn()
                row[f"{impl}_us"] = 1000 * triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
            try:
                graphed = round_fn(dict(inputs, gen=None), "triton")
                row["triton_graph_us"] = 1000 * triton.testing.do_bench_cudagraph(graphed, rep=300,
                                                                                  return_mode="median")
            except Exception as error:  # noqa: BLE001 (reported, not fatal)
                row["triton_graph_us"] = None
                log(f"graph capture failed for {name}, batch {batch}: {error!r}")
            row["speedup"] = row["torch_us"] / row["triton_us"]
            results.append(row)
            log(json.dumps(row))
    return results


def table(rows: list[dict]) -> str:
    lines = ["| configuration | batch | Triton (µs) | Triton, CUDA graph (µs) | torch reference (µs) | speed-up |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        graph = "n/a" if row["triton_graph_us"] is None else f"{row['triton_graph_us']:.1f}"
        lines.append(f"| {row['config']} | {row['batch']} | {row['triton_us']:.1f} | {graph} | "
                     f"{row['torch_us']:.1f} | {row['speedup']:.1f}× |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for bench_verify.json")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()

    def log(text):
        print(text, flush=True)

    assert torch.cuda.is_available(), "bench_verify.py needs a CUDA GPU"
    assert verifier.use_triton(torch.device("cuda"))
    verifier.CUT_KERNEL_ON_GPU = True  # this run is what validates it
    report = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  vocab=VOCAB, k=K)
    log(json.dumps(report))
    report["checks"] = check_equal(151936, log) + check_equal(128256, log)
    ok = all(r["argmax_equal"] and r["verify_equal"] and r.get("sampled_equal", True)
             and r.get("differences_are_top_p_ties", True) for r in report["checks"])
    report["checks_passed"] = ok
    log(f"kernel == reference at 151936 and 128256: {ok}")
    if ok:
        report["timings"] = time_rounds(log)
        log(table(report["timings"]))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_verify.json").write_text(json.dumps(report, indent=2))
    # the test files last: their compiles take minutes, and their output streams to the log
    report["tests_passed"] = None if args.skip_tests else run_tests(log)
    return 0 if ok and report["tests_passed"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
