"""Where a round's device time goes: CUDA kernel times of the target's 1-token and (k+1)-token
steps and of a whole fused round, from torch.profiler over graph replays (bench-shaped random
weights, or a pair made by make_pair.py).

    python benchmarks/profile_steps.py [--pair .pairs/bench] [--compile] [--attention sdpa] --out profile.txt
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def main(argv=None) -> None:
    from bench_e2e import make_profile, random_pair

    from specgen.core.engine import Engine

    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", type=Path)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--temperature", type=float, default=0.0, help="> 0: the fused round samples (top-p 0.95)")
    parser.add_argument("--one", help="SDPA backends for 1-token steps, comma-separated SDPBackend names; 'default' = PyTorch's order")
    parser.add_argument("--many", help="the same for multi-token steps (gpu/runner.py STEP_ATTENTION_*)")
    parser.add_argument("--attention", choices=("kernel", "sdpa"), default="kernel",
                        help="steps attend through gpu/attention.py's kernel or through SDPA")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from specgen.gpu import runner

    for name, value in (("STEP_ATTENTION_ONE", args.one), ("STEP_ATTENTION_MANY", args.many)):
        if value is not None:
            setattr(runner, name, None if value == "default" else tuple(value.split(",")))
    runner.DECODE_ATTENTION = args.attention == "kernel"
    print(f"attention {args.attention}: SDPA 1 token {runner.STEP_ATTENTION_ONE or 'default'}, more {runner.STEP_ATTENTION_MANY or 'default'}; "
          f"compile {args.compile}", flush=True)
    pair = args.pair or random_pair(Path(tempfile.mkdtemp(prefix="specgen-profile-")))
    sampling = dict(temperature=args.temperature, top_p=0.95) if args.temperature > 0 else {}
    engine = Engine(make_profile(pair, args.k, 64, compile=args.compile, **sampling))
    decoder = engine.decoder()
    list(decoder.run(list(range(10, 110))))  # captures the fused round
    target = engine.target_runner
    report = []

    def replay(name, fn):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.replays):
            fn()
        end.record()
        torch.cuda.synchronize()
        per = start.elapsed_time(end) / args.replays
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(args.replays):
                fn()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70)
        report.append(f"## {name}: {per * 1e3:.1f} us per replay (events)\n{table}\n")
        print(report[-1], flush=True)

    position = target.length
    for n in (1, args.k + 1):
        graph = target.graphs[n].graph

        def step(graph=graph):
            target.position.fill_(position)
            graph.replay()
        replay(f"target {n}-token step graph", step)
    fused = decoder.fused
    if fused is not None and fused.graph is not None:
        saved = [target.position.clone(), engine.draft_runner.position.clone()]

        def round_():
            target.position.copy_(saved[0])
            engine.draft_runner.position.copy_(saved[1])
            fused.graph.replay()
        replay("fused round graph", round_)
    if args.out:
        args.out.write_text("\n".join(report))


if __name__ == "__main__":
    main()
