"""Where a round's time goes, kernel by kernel: torch.profiler over greedy decodes of one prompt
with the chain round and with tree shapes, from the first round's tokens on (the prefill left
out), each kernel name's launches and GPU time per round (CUDA graphs' kernels included), and the
round's wall time against the kernels' sum (the rest is gaps between launches).

    PYTHONPATH=src python3 benchmarks/gpu/round_kernels.py PAIR.toml [--k 4] [--shapes 1:0,2:8,4:16]
        [-n 128] [--top 25] [--temperature 0] [--top-p 1] [--proposer eagle] [--context 1024]

A shape is width:nodes (1:0 the chain). Written to find what a tree round adds to a chain's.
With dependent launch on (the kernels' `dependent_launch`), a kernel starts before the one ahead of
it ends and waits inside: its time here includes that wait, so the kernel times add up to more
than the round's wall time, and a kernel that follows a long one looks longer than it runs. Compare
a kernel's time across shapes, not against the wall time.
--context N: the prompt's tokens repeated to N tokens (attention over a prefix of that length;
the default prompt is about ten tokens).
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from specgen.core.engine import Engine
from specgen.core.events import Finished
from specgen.core.profile import load_profile


def decode(decoder, ids, begin=None) -> tuple[Finished, int]:
    """A whole decode; (its Finished, rounds counted). With `begin`, it is called once the first
    round's tokens arrive and only the rounds after are counted: the prompt's prefill and the
    first round stay out of the figures (after a long --context prompt the prefill was a third of
    a 32-round decode's kernel time)."""
    rounds, started = 0, begin is None
    for event in decoder.run(ids):
        if isinstance(event, Finished):
            return event, rounds
        if started:
            rounds += 1
        else:
            torch.cuda.synchronize()
            begin()
            started = True
    raise RuntimeError("the decode ended without Finished")


def profile_shape(engine: Engine, pair: str, k: int, width: int, nodes: int, tokens: int, temperature: float,
                  prompt: list[int], proposer: str | None = None, top_p: float = 1.0) -> tuple[dict, list[str]]:
    overrides = {"speculation.k": k, "speculation.tree_width": width, "speculation.tree_nodes": nodes,
                 "sampling.max_tokens": tokens, "sampling.temperature": temperature, "sampling.top_p": top_p,
                 "sampling.ignore_eos": True}
    if proposer:
        overrides["proposer.kind"] = proposer
    decoder = engine.decoder(load_profile(pair, overrides))
    decode(decoder, prompt)  # warm: captures, Triton compiles
    torch.cuda.synchronize()
    start = [0.0]
    _, rounds = decode(decoder, prompt, lambda: start.__setitem__(0, time.perf_counter()))
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start[0]) / rounds * 1e3
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    finished, rounds = decode(decoder, prompt, prof.start)
    torch.cuda.synchronize()
    prof.stop()
    per = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            row = per[event.name[:70]]
            row[0] += 1
            row[1] += event.time_range.elapsed_us()
    kernels_us = sum(v[1] for v in per.values()) / rounds
    launches = sum(v[0] for v in per.values()) / rounds
    label = "chain" if width == 1 else f"w={width} n={nodes}"
    summary = {"shape": label, "rounds": rounds, "tokens_per_round": len(finished.token_ids) / rounds,
               "wall_ms_per_round": round(wall, 4), "kernel_ms_per_round": round(kernels_us / 1e3, 4),
               "launches_per_round": round(launches, 1)}
    lines = [f"{v[0] / rounds:6.1f} {v[1] / rounds:8.2f}  {name}" for name, v in
             sorted(per.items(), key=lambda item: -item[1][1])]
    return summary, lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pair")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--shapes", default="1:0,2:8,4:16")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--proposer", default=None, help="the profile's proposer unless given (draft, eagle)")
    parser.add_argument("--context", type=int, default=0, help="repeat the prompt to this many tokens")
    args = parser.parse_args()
    # the engine loads the drafters of the profile's proposer: the one profiled, where given
    engine = Engine(load_profile(args.pair, {"proposer.kind": args.proposer} if args.proposer else {}))
    prompt = engine.encode("def quicksort(arr):\n    ")
    if args.context > len(prompt):
        prompt = (prompt * (args.context // len(prompt) + 1))[: args.context]
    for shape in args.shapes.split(","):
        width, nodes = (int(x) for x in shape.split(":"))
        summary, lines = profile_shape(engine, args.pair, args.k, width, nodes, args.n, args.temperature, prompt,
                                       args.proposer, args.top_p)
        print(f"== {summary}")
        print("launches/round  us/round  kernel")
        print("\n".join(lines[: args.top]))


if __name__ == "__main__":
    main()
