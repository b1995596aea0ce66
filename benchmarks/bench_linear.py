"""gpu/linear.py's kernel against F.linear (cuBLAS) on a model's projection shapes, over a grid of
kernel configurations: which configuration each row count wants, and what bandwidth it reaches.

    python benchmarks/bench_linear.py [--rows 1,5] [--out linear.json]

Shapes are Llama-3-8B's (bf16): q/o 4096x4096, k/v 1024x4096, gate+up 2 x 14336x4096 (fused with
the activation), down 4096x14336, lm_head 128256x4096. Times are triton.testing.do_bench medians
(L2 flushed between calls, as in a step where every weight is read once); GB/s counts weight bytes.
Each configuration's output is checked against F.linear before it is timed.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from specgen.gpu import linear as L

SHAPES = {"q_o": (4096, 4096), "k_v": (1024, 4096), "gate_up": (14336, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
GRID = dict(block_n=(4, 8, 16, 32), block_k=(128, 256, 512, 1024), warps=(4, 8), stages=(1, 3))


def configs(rows: int):
    block_m = triton.next_power_of_2(rows)
    for block_n, block_k, warps, stages in itertools.product(*GRID.values()):
        if block_m * block_n * block_k <= 128 * 32 * warps and block_n * block_k >= 32 * warps:
            yield (block_n, block_k, warps, stages)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,5")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": []}
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        u = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 if name == "gate_up" else None
        weight_bytes = w.numel() * 2 * (2 if u is not None else 1)
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            if u is not None:
                def torch_fn():
                    return F.silu(F.linear(x, w)) * F.linear(x, u)
                def kernel_fn(config):
                    return L.gate_up(x, w, u, "silu", config)
            else:
                def torch_fn():
                    return F.linear(x, w)
                def kernel_fn(config):
                    return L.linear(x, w, None, config)
            expected = torch_fn().float()
            torch_ms = do_bench(torch_fn, warmup=10, rep=40)
            best = None
            for config in configs(rows):
                try:
                    got = kernel_fn(config).float()
                except Exception as exc:  # noqa: BLE001 (out of resources: skip the configuration)
                    print(f"  {name} rows={rows} {config}: {type(exc).__name__}", flush=True)
                    continue
                err = ((got - expected).abs().max() / expected.abs().max()).item()
                if err > 0.02:
                    raise SystemExit(f"{name} rows={rows} {config}: relative error {err:.3g}")
                ms = do_bench(lambda: kernel_fn(config), warmup=5, rep=20)
                if best is None or ms < best[0]:
                    best = (ms, config, err)
            ms, config, err = best
            ms = do_bench(lambda: kernel_fn(config), warmup=10, rep=60)
            row = {"shape": name, "n": n, "k": k, "rows": rows, "config": config, "kernel_us": ms * 1e3,
                   "torch_us": torch_ms * 1e3, "kernel_gb_s": weight_bytes / ms / 1e6,
                   "torch_gb_s": weight_bytes / torch_ms / 1e6, "speedup": torch_ms / ms, "rel_err": err}
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n| shape | rows | config (BN, BK, warps, stages) | kernel us | GB/s | cuBLAS us | GB/s | speed-up |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in report["rows"]:
        print(f"| {r['shape']} | {r['rows']} | {tuple(r['config'])} | {r['kernel_us']:.1f} | {r['kernel_gb_s']:.0f} | "
              f"{r['torch_us']:.1f} | {r['torch_gb_s']:.0f} | {r['speedup']:.2f} |")


if __name__ == "__main__":
    main()
