"""Where a batch round's time goes: the device's kernels against the host's settling, per round.

    PYTHONPATH=src python3 benchmarks/gpu/batch_kernels.py PAIR.toml [--batch-sizes 1,8,32] [--k 0,2]
        [--prompts 64] [-n 128] [--top 12]

For each (B, k) (k 0: target-only) the prompts go through the batch loop (core/batch_decode.py)
three times: a warm-up (captures, Triton compiles), a timed run, and a run under torch.profiler.
Per round it prints the wall time, the kernels' GPU time (CUDA graphs' kernels included), and the
host's share, each phase timed around the loop's own methods: settling a round (its sync
included: the wait for the device shows there), refills, launches. With two rounds in flight a
round costs about max(host, device): this says which one bounds a batch size.
"""

from __future__ import annotations

import argparse
import collections
import time
from dataclasses import replace

import torch

from specgen.core.engine import Engine
from specgen.core.profile import load_profile


class Timed:
    """Wraps decoder methods with perf_counter sums (an instrument for this script only)."""

    def __init__(self, decoder, names: tuple[str, ...]):
        self.seconds = collections.Counter()
        self.calls = collections.Counter()
        for name in names:
            setattr(decoder, name, self._wrap(name, getattr(decoder, name)))

    def _wrap(self, name, method):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1
        return timed


def sync() -> None:
    if torch.cuda.is_available():  # the script also runs on a CPU (a smoke test of its own code)
        torch.cuda.synchronize()


def one(engine: Engine, pair: str, batch: int, k: int, prompts: list[list[int]], tokens: int, top: int) -> None:
    overrides = {"speculation.k": max(k, 1), "sampling.max_tokens": tokens, "sampling.temperature": 0.0,
                 "sampling.ignore_eos": True}
    if k == 0:
        overrides["proposer.kind"] = "none"
    profile = load_profile(pair, overrides)
    decoder = engine.batch_decoder(batch, profile)
    work = [(ids, replace(profile.sampling, seed=i)) for i, ids in enumerate(prompts)]
    for _ in decoder.run(work[:batch]):  # warm: captures, compiles
        pass
    timed = Timed(decoder, ("_settle_round", "_refill", "_launch"))
    sync()
    start = time.perf_counter()
    finished = [f for _, f in decoder.run(work)]
    sync()
    wall = time.perf_counter() - start
    rounds = timed.calls["_settle_round"]
    host = dict(timed.seconds)  # the timed run's (the profiled run adds to the counters)
    made = sum(len(f.token_ids) for f in finished)
    cuda = torch.cuda.is_available()
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in decoder.run(work):
            pass
        sync()
    per = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if not cuda or event.device_type == torch.autograd.DeviceType.CUDA:
            row = per[event.name[:70]]
            row[0] += 1
            row[1] += event.time_range.elapsed_us()
    rounds2 = max(timed.calls["_settle_round"] - rounds, 1)  # the profiled run's rounds
    kernel_ms = sum(v[1] for v in per.values()) / rounds2 / 1e3
    ms = {name: 1e3 * host.get(name, 0.0) / rounds for name in ("_settle_round", "_refill", "_launch")}
    print(f"== B={batch} k={k} ({'target-only' if k == 0 else 'speculative'}, pipeline depth {decoder.depth}): "
          f"{made / wall:,.0f} tok/s, {rounds} rounds, {made / rounds / batch:.2f} tokens/row/round | per round: "
          f"wall {1e3 * wall / rounds:.3f} ms, kernels {kernel_ms:.3f} ms, settle+sync {ms['_settle_round']:.3f}, "
          f"refills {ms['_refill']:.3f}, launch {ms['_launch']:.3f} ms")
    print("launches/round  us/round  kernel")
    for name, (count, us) in sorted(per.items(), key=lambda item: -item[1][1])[:top]:
        print(f"{count / rounds2:6.1f} {us / rounds2:8.2f}  {name}")
    engine.forget_batches()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pair")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--k", default="0,2")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    engine = Engine(load_profile(args.pair))
    text = ["def quicksort(arr):\n    ", "The history of", "import numpy as np\n", "Once upon a time"]
    prompts = [engine.encode(text[i % len(text)] + " " * (i // len(text))) for i in range(args.prompts)]
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        for k in (int(k) for k in args.k.split(",")):
            one(engine, args.pair, batch, k, prompts, args.n, args.top)


if __name__ == "__main__":
    main()
