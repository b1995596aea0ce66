"""gpu/linear.py's kernel against F.linear (cuBLAS) on a model's projection shapes, over a grid of
kernel configurations: which configuration each row count wants, and what bandwidth it reaches.

    python benchmarks/bench_linear.py [--rows 1,5] [--out linear.json]
    python benchmarks/bench_linear.py --wide-k --rows 5 --shapes bench_down,...   # other tile shapes
    python benchmarks/bench_linear.py --split-k --shapes q_o,qkv,gate_up,down      # K split over programs

Shapes are Llama-3-8B's (bf16): q/o 4096x4096, k/v 1024x4096, fused q+k+v 6144x4096, gate+up 2 x 14336x4096 (fused with
the activation), down 4096x14336, lm_head 128256x4096. GB/s counts weight bytes.
Each configuration's output is checked against F.linear before it is timed. Times come from CUDA
graph replays (as in a step: no launch overhead) of one call per weight copy, with enough copies
that they do not fit in L2, so every call reads its weight from memory.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from specgen.gpu import linear as L

SHAPES = {"q_o": (4096, 4096), "k_v": (1024, 4096), "qkv": (6144, 4096), "gate_up": (14336, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096),
          # the bench pair's 100M target (make_pair.py --preset bench): hidden 768, MLP 2048, vocab 16384
          "bench_qkv": (1280, 768), "bench_o": (768, 768), "bench_gate_up": (2048, 768), "bench_down": (768, 2048),
          "bench_lm_head": (16384, 768)}
DOT_GRID = dict(dot=(True,), block_n=(16, 32, 64), block_k=(64, 128, 256), warps=(4,), stages=(3, 4, 5))
DEEP_GRID = dict(dot=(True,), block_n=(16, 32, 64), block_k=(256, 512), warps=(4, 8), stages=(4, 5, 6, 8))
# one or two K tiles per program: every weight load in flight at once (the bench pair's narrow layers, K <= 2048)
WIDE_K_GRID = dict(dot=(True,), block_n=(16, 32), block_k=(512, 1024, 2048), warps=(4, 8), stages=(1, 2))
# the register path with every row and a software-pipelined K walk
PIPELINED_GEMV_GRID = dict(dot=(False,), block_n=(2, 4), block_k=(128, 256, 512), warps=(4,), stages=(2, 3, 4))
# split-K: (dot, BN, BK, warps, stages, chunks of K); several programs per column block
SPLIT_K_GRID = dict(dot=(True,), block_n=(32,), block_k=(128, 256), warps=(4,), stages=(3, 4, 5), split=(2, 3, 4))
GEMV_GRID = dict(dot=(False,), block_n=(2, 4, 8), block_k=(1024, 2048), warps=(4, 8), stages=(1,))
L2_BYTES = 256 * 2**20  # weight copies per timing: more than any L2


SMALL_ROWS_GEMV_GRID = dict(dot=(False,), block_n=(1, 2, 4), block_k=(64, 128, 256), warps=(2, 4), stages=(1,))


def configs(rows: int, deep: bool = False, wide_k: bool = False, split_k: bool = False):
    if split_k:  # and the default, for comparison
        yield L.WIDE
        yield from itertools.product(*SPLIT_K_GRID.values())
        return
    if deep:  # deeper pipelines and longer K tiles (more bytes in flight per SM)
        yield from itertools.product(*DEEP_GRID.values())
        return
    if wide_k:  # and the default configurations, for comparison
        yield from itertools.product(*WIDE_K_GRID.values())
        yield from itertools.product(*PIPELINED_GEMV_GRID.values())
        yield L.NARROW
        yield L.WIDE
        return
    yield from itertools.product(*DOT_GRID.values())
    if rows == 1:
        yield from itertools.product(*GEMV_GRID.values())
    elif rows <= 8:  # the register path with every row: small tiles keep rows x N x K in registers
        yield from itertools.product(*SMALL_ROWS_GEMV_GRID.values())


def graph_us(fn, copies: int, replays: int = 10) -> float:
    """Microseconds per call: a CUDA graph of `copies` calls (fn(i) uses weight copy i), replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn(i)
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / copies)
    del graph
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,5")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--deep", action="store_true", help="sweep DEEP_GRID instead")
    parser.add_argument("--wide-k", action="store_true",
                        help="sweep WIDE_K_GRID and PIPELINED_GEMV_GRID (and the defaults) instead")
    parser.add_argument("--split-k", action="store_true", help="sweep SPLIT_K_GRID (and the default) instead")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": []}
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        gated = name == "gate_up"
        weight_bytes = n * k * 2 * (2 if gated else 1)
        copies = max(2, -(-L2_BYTES // weight_bytes))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
        us = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)] if gated else None
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            if gated:
                def torch_fn(i):
                    return F.silu(F.linear(x, ws[i])) * F.linear(x, us[i])
                def kernel_fn(i, config):
                    return L.gate_up(x, ws[i], us[i], "silu", config)
            else:
                def torch_fn(i):
                    return F.linear(x, ws[i])
                def kernel_fn(i, config):
                    return L.linear(x, ws[i], None, config)
            expected = torch_fn(0).float()
            torch_us = graph_us(torch_fn, copies)
            best = None
            for config in configs(rows, args.deep, args.wide_k, args.split_k):
                try:
                    got = kernel_fn(0, config).float()
                except Exception as exc:  # noqa: BLE001 (out of resources: skip the configuration)
                    print(f"  {name} rows={rows} {config}: {type(exc).__name__}", flush=True)
                    continue
                err = ((got - expected).abs().max() / expected.abs().max()).item()
                if err > 0.02:
                    raise SystemExit(f"{name} rows={rows} {config}: relative error {err:.3g}")
                us_ = graph_us(lambda i: kernel_fn(i, config), copies, replays=3)
                print(f"  {name} rows={rows} {config}: {us_:.1f} us", flush=True)
                if best is None or us_ < best[0]:
                    best = (us_, config, err)
            _, config, err = best
            kernel_us = graph_us(lambda i: kernel_fn(i, config), copies)
            row = {"shape": name, "n": n, "k": k, "rows": rows, "config": config, "kernel_us": kernel_us,
                   "torch_us": torch_us, "kernel_gb_s": weight_bytes / kernel_us / 1e3,
                   "torch_gb_s": weight_bytes / torch_us / 1e3, "speedup": torch_us / kernel_us, "rel_err": err}
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n| shape | rows | config (dot, BN, BK, warps, stages[, K chunks]) | kernel us | GB/s | cuBLAS us | GB/s | speed-up |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in report["rows"]:
        print(f"| {r['shape']} | {r['rows']} | {tuple(r['config'])} | {r['kernel_us']:.1f} | {r['kernel_gb_s']:.0f} | "
              f"{r['torch_us']:.1f} | {r['torch_gb_s']:.0f} | {r['speedup']:.2f} |")


if __name__ == "__main__":
    main()
