"""`specgen bench --batch-size 1,4,16`: batches, target-only against speculative, at each batch size.

At each batch size B the same prompts go through core/batch_decode.py's BatchDecoder (continuous
batching, B rows) once target-only (k = 0: a BatchRound without a draft) and once per k of the
sweep with the draft model, after an untimed warm-up over the B longest prompts (captures, and
caches grown to their size before the clock starts). What is measured, per run:

    tokens_per_second    every prompt's tokens over the wall seconds of the whole run (the
                         batch's throughput)
    row_ms_per_token     per row: the milliseconds from its start (its prefill included) to its
                         last token, over its tokens; summarised over the prompts as bench's other
                         figures are (median, p25, p75, min, max: what one request waits per token)

Speculation costs the draft's steps and a verification step k + 1 rows wide; at batch 1 those
are nearly free (the step streams the weights once whatever its rows), but as B grows a step's
rows cost compute of their own and the speculative round's extra rows stop paying.
`recommend` (core/batch_cost.py, which `batch_size` auto reads too) says, per batch size,
whether the best speculative run beats target-only there and where speculation stops paying: the
smallest measured B at which the best speculative tokens/s is below target-only's. A complete
bench keeps its rows for `batch_size` auto (core/measured.py, cli/bench.py).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from specgen.core.batch_cost import recommend  # noqa: F401 (the bench's recommendation, batch auto's too)
from specgen.core.stats import AcceptanceStats

SCHEMA = "specgen.bench.batches/1"


def measure(engine, prompt_ids: list[list[int]], settings_for: Callable, batch_sizes: tuple[int, ...],
            ks: tuple[int, ...], temperature: float, warmup: int = 1, progress=None) -> list[dict]:
    """Every (B, method) run: target-only (k 0) and each k of `ks`, at each batch size, in order.
    settings_for(k, temperature, proposer) -> Profile; progress(steps, label) after each run."""
    results = []
    for batch in batch_sizes:
        for k in (0, *ks):
            profile = settings_for(k or ks[0], temperature, "none" if k == 0 else "draft")
            label = f"batch {batch}, " + ("target-only" if k == 0 else f"k={k}")
            results.append(run(engine, profile, batch, prompt_ids, warmup))
            engine.forget_batches()  # its caches: B rows each, not kept past the run
            if progress is not None:
                progress(1, label)
    return results


def run(engine, profile, batch: int, prompt_ids: list[list[int]], warmup: int = 1) -> dict:
    """One timed run of every prompt through `batch` rows; each prompt its own seed (the profile's + i)."""
    import torch

    from specgen.core.bench.run import summarise

    decoder = engine.batch_decoder(batch, profile)
    base = profile.sampling.seed or 0
    work = [(ids, replace(profile.sampling, seed=base + i)) for i, ids in enumerate(prompt_ids)]
    longest = sorted(range(len(work)), key=lambda i: -len(work[i][0]))[:batch]
    for _ in range(warmup):
        for _ in decoder.run([work[i] for i in sorted(longest)]):
            pass
    cuda = decoder.round.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(decoder.round.device)
    began = time.perf_counter()
    finished = [f for _, f in decoder.run(work)]
    if cuda:
        torch.cuda.synchronize(decoder.round.device)
    seconds = time.perf_counter() - began
    tokens = sum(len(f.token_ids) for f in finished)
    stats = AcceptanceStats()
    for f in finished:
        stats.merge(f.stats)
    per_row = [1000 * f.stats.generation_seconds / len(f.token_ids) for f in finished if f.token_ids]
    k = decoder.round.k
    return {"batch_size": batch, "method": "speculative" if k else "target-only", "k": k,
            "prompts": len(work), "tokens": tokens, "seconds": seconds,
            "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
            "row_ms_per_token": summarise(per_row),
            "mean_accepted_length": stats.mean_accepted_length if k else None}


def document(results: list[dict], engine, temperature: float, startup_seconds: float, prompts: int,
             max_tokens: int, incomplete: bool = False) -> dict:
    """The JSON document of a batch bench (docs/bench-schema.md, "Batches")."""
    from specgen.core.engine import device_name

    recommendations, stops = recommend(results)
    profile = engine.profile
    pair = {"target": profile.target.path, "draft": profile.draft.path if profile.draft is not None else None,
            "device_name": device_name(engine.pair.device),
            "dtype": str(engine.pair.target.dtype).removeprefix("torch.")}
    return {"schema": SCHEMA, "profile": profile.name, "pair": pair, "environment": engine.describe(),
            "startup_seconds": startup_seconds, "temperature": temperature,
            "coupling": engine.profile.sampling.coupling if temperature > 0 else None,
            "prompts": prompts, "max_tokens": max_tokens,
            "batch_sizes": list(dict.fromkeys(r["batch_size"] for r in results)),
            "results": results, "recommendations": recommendations, "speculation_stops_paying_at": stops,
            "incomplete": incomplete}
