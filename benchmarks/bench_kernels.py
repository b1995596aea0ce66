"""Kernel microbenchmarks: each subcommand first checks specgen's Triton kernels against their torch
references on the very inputs it times, refuses to time a mismatch (exit 1), then times them with
CUDA events over CUDA-graph replays (as a captured round runs them: no launch overhead).

    python benchmarks/bench_kernels.py warp      [--vocab 16384,128256] [--rows 1,5]
    python benchmarks/bench_kernels.py verify    [--vocab 128256] [--k 4] [--batch 1,32]
    python benchmarks/bench_kernels.py walk      [--vocab 16384,128256] [--k 4] [--width 4] [--nodes 16] [--draft-noise 3]
    python benchmarks/bench_kernels.py linear    [--shapes q_o,qkv,gate_up,down,lm_head] [--rows 1,5]
    python benchmarks/bench_kernels.py tiles     [--shapes q_o,qkv,gate_up,down,lm_head] [--rows 1,5,17,33,64]
    python benchmarks/bench_kernels.py attention [--positions 512,4096] [--tokens 1,5] [--runners]
    python benchmarks/bench_kernels.py attention-tree [--rows 33,17] [--prefixes 10,100,1000]
                                                 [--capacity 2048] [--chain 7] [--layers 32] [--kernels]
    python benchmarks/bench_kernels.py steps     [--variants eager,graph-sdpa,graph-kernel] [--profile [--profile-tokens 5]]
                                                 [--model 8b|1b|bench-target|bench-draft|0.5b] [--layers N]
    python benchmarks/bench_kernels.py exact     [--models 8b,1b,bench-target,bench-draft] [--layers N] [--k 4]
    python benchmarks/bench_kernels.py table     [--models llama-3.1,qwen2.5,qwen3,gemma-2,bench] [--rows 1,5]
                                                 [--missing | --undrafted] --table FILE
    python benchmarks/bench_kernels.py step-table [--models llama-3.1,qwen2.5,qwen3,gemma-2] --table FILE

Every subcommand takes --out FILE (the JSON report) and prints a Markdown table. Settings are passed
to the kernels as arguments (parallel_cut, split_k, the resolved [kernels] policy), never set on
modules. Every model a runner steps is specgen's own (core/step/): random weights are drawn in a
transformers model of the same config, then handed to core/step/load.py's from_state.

torch.compile was removed from specgen, and with it the compile-* variants of `steps` and its
--compile / --compile-cache options: captured owned steps measured as fast without it (see
docs/benchmarks.md, "Compile with the step kernels as operators (H200)", and its decisions,
"Tried and not kept").

Kernels are timed from graph replays; the torch references (warp, verify) sync with the host, so
they are timed between CUDA events around each call, host dispatch included.

- warp: temperature 0.8 with top-p 0.95 (and with top-k 50 + top-p 0.9) over N(0, s^2) logits,
  s = 1, 2, 4; checks argmax, kept sets and sampled ids under the same Exp(1) draws against
  core/sampling/warp.py; times the warp with the parallel cut search and with the one-program search.
- verify: one round's random and greedy verification (k drafts, batch B) against
  core/sampling/rejection.py, bit for bit.
- walk: a token tree's recursive rejection walk (gpu/kernels/tree_walk.py, drawn children) over a
  full tree of depth k, width w (the root's w children, then w - 1 below each, up to n nodes),
  against core/sampling/tree_walk.py bit for bit; the draft's q is the target's logits plus N(0, s^2)
  noise (--draft-noise s), so most children are rejected, as at t 0.8 on a weak draft. Why: when
  the walk was one program with a pass over the vocabulary a rejected child, it made most of a
  sampled tree round's sample phase; its node passes are now spread over the GPU (the kernel
  file's docstring has the before and after).
- linear: Llama-3-8B's projections (bf16) against F.linear (gate_up against the unfused MLP):
  relative error <= 2e-2 of the output's scale; the kernel with split-K off and on, and cuBLAS;
  GB/s counts weight bytes, over enough weight copies that they do not fit in L2.
- tiles: Llama-3-8B's projections in the package's tensor-core picks (split-K off and on) with
  tiles of 16, 32 and 64 rows: whether each row's output is bitwise the 16-row tiles' one-row
  call's (reported, not refused: the question it asks), and the time of each at each row count.
  Why: a tree's 33 rows or a batch's B x (k + 1) are several 16-row tiles that each read the
  weights again; a larger tile reads them once, and keeps exactness only if the tensor cores sum a
  row the same way in it.
- attention: one Llama-3-8B layer's decode attention (32 heads, 8 KV heads, dim 128, bf16) at
  each position, against gpu/kernels/reference.py (one rounding step) and SDPA over the whole cache.
  --runners: the tiny models of tests/gpu/kernels/test_attention.py through a runner with the kernel (model's
  rotary and kernel's) and one with SDPA: the max logit difference per feed, the figures behind
  that test's RUNNER_TOLERANCE (also runs on a CPU, in the Triton interpreter).
- attention-tree: a token tree's verification attention at Llama-3.1-8B's shapes (32 heads, 8 KV
  heads, dim 128, bf16, the kernel's rotary and cache write, as the target's step calls it) after
  each prefix in caches of --capacity slots: the split kernel and the merge, microseconds per call
  over --layers caches of their own (a step's layers: none is read from L2 by the call before),
  and a --chain-row chain (k + 1) at the same prefix for comparison (0: none); with --kernels also
  each kernel's share (torch.profiler over the same capture). Each output is checked against the
  reference.
- exact: per model shape (random bf16 weights, the kernels `auto` resolves): every op's output in
  a (k+1)-token step against k+1 one-token steps at the same positions (eager runner, each call of
  its kernel table recorded, named by the weight or layer it computes: where rows first differ),
  the captured steps' logits likewise (torch.equal per row), and the 1-token and (k+1)-token
  captured step times against the model's bandwidth floor.
- table: `specgen tune-kernels` over the projections of every real pair benchmarks/family_pairs.py
  builds (targets, drafts and the EAGLE-3 heads of its --head) and of the bench pair, on this GPU: the linear table to ship as
  src/specgen/gpu/tuning/linear_configs.json, with each shape's time against the current package's pick.
- launches: each target projection's tensor-core pick at 33 to 320 rows, in its own tile and in
  launches that keep its sums (tile rows, BLOCK_N, BLOCK_K, warps, stages: gpu/tuning/linear_table.py),
  every row checked bitwise against the one-row call: the package's table with the fastest launch of
  each row class where it gains 3%.
- step-table: each family's draft (random weights of its public config, the kernels `auto`
  resolves): its one-row projections' picks chosen inside its captured one-token step by
  gpu/tuning/tune.py's tune_in_step, starting from the package's; writes the package's table with them.
- steps: a Llama-3-8B-shaped target (--model 1b: Llama-3.2-1B-shaped; --layers: fewer layers, the
  floor follows the weights) (random bf16 weights): the 1-token step, the 2-token step (a draft
  round's first) and the 5-token verification step, eager / CUDA graph with the kernels and fusions
  each variant turns on (VARIANTS), against the bandwidth floor
  (weight bytes / device-to-device copy bandwidth measured in the same run); each variant's 5-token
  logits are checked against an eager forward first (relative error <= 5e-2). Steps run at position
  512 of a 1024-position cache, rolled back after each, CUDA events over 50 steps, median of 5.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

if not torch.cuda.is_available():  # only `attention --runners` runs on a CPU: the Triton interpreter
    import triton_cpu  # noqa: E402,F401

import torch.nn.functional as F  # noqa: E402

from specgen.core.bench import floors

from specgen.core.sampling import rejection

from specgen.core.sampling import warp as sampling  # noqa: E402
from specgen.core.settings import FUSIONS, KernelSpec  # noqa: E402
from specgen.core.step import config as step_config  # noqa: E402
from specgen.core.step.load import from_state  # noqa: E402
from specgen.gpu.kernels import attention
from specgen.gpu.kernels import linear
from specgen.gpu.tuning import linear_table, tune
from specgen.gpu.kernels import verify
from specgen.gpu.kernels import warp  # noqa: E402
from specgen.gpu.policy import ResolvedKernels, resolve  # noqa: E402
from specgen.gpu.kernels.reference import (decode_attention_reference, gate_up_reference,  # noqa: E402
                                           rope_attention_reference)
from specgen.gpu.runner import GraphRunner  # noqa: E402
from specgen.gpu.workspace import Workspace  # noqa: E402


class Mismatch(SystemExit):
    """A kernel that disagrees with its reference: nothing is timed."""

    def __init__(self, what: str):
        super().__init__(f"bench_kernels: MISMATCH, not timed: {what}")


# -- timing -----------------------------------------------------------------------------------------


def graph_us(fn, calls: int = 1, replays: int = 20) -> float:
    """Median microseconds per call of fn(i), i < calls, captured in one CUDA graph and replayed
    (gpu/tuning/tune.py's timer, which `specgen tune-kernels` uses)."""
    return tune.graph_timer(fn, calls, (), replays) * 1e6


def kernels_us(fn, calls: int = 1, replays: int = 5) -> dict[str, float]:
    """Microseconds per call of fn(i), i < calls, by kernel name (the first 40 characters):
    torch.profiler over replays of the same capture graph_us times, so a call's time splits
    into its launches (attention-tree: the split kernel against the merge)."""
    from specgen.gpu.capture import capture

    def each() -> None:
        for i in range(calls):
            fn(i)

    graph, _ = capture(each, torch.device("cuda"), 1)
    graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    per: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name[:40]
            per[name] = per.get(name, 0.0) + event.time_range.elapsed_us() / (replays * calls)
    return {name: round(us, 2) for name, us in sorted(per.items(), key=lambda item: -item[1])}


def event_us(fn, calls: int = 20) -> float:
    """Median microseconds of fn() between CUDA events around the Python call: for the torch
    references, which sync with the host and cannot be captured (host dispatch counts)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def table(rows: list[dict], columns: list[str]) -> str:
    def cell(value):
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


# -- warp -------------------------------------------------------------------------------------------

WARP_SETTINGS = {"t0.8 top-p 0.95": dict(temperature=0.8, top_p=0.95),
                 "t0.8 top-k 50 top-p 0.9": dict(temperature=0.8, top_k=50, top_p=0.9)}
WARP_DEFAULTS = dict(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                     frequency_penalty=0.0)


def warp_params(rows: int, values: dict) -> sampling.WarpParams:
    values = {**WARP_DEFAULTS, **values}
    return sampling.WarpParams(**{name: torch.full((rows,), value, device="cuda",
                                                   dtype=torch.int32 if name == "top_k" else torch.float32)
                                  for name, value in values.items()})


def check_warp(logits, params, workspace, parallel_cut: bool, label: str) -> None:
    """argmax and sampled ids equal; kept sets equal except where a top-p mass-above lies within
    float32 rounding of top_p (the documented ambiguity, core/sampling/warp.py)."""
    argmax, probs = warp.warp(logits, params, None, None, workspace, parallel_cut=parallel_cut)
    ref_argmax, ref_probs = sampling.warp(logits, params)
    expo = sampling.exponentials(probs.shape, torch.Generator(device="cuda").manual_seed(3), "cuda")
    if int(workspace.error) or not torch.equal(argmax, ref_argmax):
        raise Mismatch(f"warp {label}: argmax or error flag")
    if not torch.equal(sampling.sample_race(probs, expo), sampling.sample_race(ref_probs, expo)):
        raise Mismatch(f"warp {label}: sampled ids")
    for row in ((probs > 0) != (ref_probs > 0)).any(dim=-1).nonzero().flatten().tolist():
        masses = torch.sort(ref_probs[row].double(), descending=True).values.cumsum(0)
        if (masses - float(params.top_p[row])).abs().min() > 1e-5:
            raise Mismatch(f"warp {label}: kept set of row {row}")


def bench_warp(args) -> list[dict]:
    results = []
    workspace = Workspace("cuda")
    for vocab in args.vocab:
        for rows in args.rows:
            for name, values in WARP_SETTINGS.items():
                for spread in (1.0, 2.0, 4.0):
                    gen = torch.Generator(device="cuda").manual_seed(vocab + rows)
                    logits = torch.randn(rows, vocab, device="cuda", generator=gen) * spread
                    params = warp_params(rows, values)
                    row = {"vocab": vocab, "rows": rows, "settings": name, "spread": spread}
                    for parallel_cut in (True, False):
                        label = f"vocab {vocab} rows {rows} {name} spread {spread} parallel_cut {parallel_cut}"
                        check_warp(logits, params, workspace, parallel_cut, label)
                        key = "parallel_us" if parallel_cut else "one_program_us"
                        row[key] = graph_us(lambda i: warp.warp(logits, params, None, None, workspace,
                                                                parallel_cut=parallel_cut))
                    _, probs = warp.warp(logits, params, None, None, workspace)
                    for per in args.per_program:  # the parallel search's chunks a program: same bits, timed
                        _, other = warp.warp(logits, params, None, None, workspace, per_program=per)
                        if not torch.equal(other, probs):
                            raise Mismatch(f"warp vocab {vocab} rows {rows} {name}: per_program {per} changed bits")
                        row[f"per{per}_us"] = graph_us(lambda i: warp.warp(logits, params, None, None, workspace,
                                                                           per_program=per))
                    row["torch_us"] = event_us(lambda: sampling.warp(logits, params))
                    results.append(row)
                    print(json.dumps(row), flush=True)
    print(table(results, ["vocab", "rows", "settings", "spread", "parallel_us", "one_program_us", "torch_us",
                          *(f"per{per}_us" for per in args.per_program)]))
    return results


# -- verify -----------------------------------------------------------------------------------------


def round_inputs(vocab: int, k: int, batch: int):
    gen = torch.Generator(device="cuda").manual_seed(vocab + k + batch)
    total = k * batch
    cu = torch.arange(1, batch + 1, device="cuda", dtype=torch.int32) * k
    target_logits = torch.randn(total + batch, vocab, device="cuda", generator=gen) * 3
    _, target = sampling.warp(target_logits, warp_params(total + batch, {"temperature": 1.0}))
    rows = [b * (k + 1) + i for b in range(batch) for i in range(k)]
    draft_logits = target_logits[rows] + torch.randn(total, vocab, device="cuda", generator=gen)
    _, draft = sampling.warp(draft_logits, warp_params(total, {"temperature": 1.0}))
    drafted = sampling.sample_race(draft, sampling.exponentials(draft.shape, gen, "cuda"))
    uniform = sampling.uniforms((total,), gen, "cuda")
    expo = sampling.exponentials((batch, vocab), gen, "cuda")
    return drafted, cu, draft, target, uniform, expo


def bench_verify(args) -> list[dict]:
    results = []
    workspace = Workspace("cuda")
    for vocab in args.vocab:
        for batch in args.batch:
            drafted, cu, q, p, uniform, expo = round_inputs(vocab, args.k, batch)
            argmax = p.argmax(dim=-1)
            calls = {
                "random": (lambda: verify.verify_random(drafted, cu, q, p, uniform, expo, args.k, workspace),
                           lambda: rejection.verify_random(drafted, cu, q, p, uniform, expo, args.k)),
                "random one-hot q": (lambda: verify.verify_random(drafted, cu, None, p, uniform, expo, args.k,
                                                                  workspace),
                                     lambda: rejection.verify_random(drafted, cu, None, p, uniform, expo, args.k)),
                "greedy": (lambda: verify.verify_greedy(drafted, cu, argmax, args.k, workspace),
                           lambda: rejection.verify_greedy(drafted, cu, argmax, args.k)),
            }
            for name, (kernel, reference) in calls.items():
                if not torch.equal(kernel(), reference()):
                    raise Mismatch(f"verify {name} vocab {vocab} k {args.k} batch {batch}")
                row = {"vocab": vocab, "k": args.k, "batch": batch, "verification": name,
                       "kernel_us": graph_us(lambda i: kernel()), "torch_us": event_us(reference)}
                results.append(row)
                print(json.dumps(row), flush=True)
    print(table(results, ["vocab", "k", "batch", "verification", "kernel_us", "torch_us"]))
    return results


def walk_inputs(vocab: int, k: int, width: int, nodes: int, noise: float, seed: int = 0,
                device: str = "cuda") -> tuple:
    """(children, drawn, tokens, p, q, uniforms, expo) of one tree (B = 1) on `device`: a full tree
    (the root's `width` children, each next level's nodes `width - 1` children, up to `nodes`),
    children drawn from q without replacement, q the target's logits plus N(0, noise^2)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = nodes + 1
    children = torch.full((1, rows, width), -1, dtype=torch.long)
    depth, parent, filled = [0], 0, 1
    while filled < rows:
        lanes = width if parent == 0 else width - 1
        for lane in range(lanes):
            if filled < rows and depth[parent] < k:
                children[0, parent, lane] = filled
                depth.append(depth[parent] + 1)
                filled += 1
        parent += 1
        if parent >= filled:
            break
    logits = torch.randn(1, rows, vocab, device=device, generator=gen) * 3
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + torch.randn(1, rows, vocab, device=device, generator=gen) * noise, -1)
    drawn = torch.multinomial(q[0], width, generator=gen)[None]  # [1, R, w], without replacement
    children = children.to(device)
    tokens = torch.zeros(1, rows, dtype=torch.long, device=device)
    rows_of = children.clamp(min=0)
    tokens.scatter_(1, rows_of.flatten(1), torch.where(children >= 0, drawn, 0).flatten(1))
    tokens[0, 0] = 0
    uniforms = torch.rand(1, k, width, device=device, generator=gen)
    expo = sampling.exponentials((1, vocab), gen, device)
    return children, drawn, tokens, p, q, uniforms, expo


def bench_walk(args) -> list[dict]:
    from specgen.core.sampling import tree_walk as walk_reference
    from specgen.gpu.kernels import tree_walk

    results = []
    workspace = Workspace("cuda")
    limit = torch.tensor([args.k], dtype=torch.int32, device="cuda")
    for vocab in args.vocab:
        inputs = walk_inputs(vocab, args.k, args.width, args.nodes, args.draft_noise)
        want = walk_reference.recursive_walk(*inputs, limit, args.k)
        got = tree_walk.recursive_walk(*inputs, limit, args.k, workspace)
        if not all(torch.equal(a, b) for a, b in zip(want, got)):
            raise Mismatch(f"walk vocab {vocab}: {[t.tolist() for t in want]} against {[t.tolist() for t in got]}")
        emitted = int((got[0] >= 0).sum())
        row = {"vocab": vocab, "k": args.k, "width": args.width, "nodes": args.nodes, "emitted": emitted,
               "kernel_us": graph_us(lambda i: tree_walk.recursive_walk(*inputs, limit, args.k, workspace))}
        results.append(row)
        print(json.dumps(row), flush=True)
    print(table(results, ["vocab", "k", "width", "nodes", "emitted", "kernel_us"]))
    return results


# -- linear -----------------------------------------------------------------------------------------

LINEAR_SHAPES = {"q_o": (4096, 4096), "k_v": (1024, 4096), "qkv": (6144, 4096), "gate_up": (14336, 4096),
                 "down": (4096, 14336), "lm_head": (128256, 4096)}  # Llama-3-8B: (N, K)
L2_BYTES = 256 * 2**20  # weight bytes per timing: more than any L2


def bench_linear(args) -> list[dict]:
    results = []
    counters = linear.split_k_counters(Workspace("cuda"))
    for name in args.shapes:
        n, k = LINEAR_SHAPES[name]
        gated = name == "gate_up"
        weight_bytes = n * k * 2 * (2 if gated else 1)
        copies = max(2, -(-L2_BYTES // weight_bytes))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
        us = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)] if gated else ws
        for rows in args.rows:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)

            def kernel(i, split_k):
                if gated:
                    return linear.gate_up(x, ws[i], us[i], "silu", split_k=split_k, counters=counters)
                return linear.linear(x, ws[i], None, split_k=split_k, counters=counters)

            def reference(i):
                return gate_up_reference(x, ws[i], us[i], "silu") if gated else F.linear(x, ws[i])

            expected = reference(0).float()
            row = {"shape": name, "n": n, "k": k, "rows": rows}
            for split_k in (False, True):
                error = ((kernel(0, split_k).float() - expected).abs().max() / expected.abs().max()).item()
                if error > 2e-2:
                    raise Mismatch(f"linear {name} rows {rows} split_k {split_k}: relative error {error:.3g}")
                key = "split_k_us" if split_k else "kernel_us"
                row[key] = graph_us(lambda i: kernel(i, split_k), copies)
            row["cublas_us"] = graph_us(reference, copies)
            row["kernel_gb_s"] = weight_bytes / min(row["kernel_us"], row["split_k_us"]) / 1e3
            row["cublas_gb_s"] = weight_bytes / row["cublas_us"] / 1e3
            results.append(row)
            print(json.dumps(row), flush=True)
    print(table(results, ["shape", "rows", "kernel_us", "split_k_us", "cublas_us", "kernel_gb_s", "cublas_gb_s"]))
    return results


def bench_tiles(args) -> list[dict]:
    results = []
    package = linear.packaged()
    counters = linear.split_k_counters(Workspace("cuda"))
    for name in args.shapes:
        n, k = LINEAR_SHAPES[name]
        gated = name == "gate_up"
        act = linear.ACTIVATIONS["silu"] if gated else 0
        weight_bytes = n * k * 2 * (2 if gated else 1)
        copies = max(2, -(-L2_BYTES // weight_bytes))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
        us = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)] if gated else ws
        for split_k in (False, True):
            config = package.pick(n, k, gated, split_k, 1)
            if not config[0]:
                continue
            x = torch.randn(max(args.rows), k, device="cuda", dtype=torch.bfloat16)

            def call(i, rows, tile):
                return linear.run(x[:rows], ws[i], us[i] if gated else None, None, act, config, counters, None,
                                  False, tile=tile)
            alone = torch.cat([linear.run(x[r:r + 1], ws[0], us[0] if gated else None, None, act, config, counters,
                                          None, False) for r in range(max(args.rows))])
            for rows in args.rows:
                row = {"shape": name, "config": str(config), "rows": rows}
                for tile in (16, 32, 64):
                    out = call(0, rows, tile)
                    row[f"t{tile}_equal"] = bool(torch.equal(out, alone[:rows]))
                    row[f"t{tile}_us"] = graph_us(lambda i, r=rows, t=tile: call(i, r, t), copies)
                results.append(row)
                print(json.dumps(row), flush=True)
    print(table(results, ["shape", "config", "rows"] + [f"t{t}_{c}" for t in (16, 32, 64) for c in ("us", "equal")]))
    return results


# -- attention --------------------------------------------------------------------------------------


def bench_attention(args) -> list[dict]:
    if args.runners:
        return attention_runners()
    results = []
    heads, kv_heads, dim, capacity = 32, 8, 128, max(args.positions) + 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    key = torch.randn(1, kv_heads, capacity, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    value = torch.randn(1, kv_heads, capacity, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    for position in args.positions:
        for tokens in args.tokens:
            query = torch.randn(1, tokens, heads, dim, device="cuda", dtype=torch.bfloat16,
                                generator=gen).transpose(1, 2)
            at = torch.tensor(position, device="cuda")
            scale = dim ** -0.5
            out = attention.decode_attention(query, key, value, at, scale)
            ref = decode_attention_reference(query, key, value, at, scale)
            error = (out.float() - ref.float()).abs().max().item()
            if error > 2 * 2.0 ** -7:  # two bf16 rounding steps of values < 2
                raise Mismatch(f"attention position {position} tokens {tokens}: max error {error:.3g}")
            mask = torch.arange(capacity, device="cuda")[None, :] <= position + torch.arange(tokens, device="cuda")[:, None]
            groups = heads // kv_heads

            def sdpa(i):
                return F.scaled_dot_product_attention(query, key.repeat_interleave(groups, 1),
                                                      value.repeat_interleave(groups, 1), attn_mask=mask)

            row = {"position": position, "tokens": tokens, "max_error": error,
                   "kernel_us": graph_us(lambda i: attention.decode_attention(query, key, value, at, scale)),
                   "sdpa_whole_cache_us": graph_us(sdpa)}
            results.append(row)
            print(json.dumps(row), flush=True)
    print(table(results, ["position", "tokens", "kernel_us", "sdpa_whole_cache_us", "max_error"]))
    return results


def bench_attention_tree(args) -> list[dict]:
    from rows_helpers import random_tree

    from specgen.core.step import rows as rowsets

    heads, kv_heads, dim, layers = 32, 8, 128, args.layers
    scale = dim ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    results = []
    for capacity in args.capacity:
        keys = [randn(1, kv_heads, capacity, dim) for _ in range(layers)]
        values = [randn(1, kv_heads, capacity, dim) for _ in range(layers)]
        for prefix in args.prefixes:
            shapes = [(nodes, "tree") for nodes in args.rows] + ([(args.chain, "chain")] if args.chain else [])
            for nodes, layout in shapes:
                if prefix + nodes > capacity:
                    continue
                ids = torch.zeros(1, nodes, dtype=torch.long, device="cuda")
                if layout == "tree":  # EAGLE-like: n = 16 of width 2, n = 32 of width 4, 6 levels
                    parents = torch.tensor(random_tree(nodes, 2 if nodes <= 17 else 4, 6, 0), device="cuda")
                    rows = rowsets.tree(ids, parents, torch.tensor([prefix], device="cuda"))
                    tail, depth = rows.tail, rows.depth
                else:
                    tail = depth = None
                start = torch.tensor([prefix], device="cuda")
                query = randn(1, nodes, heads, dim).transpose(1, 2)
                angles = randn(1, nodes, dim).float()
                rope = (randn(1, nodes, kv_heads, dim).transpose(1, 2), randn(1, nodes, kv_heads, dim).transpose(1, 2),
                        angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16))

                def call(i, key=None, value=None):
                    key, value = (keys[i], values[i]) if key is None else (key, value)
                    return attention.decode_attention(query, key, value, start, scale, 0, rope, tail=tail, depth=depth)

                first = call(0, keys[0].clone(), values[0].clone())
                floats = [x.float() for x in (query, keys[0], values[0])]
                ref, _, _ = rope_attention_reference(floats[0], *(x.float() for x in rope), *floats[1:], start, scale,
                                                     0, 0.0, tail, depth)
                error = (first.float() - ref).abs().max().item()
                if error > 4 * 2.0 ** -7 * max(1.0, ref.abs().max().item()):  # bf16 steps at the output's scale
                    raise Mismatch(f"attention-tree rows {nodes} prefix {prefix}: max error {error:.3g}")
                row = {"layout": layout, "rows": nodes, "prefix": prefix, "capacity": capacity,
                       "us_per_call": graph_us(call, calls=layers), "max_error": error}
                if args.kernels:  # the split kernel and the merge apart (where a tree's time goes)
                    row["kernels_us"] = kernels_us(call, calls=layers)
                results.append(row)
                print(json.dumps(row), flush=True)
    print(table(results, ["layout", "rows", "prefix", "capacity", "us_per_call", "max_error"]))
    return results


RUNNER_FAMILIES = [("Llama", {}), ("Mistral", {"sliding_window": 24}), ("Qwen2", {}), ("Qwen3", {"head_dim": 16})]
RUNNER_SCRIPT = [5, 1, -3, 5, 1, 1, -2, 5]  # as tests/gpu/kernels/test_attention.py: feed n tokens, or roll back n


def attention_runners() -> list[dict]:
    """Max logit difference per feed: kernel runner (model's rotary / kernel's) against SDPA."""
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    for family, extra in RUNNER_FAMILIES:
        config = getattr(transformers, f"{family}Config")(
            vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.5, bos_token_id=None,
            eos_token_id=None, pad_token_id=None, **extra)
        torch.manual_seed(3)
        model = owned(getattr(transformers, f"{family}ForCausalLM")(config).to(device).eval())
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, 96, (30,), generator=gen)
        feeds = [torch.randint(0, 96, (abs(n),), generator=gen) for n in RUNNER_SCRIPT]
        logits = {}
        for name, kernels in (("sdpa", ResolvedKernels(False, False, False, False, False)),
                              ("model-rotary", ResolvedKernels(True, False, False, False, False)),
                              ("kernel-rotary", ResolvedKernels(True, False, True, False, False))):
            runner = GraphRunner(model, 96, 600, kernels=kernels, workspace=Workspace(device), use_graphs=False)
            out = [runner.forward(prompt.to(device)).clone()]
            for n, ids in zip(RUNNER_SCRIPT, feeds):
                if n < 0:
                    runner.truncate(runner.length + n)
                else:
                    out.append(runner.forward(ids.to(device)).clone())
            logits[name] = out
        scale = max(x.abs().max().item() for x in logits["sdpa"])
        for a, b in (("model-rotary", "sdpa"), ("kernel-rotary", "sdpa"), ("kernel-rotary", "model-rotary")):
            diffs = [(x - y).abs().max().item() for x, y in zip(logits[a], logits[b])]
            row = {"family": family, "compared": f"{a} vs {b}", "logits_up_to": scale, "max_diff": max(diffs),
                   "per_feed": [f"{d:.1e}" for d in diffs]}
            results.append(row)
            print(json.dumps(row), flush=True)
    print(table(results, ["family", "compared", "logits_up_to", "max_diff"]))
    return results


# -- steps: a Llama-3-8B-shaped target ----------------------------------------------------------

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                 rope_theta=500000.0, tie_word_embeddings=False)
LLAMA32_1B = dict(LLAMA3_8B, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
                  tie_word_embeddings=True)
POSITION = 512


def spec(attention: str = "sdpa", linear: str = "torch", on: tuple[str, ...] = ()) -> KernelSpec:
    """[kernels] with these two choices and only the fusions `on` (FUSIONS) left out of `disable`."""
    return KernelSpec(attention=attention, linear=linear, disable=tuple(f for f in FUSIONS if f not in on))


SPEC = spec()  # cuBLAS and SDPA, every fusion off
DEPENDENT = spec("kernel", "kernel", ("rope", "split_k", "norm", "step_io", "dependent_launch"))


def for_drafts(kernels: ResolvedKernels) -> ResolvedKernels:
    return dataclasses.replace(kernels, linear_table=kernels.linear_table.for_drafts())


def split_k_on(kernels: ResolvedKernels) -> ResolvedKernels:
    return dataclasses.replace(kernels, split_k=True)


# name -> (runner options, [kernels] policy, then a change of the resolved policy that resolve()
# cannot express, or None). split_k, where a variant leaves it on, follows the GPU (split_k_pays).
VARIANTS = {
    "eager": (dict(use_graphs=False), SPEC, None),
    "graph-sdpa": ({}, SPEC, None),
    "graph-kernel": ({}, spec("kernel", on=("rope",)), None),
    "graph-linear": ({}, spec("kernel", "kernel", ("rope", "split_k")), None),
    "graph-norm": ({}, spec("kernel", "kernel", ("rope", "split_k", "norm")), None),
    "graph-io": ({}, spec("kernel", "kernel", ("rope", "split_k", "norm", "step_io")), None),
    "graph-dependent": ({}, DEPENDENT, None),
    # graph-dependent as a draft model's runner takes it: its table's draft picks (LinearTable.for_drafts)
    "graph-draft": ({}, DEPENDENT, for_drafts),
    # graph-dependent with split-K forced on, whatever the GPU's bandwidth (`auto` keeps it off on an H100)
    "graph-split-k": ({}, DEPENDENT, split_k_on),
    # every [kernels] value `auto`, as a run resolves it on this GPU
    "graph-default": ({}, KernelSpec(), None),
}


def copy_bandwidth(gib: int = 4) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and bytes written
    (core/bench/floors.py, the measurement `specgen bench` makes, with buffers of `gib` GiB)."""
    bandwidth = floors.copy_bandwidth(torch.device("cuda"), gib * 2**30)
    assert bandwidth is not None, f"two {gib} GiB buffers do not fit on the GPU"
    return bandwidth


def owned(model):
    """specgen's own model (core/step/) over a transformers model's weights, where they lie (shared,
    not copied: drop the transformers model and only the owned one holds them)."""
    config = model.config.to_dict()
    parsed = step_config.of(config)
    if parsed is None:
        raise SystemExit(f"bench_kernels: specgen's own step does not run this config: "
                         f"{step_config.unsupported(config)}")
    return from_state(parsed, model.state_dict(), model.get_output_embeddings().weight.device)


def random_model(config, seed: int = 0):
    """An owned model with random bf16 weights on the GPU: a transformers model of `config` built
    there (its initialisation, seeded), its weights handed over."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device("cuda"):
        return owned(AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval())


def random_llama(config_kwargs: dict):
    from transformers import LlamaConfig

    return random_model(LlamaConfig(**config_kwargs))


def step_seconds(runner: GraphRunner, n: int, steps: int = 50, repeats: int = 5) -> float:
    return tune.step_seconds(runner, n, POSITION, steps, repeats)


def step_logits(runner: GraphRunner, ids: torch.Tensor) -> torch.Tensor:
    """Logits of one 5-token step at POSITION after a fixed random prefix."""
    generator = torch.Generator(device="cuda").manual_seed(1)
    runner.reset()
    runner.forward(torch.randint(0, runner.width, (POSITION,), device="cuda", generator=generator), want_logits=False)
    logits = runner.forward(ids).clone()
    runner.truncate(POSITION)
    return logits


def kernel_table(runner: GraphRunner, tokens: int = 1, steps: int = 20) -> tuple[str, dict]:
    """torch.profiler's CUDA kernel table over `steps` steps of `tokens` tokens at POSITION, and per
    step: the kernels launched and their summed time (the rest of a step's time is gaps between them)."""
    ids = torch.randint(0, runner.width, (tokens,), device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.forward(ids)
            runner.truncate(POSITION)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    summary = {"kernels_per_step": sum(e.count for e in events) / steps,
               "kernel_ms_per_step": sum(e.self_device_time_total for e in events) / steps / 1e3}
    # The last step's kernels in launch order, each with the idle time before it: where a step's
    # time goes that no kernel accounts for.
    launched = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                      key=lambda e: e.time_range.start)
    last = launched[-round(summary["kernels_per_step"]):]
    sequence, previous = [], None
    for event in last:
        gap = 0.0 if previous is None else event.time_range.start - previous
        sequence.append({"kernel": event.name[:60], "us": round(event.time_range.elapsed_us(), 2),
                         "gap_us": round(gap, 2)})
        previous = event.time_range.end
    summary["gap_ms_last_step"] = sum(row["gap_us"] for row in sequence) / 1e3
    lines = [f"{row['gap_us']:7.2f} {row['us']:8.2f}  {row['kernel']}" for row in sequence]
    text = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
    return text + "\n  gap us   kernel us  (last step, launch order)\n" + "\n".join(lines), {
        **summary, "sequence": sequence}


STEP_TOKENS = (1, 2, 5)


def build_runner(model, width: int, kernels: ResolvedKernels, workspace: Workspace, options: dict) -> GraphRunner:
    """A runner capturing 1-, 2- and 5-token steps (a step, a draft round's first step, a k = 4
    verification)."""
    return GraphRunner(model, width, 1024, kernels=kernels, workspace=workspace, shapes=STEP_TOKENS, **options)


MODELS = {"8b": LLAMA3_8B, "1b": LLAMA32_1B}  # and EXACT_SHAPES' bench shapes, defined below


def bench_steps(args) -> dict:
    bandwidth = copy_bandwidth()
    config = dict(MODELS[args.model], **({"num_hidden_layers": args.layers} if args.layers else {}))
    model = random_llama(config)
    width = config["vocab_size"]
    workspace = Workspace("cuda")
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    floor = weight_bytes / bandwidth
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
              "layers": config["num_hidden_layers"], "weight_bytes": weight_bytes,
              "copy_bandwidth_bytes_per_s": bandwidth, "floor_ms": floor * 1e3, "rows": []}
    print(f"{report['device']}: weights {weight_bytes / 1e9:.2f} GB, copy {bandwidth / 1e12:.2f} TB/s, "
          f"floor {floor * 1e3:.2f} ms", flush=True)
    probe = torch.randint(0, width, (5,), device="cuda")
    eager = GraphRunner(model, width, 1024, kernels=resolve(SPEC, "cuda", model), workspace=workspace,
                        use_graphs=False)
    reference = step_logits(eager, probe)
    del eager
    for name in dict.fromkeys(args.variants):
        options, policy, change = VARIANTS[name]
        kernels = resolve(policy, "cuda", model)
        if change is not None:
            kernels = change(kernels)
        start = time.perf_counter()
        runner = build_runner(model, width, kernels, workspace, options)
        setup = time.perf_counter() - start
        error = ((step_logits(runner, probe) - reference).abs().max() / reference.abs().max()).item()
        if error > 7e-2:  # bf16 kernels against eager cuBLAS/SDPA: 5.5e-2 to 6.1e-2 on random 8B weights
            raise Mismatch(f"steps {name}: 5-token logits relative error {error:.3g} against eager")
        one, two, five = (step_seconds(runner, tokens) for tokens in STEP_TOKENS)
        row = {"variant": name, "kernels": kernels.as_dict(), "setup_s": round(setup, 1), "step_1_ms": one * 1e3,
               "step_2_ms": two * 1e3, "step_5_ms": five * 1e3, "step_1_over_floor": one / floor,
               "step_5_over_step_1": five / one, "logits_rel_err": error}
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        if args.profile:
            text, summary = kernel_table(runner, args.profile_tokens)
            row.update(summary)
            print(text, json.dumps(summary), flush=True)
        del runner
        torch.cuda.empty_cache()
    print(table(report["rows"], ["variant", "step_1_ms", "step_2_ms", "step_5_ms", "step_1_over_floor",
                                 "step_5_over_step_1", "logits_rel_err"]))
    print(f"floor {floor * 1e3:.2f} ms = {weight_bytes / 1e9:.2f} GB / {bandwidth / 1e12:.2f} TB/s")
    return report


# -- exact: a (k+1)-token step against k+1 one-token steps, bit for bit ------------------------------

EXACT_SHAPES = {  # random-weight Llama shapes: (config, layers timed / checked by default)
    "8b": dict(LLAMA3_8B, num_hidden_layers=4),
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
               tie_word_embeddings=True),
    "bench-target": dict(vocab_size=16384, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
                         tie_word_embeddings=False),
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True),
    "bench-draft": dict(vocab_size=16384, hidden_size=512, intermediate_size=1408, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                        tie_word_embeddings=True),
}


MODELS.update({name: EXACT_SHAPES[name] for name in ("bench-target", "bench-draft", "0.5b")})


class Recording:
    """A runner's kernel table (gpu/ops.py) that records each call the model makes of the ops in
    OPS: (name, first tensor argument (a Rows' ids) or None, first tensor output), in call order.
    A call is named by the weight it computes with (`model.layers.0.self_attn.o_proj`; q, k, v fused:
    `...self_attn.qkv`; gate and up: `...mlp.gate_up`) or, for attention, by its layer."""

    OPS = ("inputs", "linear", "qkv", "gate_up", "norm", "norm_add_norm", "attention", "logits")

    def __init__(self, ops, model):
        self.ops, self.calls = ops, []
        self.weights = {p.data_ptr(): name.removesuffix(".weight") for name, p in model.named_parameters()}
        self.modules = {id(m): name for name, m in model.named_modules()}

    def __getattr__(self, op):
        real = getattr(self.ops, op)
        if op not in self.OPS:
            return real

        def call(*args, **kwargs):
            out = real(*args, **kwargs)
            first = out[0] if isinstance(out, (tuple, list)) else out
            given = args[0] if isinstance(args[0], torch.Tensor) else getattr(args[0], "ids", None)
            self.calls.append((self.name(op, args), given.detach().clone() if given is not None else None,
                               first.detach().clone()))
            return out

        return call

    def name(self, op: str, args) -> str:
        if op == "attention":
            return f"model.layers.{args[4]}.self_attn.attention"
        if op == "logits":
            return "lm_head"
        if op == "qkv":
            return f"{self.modules.get(id(args[1]), '?')}.qkv"
        weight = args[2] if op == "norm_add_norm" else args[1]
        name = self.weights.get(weight.data_ptr(), "?")
        return name.replace("gate_proj", "gate_up") if op == "gate_up" else name


def _rows_differ(wide: torch.Tensor, singles: list, axis: int) -> tuple[int, float]:
    differ, worst = 0, 0.0
    for i, single in enumerate(singles):
        a, b = wide.select(axis, i), single.select(axis, 0)
        if a.shape != b.shape or not torch.equal(a, b):
            differ += 1
            worst = max(worst, (a.float() - b.float()).abs().max().item() if a.shape == b.shape else float("inf"))
    return differ, worst


def exact_divergence(model, kernels, ids: torch.Tensor, prefix: torch.Tensor) -> list[dict]:
    """Every op's output for a (k+1)-token step against the same op in k+1 one-token steps (an
    eager runner with the same kernels: captured steps run the same ones; its kernel table
    recorded, see Recording), in call order: how many of the k+1 rows differ and by how much, and
    whether the op is a source (its input rows were equal). Outputs with no token axis are skipped."""
    runner = GraphRunner(model, model.config.vocab_size, 1024, kernels=kernels, workspace=Workspace(model.device),
                         use_graphs=False)
    runner.ops = recording = Recording(runner.ops, model)
    calls = recording.calls
    runner.reset()
    runner.forward(prefix, want_logits=False)
    calls.clear()
    runner.forward(ids)
    wide = list(calls)
    singles = []
    runner.truncate(prefix.numel())
    for i in range(ids.numel()):
        calls.clear()
        runner.forward(ids[i:i + 1])
        singles.append(list(calls))
    rows = []
    for j, (name, given, out) in enumerate(wide):
        axis = next((a for a in range(out.ndim) if out.shape[a] == ids.numel()), None)
        if axis is None or any(len(s) <= j or s[j][0] != name for s in singles):
            continue
        differ, worst = _rows_differ(out, [s[j][2] for s in singles], axis)
        given_differ = None
        if given is not None and given.ndim > axis and given.shape[axis] == ids.numel():
            given_differ, _ = _rows_differ(given, [s[j][1] for s in singles], axis)
        # a source: an op whose input rows were equal and whose output rows differ
        rows.append({"module": name, "rows_differ": differ, "max_diff": worst,
                     "source": differ > 0 and given_differ == 0})
    return rows


def graph_exact(runner: GraphRunner, ids: torch.Tensor, prefix: torch.Tensor) -> list[bool]:
    """Captured steps: logits of one (k+1)-token step against k+1 one-token steps, torch.equal per row."""
    runner.reset()
    runner.forward(prefix, want_logits=False)
    wide = runner.forward(ids).clone()
    runner.truncate(prefix.numel())
    singles = [runner.forward(ids[i:i + 1]).clone() for i in range(ids.numel())]
    return [torch.equal(wide[i], singles[i][0]) for i in range(ids.numel())]


def bench_exact(args) -> dict:
    bandwidth = copy_bandwidth()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "bandwidth": bandwidth, "rows": []}
    for name in args.models:
        config = dict(EXACT_SHAPES[name])
        if args.layers:
            config["num_hidden_layers"] = args.layers
        model = random_llama(config)
        kernels = resolve(KernelSpec(), "cuda", model)  # this machine's tuned table, if any, in kernels.linear_table
        gen = torch.Generator(device="cuda").manual_seed(7)
        prefix = torch.randint(0, config["vocab_size"], (args.position,), device="cuda", generator=gen)
        ids = torch.randint(0, config["vocab_size"], (args.k + 1,), device="cuda", generator=gen)
        modules = exact_divergence(model, kernels, ids, prefix)
        diverged = [m for m in modules if m["rows_differ"]]
        sources = sorted({m["module"].split(".")[-1] for m in diverged if m["source"]})
        runner = GraphRunner(model, config["vocab_size"], 1024, kernels=kernels, workspace=Workspace("cuda"),
                             shapes=(1, args.k + 1))
        equal = graph_exact(runner, ids, prefix)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        one, wide = step_seconds(runner, 1), step_seconds(runner, args.k + 1)
        row = {"model": name, "layers": config["num_hidden_layers"], "kernels": kernels.as_dict(),
               "graph_rows_equal": f"{sum(equal)}/{len(equal)}", "modules_checked": len(modules),
               "modules_diverged": len(diverged), "sources": sources,
               "source_modules": [m for m in diverged if m["source"]][:40], "first_divergences": diverged[:6],
               "step_1_ms": one * 1e3, f"step_{args.k + 1}_ms": wide * 1e3,
               "floor_ms": weight_bytes / bandwidth * 1e3, "step_1_over_floor": one * bandwidth / weight_bytes}
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        del runner, model
        torch.cuda.empty_cache()
    print(table(report["rows"], ["model", "layers", "graph_rows_equal", "modules_diverged", "sources", "step_1_ms",
                                 f"step_{args.k + 1}_ms", "floor_ms", "step_1_over_floor"]))
    return report


# -- table: the package's linear configurations, tuned here -------------------------------------------


ABOUT_TABLE = ("gpu/kernels/linear.py's configurations by weight shape (gpu/tuning/linear_table.py): the projections of the real "
               "pairs in benchmarks/family_pairs.py (and of its EAGLE-3 heads) and of the bench pair, tuned with "
               "benchmarks/bench_kernels.py table")


def bench_table(args) -> dict:
    from transformers import AutoConfig


    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import family_pairs

    configs = {}  # name -> its shapes
    for name in args.models:
        if name == "bench":
            for shape in ("bench-target", "bench-draft"):
                configs[shape] = linear_table.model_shapes(AutoConfig.for_model("llama", **EXACT_SHAPES[shape]))
            continue
        family = family_pairs.FAMILIES[name.removesuffix("-head")]
        if name.endswith("-head"):  # the EAGLE-3 head family_pairs.py --head builds for the target
            configs[name] = linear_table.head_shapes(family_pairs.head_config(family))
            continue
        for role, model in (("target", family.target), ("draft", family.draft)):
            values = dict(model.config)
            config = AutoConfig.for_model(values.pop("model_type"), **values)
            configs[f"{name}-{role}"] = linear_table.model_shapes(config)
    shapes = {}
    package = linear_table.packaged()
    known = set()
    if args.missing:
        known = {shape for shape, _, _ in package.entries}
    elif args.undrafted:
        known = {shape for shape, _ in package.drafts}
    for name, listed in configs.items():
        for shape in listed:
            if shape not in known:
                shapes.setdefault(shape, name)
    print(f"{len(shapes)} shapes from {', '.join(configs)}", flush=True)
    start = time.perf_counter()
    tuned, choices = linear_table.LinearTable(source="tuned"), []
    for name in configs:  # one model at a time, the table written after each: a cut-short run keeps its part
        mine = [shape for shape, first in shapes.items() if first == name]
        part, done = tune.tune(mine, tuple(args.rows), tune.graph_timer, device=torch.device("cuda"),
                               progress=lambda line: print(line, flush=True))
        tuned, choices = part.over(tuned), choices + done
        args.table.write_text(tuned.to_json(about=ABOUT_TABLE, tuned_on=torch.cuda.get_device_name(),
                                            rows=list(args.rows)))
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    packaged = linear_table.packaged()
    rows = []
    for choice in choices:
        n, k, gated = choice.shape
        row = {"model": shapes[choice.shape], "n": n, "k": k, "gated": gated}
        if choice.draft is not None:
            old = packaged.for_drafts().pick(n, k, gated, True)
            row["draft"], row["draft_us"] = list(choice.draft), round(choice.one_row[choice.draft] * 1e6, 2)
            row["draft_package_us"] = round(choice.one_row[old] * 1e6, 2) if old in choice.one_row else None
        for split in (False, True):
            old = packaged.pick(n, k, gated, split)
            new = choice.split if split else choice.plain
            key = "split" if split else "plain"
            row[f"{key}_us"] = round(choice.seconds[new] * 1e6, 2)
            row[f"{key}_package_us"] = round(choice.seconds[old] * 1e6, 2) if old in choice.seconds else None
            row[key] = list(new)
        rows.append(row)
    print(table(rows, ["model", "n", "k", "gated", "plain", "plain_us", "plain_package_us", "split", "split_us",
                        "split_package_us", "draft", "draft_us", "draft_package_us"]))
    return {"device": torch.cuda.get_device_name(), "seconds": time.perf_counter() - start, "rows": rows}


def bench_step_table(args) -> dict:
    """Each family's draft (random bf16 weights of its public config, owned) as the CUDA backend runs it:
    its one-row picks chosen inside its captured step (gpu/tuning/tune.py's tune_in_step), from the current
    package's picks; the package's table with those picks written to --table."""
    from transformers import AutoConfig


    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import family_pairs

    package = linear_table.packaged()
    drafts = dict(package.drafts)
    rows, start = [], time.perf_counter()
    for name in args.models:
        values = dict(family_pairs.FAMILIES[name].draft.config)
        config = AutoConfig.for_model(values.pop("model_type"), **values)
        model = random_model(config)
        kernels = resolve(KernelSpec(), "cuda", model)
        kernels = dataclasses.replace(kernels, linear_table=package.for_drafts())
        shapes = linear_table.model_shapes(config)
        found = tune.tune_draft(model, kernels, shapes, Workspace("cuda"), position=POSITION,
                                progress=lambda line: print(f"{name}: {line}", flush=True))
        drafts.update(found.picks)
        for shape in shapes:
            n, k, gated = shape
            rows.append({"model": name, "n": n, "k": k, "gated": gated,
                         "package": list(kernels.linear_table.pick(*shape, kernels.split_k, 1)),
                         "in_step": list(found.picks[shape])})
        print(f"{name}: step {found.before * 1e3:.4f} -> {found.after * 1e3:.4f} ms "
              f"({len(found.trials)} timings, {time.perf_counter() - start:.0f} s)", flush=True)
        rows[-1].update(step_before_ms=found.before * 1e3, step_after_ms=found.after * 1e3)
        del model
        torch.cuda.empty_cache()
        tuned = linear_table.LinearTable(package.entries, "package, in-step draft picks", tuple(sorted(drafts.items())))
        notes = json.loads(linear_table.PACKAGED.read_text())
        notes = {key: value for key, value in notes.items() if key not in ("format", "shapes")}
        # the package's own notes, unchanged: its "about" says by hand which drafts' picks came from here
        args.table.write_text(tuned.to_json(**notes))
    print(table(rows, ["model", "n", "k", "gated", "package", "in_step", "step_before_ms", "step_after_ms"]))
    return {"device": torch.cuda.get_device_name(), "seconds": time.perf_counter() - start, "rows": rows}


def bench_launches(args) -> dict:
    """Launches for tall calls (gpu/tuning/tune.py's tune_launches, as `specgen tune-kernels` runs it):
    each target projection's split-K pick, every row class; the package's table with the launches
    found written to --table."""
    from transformers import AutoConfig

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import family_pairs

    shapes = {}
    for name in args.models:
        if name == "bench":
            listed = linear_table.model_shapes(AutoConfig.for_model("llama", **EXACT_SHAPES["bench-target"]))
        else:
            values = dict(family_pairs.FAMILIES[name].target.config)
            listed = linear_table.model_shapes(AutoConfig.for_model(values.pop("model_type"), **values))
        for shape in listed:
            shapes.setdefault(shape, name)
    package = linear_table.packaged()
    notes = json.loads(linear_table.PACKAGED.read_text())
    notes = {key: value for key, value in notes.items() if key not in ("format", "shapes")}
    start, table_now, rows = time.perf_counter(), package, []
    for shape, name in shapes.items():  # the table written after each shape: a cut-short run keeps its part
        table_now, choices = tune.tune_launches(table_now, [shape], functools.partial(tune.graph_timer, replays=10),
                                                device=torch.device("cuda"), progress=print)
        for choice in choices:
            rows.append({"model": name, "n": shape[0], "k": shape[1], "gated": shape[2], "config": str(choice.config),
                         "rows": choice.row_class, "unequal": choice.unequal, "kept": choice.kept,
                         "ratio": None if choice.ratio is None else round(choice.ratio, 3),
                         "best": str(choice.launch), "pick_us": {c: round(t * 1e6, 1) for c, t in choice.pick.items()},
                         "best_us": {c: round(t * 1e6, 1) for c, t in (choice.seconds or {}).items()}})
        args.table.write_text(table_now.to_json(**notes))
        torch.cuda.empty_cache()
    print(table(rows, ["model", "n", "k", "gated", "config", "rows", "pick_us", "best", "best_us", "ratio", "kept",
                       "unequal"]))
    return {"device": torch.cuda.get_device_name(), "seconds": time.perf_counter() - start, "rows": rows}


# -- main -------------------------------------------------------------------------------------------


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def names(choices):
    def parse(text: str) -> list[str]:
        values = text.split(",")
        unknown = [v for v in values if v not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return values

    return parse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Kernel microbenchmarks: validate against the torch reference, then time.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("warp")
    p.add_argument("--vocab", type=ints, default=[16384, 128256])
    p.add_argument("--rows", type=ints, default=[1, 5])
    p.add_argument("--per-program", type=ints, default=[], help="also time the parallel search at these chunks a program")
    p = commands.add_parser("verify")
    p.add_argument("--vocab", type=ints, default=[128256])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch", type=ints, default=[1, 32])
    p = commands.add_parser("walk")
    p.add_argument("--vocab", type=ints, default=[16384, 128256])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--width", type=int, default=4)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--draft-noise", type=float, default=3.0, help="q: the target's logits plus N(0, s^2)")
    p = commands.add_parser("linear")
    p.add_argument("--shapes", type=names(LINEAR_SHAPES), default=list(LINEAR_SHAPES))
    p.add_argument("--rows", type=ints, default=[1, 5])
    p = commands.add_parser("tiles")
    p.add_argument("--shapes", type=names(LINEAR_SHAPES), default=list(LINEAR_SHAPES))
    p.add_argument("--rows", type=ints, default=[1, 5, 16, 17, 33, 64])
    p = commands.add_parser("attention")
    p.add_argument("--positions", type=ints, default=[512, 4096])
    p.add_argument("--tokens", type=ints, default=[1, 5])
    p.add_argument("--runners", action="store_true", help="tiny-model runners: kernel against SDPA logits")
    p = commands.add_parser("attention-tree")
    p.add_argument("--rows", type=ints, default=[33, 17], help="tree nodes")
    p.add_argument("--prefixes", type=ints, default=[10, 100, 1000], help="cached tokens before the tree")
    p.add_argument("--capacity", type=ints, default=[2048], help="cache slots (the engine starts at k + 2 + 640)")
    p.add_argument("--chain", type=int, default=7, help="a chain of this many rows at each prefix (0: none)")
    p.add_argument("--layers", type=int, default=32, help="calls a replay, each on a cache of its own")
    p.add_argument("--kernels", action="store_true", help="also each kernel's us a call (torch.profiler)")
    p = commands.add_parser("steps")
    p.add_argument("--variants", type=names(VARIANTS), default=["eager", "graph-sdpa", "graph-kernel"],
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--profile", action="store_true", help="kernel table of each variant's step")
    p.add_argument("--profile-tokens", type=int, choices=(1, 5), default=1,
                   help="the profiled step's tokens (both are captured)")
    p.add_argument("--model", choices=list(MODELS), default="8b", help="Llama-3-8B, Llama-3.2-1B or a bench-pair shape")
    p.add_argument("--layers", type=int, default=0, help="fewer decoder layers (0: the model's)")
    p = commands.add_parser("exact")
    p.add_argument("--models", type=names(EXACT_SHAPES), default=["8b", "1b", "bench-target", "bench-draft"])
    p.add_argument("--layers", type=int, default=0, help="layers of each model (0: EXACT_SHAPES')")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--position", type=int, default=POSITION)
    p = commands.add_parser("table")
    p.add_argument("--models", type=names(["llama-3.1", "qwen2.5", "qwen3", "gemma-2", "bench", "llama-3.1-head",
                                           "qwen2.5-head", "qwen3-head"]),
                   default=["llama-3.1", "qwen2.5", "qwen3", "gemma-2", "bench", "llama-3.1-head", "qwen2.5-head",
                            "qwen3-head"])
    p.add_argument("--missing", action="store_true", help="only the shapes the package's table does not list")
    p.add_argument("--undrafted", action="store_true", help="only the shapes without a draft pick in the package")
    p.add_argument("--rows", type=ints, default=[1, 5])
    p.add_argument("--table", type=Path, required=True, help="write the tuned table (package format) here")
    p = commands.add_parser("launches")
    p.add_argument("--models", type=names(["llama-3.1", "qwen2.5", "qwen3", "gemma-2", "bench"]),
                   default=["llama-3.1", "bench"])
    p.add_argument("--table", type=Path, required=True, help="the package's table with the launches found")
    p = commands.add_parser("step-table")
    p.add_argument("--models", type=names(["llama-3.1", "qwen2.5", "qwen3", "gemma-2"]),
                   default=["llama-3.1", "qwen2.5", "qwen3"])
    p.add_argument("--table", type=Path, required=True, help="the package's table with the new draft picks")
    for p in commands.choices.values():
        p.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not (args.command == "attention" and args.runners):
        raise SystemExit("bench_kernels: needs a CUDA GPU (only `attention --runners` runs on a CPU)")
    run = {"warp": bench_warp, "verify": bench_verify, "walk": bench_walk, "linear": bench_linear, "tiles": bench_tiles, "attention": bench_attention,
           "attention-tree": bench_attention_tree,
           "steps": bench_steps, "exact": bench_exact, "table": bench_table,
           "step-table": bench_step_table, "launches": bench_launches}[args.command]
    report = run(args)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
