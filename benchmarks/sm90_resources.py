"""Registers, spilled bytes and shared memory of the attention and linear kernels' real launches,
compiled for an H100/H200 (sm_90) on a CPU: how many programs an SM holds, without a GPU.

    python benchmarks/sm90_resources.py attention [--rows 7,33] [--prefix 1000] [--capacity 2048]
    python benchmarks/sm90_resources.py linear [--rows 1,7,33,80]
    python benchmarks/sm90_resources.py warp [--rows 33] [--vocab 128256]

Why: a latency-bound kernel runs as fast as the programs an SM holds at once, and that follows from
what ptxas allocates, which only a compile shows. On 2026-11-29 this found that the tree attention's
split kernel took 232 registers a thread (2 programs an SM) against a chain's 146 (3 an SM), with
the Triton of the GPU image (3.6): numbers depend on the Triton version, so run it with the one the
GPU runs.

How: the wrappers (gpu/kernels/attention.py, linear.py) are called with CPU tensors and
JITFunction.run replaced by tests/sm90_compile.py's harness, which specialises each launch as a GPU
launch is specialised; here each is compiled to a cubin (triton.compile, ptxas included), whose
`.nv.info` section holds the register count and the stack frame (spills). Llama-3.1-8B shapes:
attention 32 heads, 8 KV heads, head dim 128, bf16, rotary in the kernel (a chain of `rows` tokens,
or a width-4 token tree of `rows` nodes after `prefix` tokens); linear the target's projections
with the package table's picks and launches at each row count.

Programs an SM (sm_90: 65,536 registers, 228 KiB of shared memory of which a program may take
227, 1 KiB of it reserved a program, at most 32 programs): the least of registers (allocated a warp
at a time, in units of 256) and shared memory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REGISTERS, SHARED, RESERVED, MOST_PROGRAMS = 65536, 228 * 1024, 1024, 32
EIATTR_FRAME_SIZE, EIATTR_REGCOUNT = 0x11, 0x2F


def cubin_resources(cubin: bytes) -> dict:
    """{"registers", "spill_bytes"} of a one-kernel cubin: the EIATTR_REGCOUNT and EIATTR_FRAME_SIZE
    attributes of its `.nv.info` section (each: format byte, attribute byte, u16 size, payload
    (symbol u32, value u32))."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    entsize, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]
    strings = headers[names][4]
    out = {}
    for header in headers:
        start = strings + header[0]
        if cubin[start:cubin.index(b"\0", start)] != b".nv.info":
            continue
        at, end = header[4], header[4] + header[5]
        while at + 4 <= end:
            attribute, size = cubin[at + 1], struct.unpack_from("<H", cubin, at + 2)[0]
            if attribute in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and size == 8:
                value = struct.unpack_from("<I", cubin, at + 8)[0]
                out["registers" if attribute == EIATTR_REGCOUNT else "spill_bytes"] = value
            at += 4 + size
    return out


def programs_per_sm(registers: int, shared: int, warps: int) -> int:
    """Programs of `warps` warps an sm_90 SM holds at once (the module's docstring)."""
    per_warp = math.ceil(registers * 32 / 256) * 256
    by_registers = REGISTERS // (per_warp * warps) if registers else MOST_PROGRAMS
    by_shared = SHARED // (shared + RESERVED)
    return max(0, min(by_registers, by_shared, MOST_PROGRAMS, 2048 // (32 * warps)))


def _harness(report: list[dict]):
    """tests/sm90_compile.py's harness, compiling each distinct launch to a cubin and reporting it."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["SPECGEN_SM90_STAGE"] = "cubin"
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "src")]
    import sm90_compile
    import triton
    from triton.runtime.jit import JITFunction

    class Resources(sm90_compile.Harness):
        def compile(self, fn, options, signature, constexprs, attrs):
            kernel = triton.compile(self.ASTSource(fn, signature, constexprs, attrs), target=self.target,
                                    options=options.__dict__)
            named = {fn.params[path[0]].name: value for path, value in constexprs.items()
                     if len(path) == 1 and fn.params[path[0]].is_constexpr}
            found = cubin_resources(kernel.asm["cubin"])
            shared = kernel.metadata.shared
            row = {"launch": self.scenario, "kernel": fn.__name__, "warps": options.num_warps,
                   "stages": options.num_stages, **found, "shared_bytes": shared,
                   "programs_per_sm": programs_per_sm(found.get("registers", 0), shared, options.num_warps),
                   "tile": {k: named[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K") if k in named}}
            report.append(row)
            print(json.dumps(row), flush=True)

    sm90_compile.HARNESS = Resources()
    JITFunction.run = sm90_compile._run
    return sm90_compile.HARNESS, triton.__version__


def attention(args, harness) -> None:
    import torch
    from rows_helpers import random_tree

    from specgen.core.step import rows as rowsets
    from specgen.gpu.kernels import attention as kernels

    heads, kv_heads, dim, bf16 = 32, 8, 128, torch.bfloat16
    for rows in args.rows:
        for layout in ("chain", "tree"):
            harness.scenario = f"attention {layout} rows={rows} prefix={args.prefix} capacity={args.capacity}"
            query = torch.empty(1, rows, heads, dim, dtype=bf16).transpose(1, 2)
            key = torch.empty(1, kv_heads, args.capacity, dim, dtype=bf16)
            new = torch.empty(1, rows, kv_heads, dim, dtype=bf16).transpose(1, 2)
            cos = torch.empty(1, rows, dim, dtype=bf16)
            start = torch.tensor([args.prefix])
            tail = depth = None
            if layout == "tree":
                made = rowsets.tree(torch.zeros(1, rows, dtype=torch.long),
                                    torch.tensor(random_tree(rows, 4, min(rows, 6), 0)), start)
                tail, depth = made.tail, made.depth
            kernels.decode_attention(query, key, torch.empty_like(key), start, dim ** -0.5, 0,
                                     (new, torch.empty_like(new), cos, torch.empty_like(cos)), tail=tail, depth=depth)


def linear(args, harness) -> None:
    import torch

    from specgen.gpu.kernels import linear as kernels
    from specgen.gpu.workspace import Workspace

    shapes = {"q+k+v": (6144, 4096, False), "o": (4096, 4096, False), "gate/up": (14336, 4096, True),
              "down": (4096, 14336, False), "lm_head": (128256, 4096, False)}
    counters = kernels.split_k_counters(Workspace("cpu"))
    bf16 = torch.bfloat16
    for rows in args.rows:
        for name, (n, k, gated) in shapes.items():
            harness.scenario = f"linear {name} rows={rows}"
            x = torch.empty(rows, k, dtype=bf16)
            if gated:
                kernels.gate_up(x, torch.empty(n, k, dtype=bf16), torch.empty(n, k, dtype=bf16), "silu",
                                split_k=True, counters=counters)
            else:
                kernels.linear(x, torch.empty(n, k, dtype=bf16), None, split_k=True, counters=counters)


def warp(args, harness) -> None:
    """The warp chain at t 0.8 / top-p 0.95 and at top-k 50 / top-p 0.9: stats, the parallel cut
    search's passes and bracket launches, the cut and probs kernels."""
    import torch

    from specgen.core.sampling.warp import WarpParams
    from specgen.gpu.kernels import warp as kernels
    from specgen.gpu.workspace import Workspace

    for rows in args.rows:
        for name, top_k in (("top-p", -1), ("top-k top-p", 50)):
            harness.scenario = f"warp {name} rows={rows} vocab={args.vocab}"
            full = lambda value, dtype=torch.float32: torch.full((rows,), value, dtype=dtype)  # noqa: E731
            params = WarpParams(temperature=full(0.8), top_k=full(top_k, torch.int32), top_p=full(0.95),
                                min_p=full(0.0), repetition_penalty=full(1.0), presence_penalty=full(0.0),
                                frequency_penalty=full(0.0))
            kernels.warp(torch.empty(rows, args.vocab), params, None, None, Workspace("cpu"))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("attention")
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[7, 33])
    p.add_argument("--prefix", type=int, default=1000)
    p.add_argument("--capacity", type=int, default=2048)
    p = commands.add_parser("linear")
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 7, 33, 80])
    p = commands.add_parser("warp")
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[33])
    p.add_argument("--vocab", type=int, default=128256)
    args = parser.parse_args(argv)
    report: list[dict] = []
    harness, version = _harness(report)
    print(f"triton {version}, sm_90", flush=True)
    {"attention": attention, "linear": linear, "warp": warp}[args.command](args, harness)
    # a launch the harness had compiled already (the same specialisation) is not listed again
    return report


if __name__ == "__main__":
    main()
