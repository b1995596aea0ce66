"""Proposers on CPU: n-gram prompt lookup, the hybrid and adaptive speculation against target-only, one process.

    python benchmarks/bench_ngram.py --prompts 12 --max-new 64 --reps 3
    python benchmarks/bench_ngram.py --only "target only,n-gram k=8,hybrid"  # a subset (name prefixes)

Pair: the shipped demo pair (src/specgen/builtin/demo, float32 on CPU). Two workloads built from
its held-out prompts (the first 128 tokens of held-out standard-library files):

- copy: the prompt text, a blank line, then its first third again; the target goes on copying
  code it has already seen (the case prompt lookup is for: edits, refactors, quoting a context);
- plain: the prompt as it is (open-ended continuation), as a control.

Every configuration runs greedy on the same prompts; before timing, each one's output is checked
to equal target-only output. Timing interleaves the configurations prompt by prompt, so that load
from other processes falls on all of them alike; tokens/s is new tokens over wall time, prefill
included, summed over prompts; the median over --reps repetitions is reported, with the range.
"n-gram rounds" is the share of the hybrid's rounds that prompt lookup drafted (the rest: the draft).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from specgen.core.engine import Engine
from specgen.core.profile import load_profile

DEMO = Path(__file__).resolve().parents[1] / "src" / "specgen" / "builtin" / "demo"

# name -> (proposer kind, k, proposer keys)
CONFIGS = {
    "target only": ("none", 0, {}),
    "n-gram k=4": ("ngram", 4, {"ngram_min": 2, "ngram_max": 4}),
    "n-gram k=8": ("ngram", 8, {"ngram_min": 2, "ngram_max": 4}),
    "draft k=4": ("draft", 4, {}),
    "draft k=8": ("draft", 8, {}),
    "draft k=8 adaptive": ("draft", 8, {"adaptive_k": True}),
    "draft k=8 p_min 0.4": ("draft", 8, {"draft_p_min": 0.4}),
    "draft k=8 adaptive + p_min 0.4": ("draft", 8, {"adaptive_k": True, "draft_p_min": 0.4}),
    "hybrid k=4": ("hybrid", 4, {}),
    "hybrid k=8": ("hybrid", 8, {}),
    "hybrid k=8 adaptive": ("hybrid", 8, {"adaptive_k": True}),
    "hybrid k=8 p_min 0.4": ("hybrid", 8, {"draft_p_min": 0.4}),
}


def workloads(engine: Engine, count: int) -> dict[str, list[list[int]]]:
    lines = (DEMO / "prompts.jsonl").read_text().splitlines()
    texts = [json.loads(line)["prompt"] for line in lines if line.strip()][:count]
    copies = []
    for text in texts:
        head = text.splitlines(keepends=True)
        copies.append(text + "\n\n" + "".join(head[: max(1, len(head) // 3)]))
    return {"copy": [engine.encode(t) for t in copies], "plain": [engine.encode(t) for t in texts]}


def profile_for(base, name: str, max_new: int):
    kind, k, keys = CONFIGS[name]
    return replace(base, proposer=replace(base.proposer, kind=kind, **keys),
                   speculation=replace(base.speculation, k=max(k, 1)),
                   sampling=replace(base.sampling, temperature=0.0, max_tokens=max_new, ignore_eos=True))


def run(engine: Engine, profile, prompt: list[int]):
    """(wall seconds, the Finished event, the hybrid's rounds per proposer or None)."""
    start = time.perf_counter()
    decoder = engine.decoder(profile)
    for event in decoder.run(prompt):
        pass
    return time.perf_counter() - start, event, getattr(decoder.proposer, "rounds", None)


def measure(engine: Engine, profiles: dict, prompts: list[list[int]], reps: int) -> dict[str, dict]:
    reference = [run(engine, profiles["target only"], p)[1].token_ids for p in prompts]
    for name, profile in profiles.items():  # validate first (and warm up), then time
        for prompt, expected in zip(prompts, reference):
            assert run(engine, profile, prompt)[1].token_ids == expected, f"{name}: output differs"
    seconds = {name: [] for name in profiles}
    finals = {name: [] for name in profiles}
    lookups = dict.fromkeys(profiles, 0)  # hybrid rounds drafted by prompt lookup
    for _ in range(reps):
        total = dict.fromkeys(profiles, 0.0)
        for prompt in prompts:
            for name, profile in profiles.items():
                wall, finished, rounds = run(engine, profile, prompt)
                total[name] += wall
                finals[name].append(finished.stats)
                lookups[name] += rounds["ngram"] if rounds else 0
        for name in profiles:
            seconds[name].append(total[name])
    tokens = sum(len(r) for r in reference)
    base = statistics.median(seconds["target only"])
    return {name: summary(tokens, seconds[name], base, finals[name], lookups[name], profiles[name].proposer.kind)
            for name in profiles}


def summary(tokens: int, walls: list[float], base: float, stats: list, lookups: int, kind: str) -> dict:
    rounds = sum(s.rounds for s in stats)
    drafted = sum(s.drafted for s in stats)
    wall = statistics.median(walls)
    return {
        "tok_per_s": tokens / wall,
        "tok_per_s_range": [tokens / max(walls), tokens / min(walls)],
        "speedup": base / wall,
        "ngram_round_share": lookups / rounds if kind == "hybrid" else None,
        "acceptance": sum(s.accepted for s in stats) / drafted if drafted else 0.0,
        "mean_accepted_length": sum(s.emitted for s in stats) / rounds,
        "mean_k": sum(s.k_total for s in stats) / rounds,
        "early_stop_share": sum(s.early_stops for s in stats) / rounds,
    }


def table(results: dict[str, dict[str, dict]]) -> str:
    out = ["| workload | proposer | tok/s | range | vs target only | acceptance | mean accepted length | mean k "
           "| early stops | n-gram rounds |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for workload, rows in results.items():
        for name, r in rows.items():
            low, high = r["tok_per_s_range"]
            share = "–" if r["ngram_round_share"] is None else f"{r['ngram_round_share']:.0%}"
            out.append(f"| {workload} | {name} | {r['tok_per_s']:.1f} | {low:.1f}–{high:.1f} | {r['speedup']:.2f}x | "
                       f"{r['acceptance']:.1%} | {r['mean_accepted_length']:.2f} | {r['mean_k']:.2f} | "
                       f"{r['early_stop_share']:.0%} | {share} |")
    return "\n".join(out)


def chosen(only: str | None) -> list[str]:
    if only is None:
        return list(CONFIGS)
    prefixes = [p.strip() for p in only.split(",") if p.strip()]
    names = ["target only"] + [n for n in CONFIGS if n != "target only" and n.startswith(tuple(prefixes))]
    if len(names) == 1:
        raise SystemExit(f"--only {only!r} matches no configuration; names: {', '.join(CONFIGS)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--only", default=None,
                        help="comma list of name prefixes to run (target only always runs), e.g. 'n-gram k=8,hybrid'")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = load_profile("demo", {"target.device": "cpu", "draft.device": "cpu"})
    engine = Engine(base)
    profiles = {name: profile_for(base, name, args.max_new) for name in chosen(args.only)}
    results = {name: measure(engine, profiles, prompts, args.reps)
               for name, prompts in workloads(engine, args.prompts).items()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.prompts} prompts, "
          f"{args.max_new} new tokens, median of {args.reps}")
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
