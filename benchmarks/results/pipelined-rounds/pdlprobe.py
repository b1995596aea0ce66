"""The round's warp/verify kernels launched plainly against dependent (backend.dependent_launch),
the step kernels dependent in both: wall tok/s of target-only and k = 4 at t 0.8, then one round's
kernel timeline of each from the profiler. argv: pair.toml, out folder."""
import json
import sys
import time

import torch

from specgen.core.engine import Engine
from specgen.core.profile import load_profile

path, out = sys.argv[1], sys.argv[2]


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


base = {"sampling.temperature": 0.8, "sampling.top_p": 0.95, "sampling.max_tokens": 300, "sampling.ignore_eos": True,
        "speculation.k": 4}
profile = load_profile(path, base)
engine = Engine(profile)
ids = engine.tokenizer("The history of the city begins")["input_ids"]


def decoder(flag, kind):
    engine.backend.dependent_launch = flag
    engine._rounds.clear()
    return engine.decoder(profile, proposer_kind=kind)


def timed(flag, kind):
    dec = decoder(flag, kind)
    list(dec.run(ids))
    sync()
    t = time.perf_counter()
    events = list(dec.run(ids))
    sync()
    wall = time.perf_counter() - t
    stats = events[-1].stats
    n = len(events[-1].token_ids)
    return n / wall, stats


for rep in range(2):
    for flag in (False, True):
        for kind in ("none", "draft"):
            rate, stats = timed(flag, kind)
            phases = {k: round(v * 1e3 / max(1, stats.rounds), 4) for k, v in stats.seconds.items()}
            print(f"rep {rep} dependent={flag} {kind}: {rate:.0f} tok/s rounds {stats.rounds} {phases}", flush=True)

for flag in (False, True):
    for kind in ("none", "draft"):
        dec = decoder(flag, kind)
        list(dec.run(ids))
        sync()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                torch.profiler.ProfilerActivity.CPU]) as prof:
            list(dec.run(ids))
            sync()
        trace = f"{out}/trace-{kind}-{flag}.json"
        prof.export_chrome_trace(trace)
        events = json.load(open(trace))["traceEvents"]
        kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                         key=lambda e: e["ts"])
        launches = sorted(e["ts"] for e in events if e.get("name") in ("cudaGraphLaunch", "cudaGraphLaunch_v10000"))
        print(f"== dependent={flag} {kind}: {len(kernels)} kernels, {len(launches)} graph launches", flush=True)
        if len(launches) > 12:
            lo, hi = launches[10], launches[12]
            window = [e for e in kernels if lo <= e["ts"] < hi]
            prev = None
            busy = sum(e["dur"] for e in window)
            print(f"rounds 10-11: {len(window)} kernels, busy {busy:.1f} us, span "
                  f"{window[-1]['ts'] + window[-1]['dur'] - window[0]['ts']:.1f} us")
            for e in window:
                gap = e["ts"] - (prev["ts"] + prev["dur"]) if prev else 0.0
                print(f"  {gap:7.2f} {e['dur']:7.2f}  {e['name'][:90]}")
                prev = e
