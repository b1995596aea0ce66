"""Where a decode round's "other" time goes: a torch.profiler trace (host and device) of whole
requests through the engine, greedy and sampled, plus a summary of the host's critical path.

    python benchmarks/trace_rounds.py [--pair .pairs/bench] [--compile] --out-dir traces/

"other" in the round split is wall time between two rounds' ends minus the fused round's device
phases. Per mode this prints the median per round of: the device gap between one round's graph
and the next (idle or running work outside the graph), the device work outside the graph (copies,
random draws) and the host time from the round's sync to the next graph launch, and writes the
Chrome trace (open it in Perfetto) with the per-round rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

MODES = {"greedy": dict(temperature=0.0), "t0.8-p0.95": dict(temperature=0.8, top_p=0.95)}


def device_events(trace: dict) -> list[dict]:
    """Complete device-side events (kernels, copies, graph-launched work), by start time."""
    out = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(out, key=lambda e: e["ts"])


def host_events(trace: dict, name: str) -> list[dict]:
    return sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
                   and e.get("name", "").startswith(name)), key=lambda e: e["ts"])


def summarize(trace: dict) -> dict:
    """Per round (between consecutive cudaGraphLaunch calls): host sync -> next launch, device
    work outside the graph, device idle time."""
    launches = host_events(trace, "cudaGraphLaunch")
    syncs = host_events(trace, "cudaEventSynchronize") + host_events(trace, "cudaStreamSynchronize")
    syncs.sort(key=lambda e: e["ts"])
    kernels = device_events(trace)
    graph_ids = {e["args"].get("correlation") for e in launches}
    rows = []
    for a, b in zip(launches, launches[1:]):
        window = [e for e in kernels if a["ts"] <= e["ts"] < b["ts"] + 5000]
        in_graph = [e for e in window if e["args"].get("correlation") == a["args"].get("correlation")]
        if not in_graph:
            continue
        graph_end = max(e["ts"] + e["dur"] for e in in_graph)
        next_graph = [e for e in kernels if e["args"].get("correlation") == b["args"].get("correlation")]
        if not next_graph:
            continue
        next_start = min(e["ts"] for e in next_graph)
        between = [e for e in kernels if graph_end <= e["ts"] < next_start and e["args"].get("correlation") not in graph_ids]
        done = [s for s in syncs if a["ts"] < s["ts"] < b["ts"]]
        sync_end = (done[-1]["ts"] + done[-1]["dur"]) if done else None
        rows.append({
            "graph_us": graph_end - min(e["ts"] for e in in_graph),
            "device_gap_us": next_start - graph_end,
            "outside_graph_device_us": sum(e["dur"] for e in between),
            "outside_graph_launches": len(between),
            "outside_graph_names": sorted({e["name"][:60] for e in between}),
            "sync_to_launch_us": (b["ts"] - sync_end) if sync_end is not None else None,
        })
    keys = ("graph_us", "device_gap_us", "outside_graph_device_us", "outside_graph_launches", "sync_to_launch_us")
    med = {k: statistics.median(r[k] for r in rows if r[k] is not None) for k in keys if rows}
    names = sorted({n for r in rows for n in r["outside_graph_names"]})
    return {"rounds": len(rows), "median": med, "outside_graph_kernels": names, "rows": rows}


def main(argv=None) -> None:
    from bench_e2e import make_profile, random_pair

    from specgen.core.engine import Engine, target_only

    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", type=Path)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    import tempfile

    pair = args.pair or random_pair(Path(tempfile.mkdtemp(prefix="specgen-random-pair-")))
    engine = Engine(make_profile(pair, args.k, args.max_new, compile=args.compile))
    prompt = engine.encode("def quicksort(arr):\n    ")[:64]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report = {}
    from dataclasses import replace

    for mode, sampling in MODES.items():
        for label, profile in (("speculative", None), ("target-only", "none")):
            prof = replace(engine.profile, sampling=replace(engine.profile.sampling, **sampling))
            if profile == "none":
                prof = target_only(prof)
            for _ in range(2):  # captures and warm-up
                *_, finished = engine.decoder(prof).run(prompt)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as p:
                *_, finished = engine.decoder(prof).run(prompt)
                torch.cuda.synchronize()
            path = args.out_dir / f"{mode}-{label}.json"
            p.export_chrome_trace(str(path))
            try:
                summary = summarize(json.loads(path.read_text()))
            except Exception as exc:  # noqa: BLE001 (the trace is kept for a look by hand)
                summary = {"rounds": 0, "median": {}, "outside_graph_kernels": [], "error": repr(exc)}
            stats = finished.stats
            summary["round_ms"] = {k: 1e3 * v / max(stats.rounds, 1) for k, v in stats.seconds.items()}
            report[f"{mode} {label}"] = summary
            print(f"{mode} {label}: {summary['rounds']} rounds, median {json.dumps(summary['median'])}, "
                  f"round ms {json.dumps({k: round(v, 3) for k, v in summary['round_ms'].items()})}", flush=True)
            print(f"  outside the graph: {summary['outside_graph_kernels']}", flush=True)
    (args.out_dir / "summary.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
