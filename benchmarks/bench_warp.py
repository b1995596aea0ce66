"""The sampled pick at batch 1: warp (temperature + top-p) of 1 and k + 1 rows, and the draft's
race, per kernel, replayed from CUDA graphs (as the fused round runs them).

    python3 benchmarks/bench_warp.py [--vocab 16384,128256] [--rows 1,5] [--out DIR]

Check first, then time: for each (vocab, rows, logit spread) the kernel's kept sets equal the torch
reference's (a difference allowed only as the documented float32 top-p tie), its argmax equal and
its sampled ids equal under the same Exp(1) draws. Logits: N(0, spread^2) float32 with the spreads
1, 2, 4 (top-p 0.95 at t 0.8 then keeps most of the vocabulary, hundreds of ids, a handful).
Timings: median µs of triton.testing.do_bench_cudagraph over the captured warp (and pick), and the
mean device time of each kernel from torch.profiler over 50 replays; with the parallel cut search
(gpu/warp.py FAST_CUT, the default) and with the one-program search alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).parent))

from specgen.core import sampling, verifier  # noqa: E402
from specgen.gpu import warp as gpu_warp  # noqa: E402

SPREADS = (1.0, 2.0, 4.0)
CONFIGS = {
    "t0.8 top-p 0.95": dict(temperature=0.8, top_p=0.95),
    "t0.8 top-k 50 top-p 0.9": dict(temperature=0.8, top_k=50, top_p=0.9),
}


def params_for(rows: int, config: dict) -> sampling.WarpParams:
    from bench_verify import params_for as make

    return make(rows, config)


def check(logits, params) -> dict:
    from bench_verify import _is_top_p_tie

    argmax, probs = verifier.warp(logits, params)
    ref_argmax, ref_probs = sampling.warp(logits, params)
    expo = sampling.exponentials(probs.shape, torch.Generator(device="cuda").manual_seed(3), "cuda")
    differ = ((probs > 0) != (ref_probs > 0)).any(dim=-1)
    return dict(
        argmax_equal=bool(torch.equal(argmax, ref_argmax)),
        sampled_equal=bool(torch.equal(sampling.sample_race(probs, expo), sampling.sample_race(ref_probs, expo))),
        kept=[(row > 0).sum().item() for row in ref_probs],
        rows_differing=int(differ.sum()),
        differences_are_ties=all(_is_top_p_tie(logits[r], params, None, r, probs[r], ref_probs[r])
                                 for r in differ.nonzero().flatten().tolist()),
        max_abs_prob_diff=float((probs - ref_probs).abs().max()),
    )


def per_kernel(fn, replays: int = 50) -> dict[str, float]:
    """Mean device µs per replay of each kernel name, from torch.profiler."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:60]] += event.device_time / replays
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def sweep() -> list[dict]:
    """warp µs of one t 0.8 / top-p 0.95 row for each parallel-search configuration (kept sets checked)."""
    defaults = (gpu_warp.FAST_CHUNK["cuda"], gpu_warp.FAST_WARPS, gpu_warp.FAST_PIVOTS)
    rows = []
    for vocab in (16384, 128256):
        for spread in (1.0, 4.0):
            logits = torch.randn(1, vocab, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)) * spread
            params = params_for(1, CONFIGS["t0.8 top-p 0.95"])
            for chunk in (1024, 2048, 4096):
                for warps in (4, 8):
                    for pivots in (16, 32):
                        gpu_warp.FAST_CHUNK["cuda"], gpu_warp.FAST_WARPS, gpu_warp.FAST_PIVOTS = chunk, warps, pivots
                        row = dict(vocab=vocab, spread=spread, chunk=chunk, warps=warps, pivots=pivots,
                                   **check(logits, params))
                        row["parallel_rows"] = sum(gpu_warp.fast_rows(1, "cuda"))
                        row["warp_us"] = 1000 * triton.testing.do_bench_cudagraph(
                            lambda: verifier.warp(logits, params), rep=100, return_mode="median")
                        rows.append(row)
                        print(json.dumps({k: row[k] for k in ("vocab", "spread", "chunk", "warps", "pivots",
                                                               "parallel_rows", "sampled_equal", "warp_us")}), flush=True)
    gpu_warp.FAST_CHUNK["cuda"], gpu_warp.FAST_WARPS, gpu_warp.FAST_PIVOTS = defaults
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default="16384,128256")
    parser.add_argument("--rows", default="1,5")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--sweep", action="store_true", help="also time the parallel search's chunk / warps / pivots")
    args = parser.parse_args(argv)
    assert torch.cuda.is_available(), "bench_warp.py needs a CUDA GPU"
    report = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, runs=[])
    ok = True
    for vocab in map(int, args.vocab.split(",")):
        for rows in map(int, args.rows.split(",")):
            for name, config in CONFIGS.items():
                for spread in SPREADS:
                    gen = torch.Generator(device="cuda").manual_seed(vocab + rows)
                    logits = torch.randn(rows, vocab, device="cuda", generator=gen) * spread
                    params = params_for(rows, config)
                    row = dict(vocab=vocab, rows=rows, config=name, spread=spread, **check(logits, params))
                    ok &= row["argmax_equal"] and row["sampled_equal"] and row["differences_are_ties"]
                    expo = sampling.exponentials((rows, vocab), gen, "cuda")
                    out = torch.zeros(rows, dtype=torch.long, device="cuda")

                    def warp_only():
                        verifier.warp(logits, params)

                    def pick():  # as gpu/loop.py's captured pick: warp and race into the draft's buffer
                        verifier.warp_and_race(logits, params, expo, out)

                    row["parallel_rows"] = sum(gpu_warp.fast_rows(rows, "cuda"))
                    for search in ("parallel", "one-program"):
                        gpu_warp.FAST_CUT = search == "parallel"
                        suffix = "" if search == "parallel" else "_one_program"
                        row["warp_us" + suffix] = 1000 * triton.testing.do_bench_cudagraph(
                            warp_only, rep=200, return_mode="median")
                        row["pick_us" + suffix] = 1000 * triton.testing.do_bench_cudagraph(
                            pick, rep=200, return_mode="median")
                        row["kernels_us" + suffix] = per_kernel(pick)
                    gpu_warp.FAST_CUT = True
                    report["runs"].append(row)
                    print(json.dumps(row), flush=True)
    if args.sweep:
        report["sweep"] = sweep()
    report["checks_passed"] = ok
    print(f"checks passed: {ok}")
    print("| vocab | rows | config | spread | kept (row 0) | rows in parallel search | warp µs | pick µs "
          "| one-program warp µs | one-program pick µs |")
    for r in report["runs"]:
        print(f"| {r['vocab']} | {r['rows']} | {r['config']} | {r['spread']} | {r['kept'][0]} | "
              f"{r['parallel_rows']}/{r['rows']} | {r['warp_us']:.1f} | {r['pick_us']:.1f} | "
              f"{r['warp_us_one_program']:.1f} | {r['pick_us_one_program']:.1f} |")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_warp.json").write_text(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
