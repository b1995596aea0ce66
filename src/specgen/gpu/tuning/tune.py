"""Tuning gpu/kernels/linear.py's table on this GPU: each weight shape's candidate configurations, timed.

For each (N, K, gated) shape of a pair (linear_table.model_shapes), every candidate configuration is first
checked against the torch reference on the inputs it is timed on (a candidate that disagrees, or
that fails to compile, is dropped), then timed at each row count a run uses (1 for draft and
target-only steps, k + 1 for a verification); the configuration with the least total time wins.
Two winners per shape: among configurations without split-K (`plain`) and among all (`split`), as
gpu/policy.py decides split-K per device; and, when one row is among the row counts, the fastest
at one row (`draft`: what a draft model's runner takes, LinearTable.for_drafts). Every candidate
computes each row the same way whatever the row count, so any winner keeps greedy decoding
bit-exact.

Launches (tune_launches): for a target's shapes, the fastest way to spread a tall call of each
row class (33 to 512 rows) over programs that keeps its pick's sums (gpu/tuning/linear_table.py):
each candidate's rows are checked bitwise against the one-row call, then timed at the class's two
row counts against the pick's own tile; one that gains LAUNCH_GAIN is kept.

The timer is passed in: graph_timer on a GPU, a fake one in the tests (never real timing there).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
import triton

from specgen.gpu.kernels import linear
from specgen.gpu.capture import capture
from specgen.gpu.tuning import linear_table
from specgen.gpu.tuning.linear_table import LinearTable
from specgen.gpu.kernels.reference import gate_up_reference
from specgen.gpu.workspace import Workspace, device_of

L2_BYTES = 256 * 2**20  # weight bytes per timing: more than any L2, so weights come from memory
TOLERANCE = 2e-2  # relative to the output's scale: two bf16 rounding steps


class Timer(Protocol):
    def __call__(self, run: Callable[[int], object], calls: int, config: tuple) -> float:
        """Seconds per call of run(i), i < calls (calls over distinct weight copies)."""


def candidates(k: int, split: bool) -> list[tuple]:
    """The configurations tried for a shape with K = k (with split-K ones when `split`)."""
    plain = [(True, n, bk, 4, 4) for n in (16, 32, 64) for bk in (128, 256)]
    # Matrix-vector programs of 2K to 16K weights (8 to 64 per thread at 4 warps): fewer leave too
    # few bytes in flight per program, more spill registers; K's piece at most K rounded up.
    pieces = sorted({min(triton.next_power_of_2(k), bk) for bk in (512, 1024, 2048, 4096)})
    plain += [(False, n, bk, warps, 1) for bk in pieces for n in (1, 2, 4, 8, 16) for warps in (4, 8)
              if 2048 <= n * bk <= 16384 and (n <= 8 or bk < 512)]
    if not split:
        return plain
    # Narrow tiles and more chunks: a 1B-class draft's projections (2,048 wide) have too few column
    # blocks of 32 to fill an H100 or H200 without them.
    chunked = [(True, n, bk, 4, stages, chunks) for n in (16, 32) for bk in (128, 256) for stages in (3, 4)
               for chunks in (2, 3, 4, 8) if k >= 2 * chunks * bk]
    return plain + chunked


@dataclass
class Choice:
    shape: tuple[int, int, bool]
    plain: tuple
    split: tuple
    seconds: dict  # config -> total seconds over the row counts
    draft: tuple | None = None  # the fastest at one row (when 1 is among the row counts)
    one_row: dict | None = None  # config -> seconds at one row


def tune(shapes, rows: tuple[int, ...], timer: Timer, *, device, dtype=torch.bfloat16, split: bool = True,
         progress: Callable[[str], None] | None = None) -> tuple[LinearTable, list[Choice]]:
    """The table of the best configuration per shape, and each shape's timings."""
    counters = linear.split_k_counters(Workspace(device))
    choices = []
    for n, k, gated in dict.fromkeys(shapes):
        by_rows = _time_shape(n, k, gated, rows, timer, device, dtype, counters, split)
        if not by_rows:
            continue
        seconds = {config: sum(times.values()) for config, times in by_rows.items()}
        plain = min((c for c in seconds if len(c) == 5), key=seconds.get)
        best = min(seconds, key=seconds.get)
        one_row = {config: times[1] for config, times in by_rows.items()} if 1 in rows else None
        draft = min(one_row, key=one_row.get) if one_row else None
        choices.append(Choice((n, k, gated), plain, best, seconds, draft, one_row))
        if progress is not None:
            progress(f"N={n} K={k}{' gated' if gated else ''}: {plain} / {best} / draft {draft}")
    entries = tuple(sorted((c.shape, c.plain, c.split) for c in choices))
    drafts = tuple(sorted((c.shape, c.draft) for c in choices if c.draft is not None))
    return LinearTable(entries, "tuned", drafts), choices


def _weights(n, k, gated, device, dtype, gen) -> tuple[int, list, list]:
    """Copies of a shape's random weights (and up projections when gated) that together exceed any
    L2 on a GPU, so a timing reads weights from memory as a step does: (copies, weights, ups)."""
    weight_bytes = n * k * torch.finfo(dtype).bits // 8 * (2 if gated else 1)
    copies = max(1, min(8, -(-L2_BYTES // weight_bytes))) if torch.device(device).type == "cuda" else 1
    weights = [torch.randn(n, k, device=device, generator=gen).div_(k ** 0.5).to(dtype) for _ in range(copies)]
    ups = [torch.randn(n, k, device=device, generator=gen).div_(k ** 0.5).to(dtype) for _ in range(copies)] \
        if gated else weights
    return copies, weights, ups


def _time_shape(n, k, gated, rows, timer, device, dtype, counters, split) -> dict:
    gen = torch.Generator(device=device).manual_seed(n * 31 + k)
    copies, weights, ups = _weights(n, k, gated, device, dtype, gen)
    inputs = {r: torch.randn(r, k, device=device, generator=gen).to(dtype) for r in rows}
    seconds = {}  # config -> {rows: seconds a call}
    for config in candidates(k, split):
        total = {}
        for r, x in inputs.items():
            def run(i, x=x, config=config):
                if gated:
                    return linear.gate_up(x, weights[i], ups[i], "silu", config, counters=counters)
                return linear.linear(x, weights[i], None, config, counters=counters)
            try:
                if not _agrees(run(0), x, weights[0], ups[0], gated):
                    total = None
                    break
            except Exception:  # noqa: BLE001 (a configuration this GPU cannot compile or run: not a candidate)
                total = None
                break
            total[r] = timer(run, copies, config)
        if total is not None:
            seconds[config] = total
    return seconds


def _agrees(out, x, weight, up, gated) -> bool:
    ref = gate_up_reference(x.float(), weight.float(), up.float(), "silu") if gated else F.linear(x.float(), weight.float())
    scale = ref.abs().max().item() or 1.0
    return (out.float() - ref).abs().max().item() <= TOLERANCE * scale


# -- launches for tall calls ------------------------------------------------------------------------

LAUNCH_ROWS = {64: (33, 64), 128: (80, 128), 512: (160, 320)}  # row class -> the row counts it is timed at
# A launch is kept where its time over the pick's own tile, averaged over its class's row counts, is
# at most this: an H200's timings of one launch repeat within 1-2%.
LAUNCH_GAIN = 0.97


def launch_candidates(k: int, config: tuple, row_class: int) -> list[tuple]:
    """The launches tried for a row class: 64-row tiles (and 128-row ones above 64 rows) over BLOCK_N,
    BLOCK_K, warps and stages, each keeping the configuration's sums (linear_table.keeps_sums)."""
    found = [(64, n, bk, warps, stages) for n in (32, 64, 128) for bk in (64, 128, 256) for warps in (4, 8)
             for stages in (3, 4)]
    if row_class > 64:
        found += [(128, n, bk, 8, stages) for n in (32, 64) for bk in (64, 128) for stages in (2, 3)]
    return [launch for launch in found if linear_table.keeps_sums(k, config, launch)]


def launch_classes(sizes, batch: bool) -> tuple[int, ...]:
    """The row classes a profile's runs call the target with: 64 always (a prompt's prefill chunks
    of 64 rows), the classes of its tall step sizes, and all of them for batches (prompts prefilled
    in groups of up to 8 chunks: core/round/batch_prefill.py)."""
    if batch:
        return linear_table.ROW_CLASSES
    found = {64} | {next(c for c in linear_table.ROW_CLASSES if size <= c) for size in sizes
                    if size > linear_table.TALL_FROM}
    return tuple(sorted(found))


@dataclass
class LaunchChoice:
    shape: tuple[int, int, bool]
    config: tuple
    row_class: int
    pick: dict  # rows -> seconds a call in the configuration's own tile
    launch: tuple | None = None  # the fastest candidate with each row's bits, kept or not
    seconds: dict | None = None  # rows -> its seconds a call
    ratio: float | None = None  # its mean time over the pick's
    unequal: int = 0  # candidates whose rows were not the one-row call's, bit for bit

    @property
    def kept(self) -> bool:
        return self.ratio is not None and self.ratio <= LAUNCH_GAIN


def tune_launches(table: LinearTable, shapes, timer: Timer, *, device, dtype=torch.bfloat16,
                  classes=linear_table.ROW_CLASSES, split: bool = True, candidates_of=None,
                  progress: Callable[[str], None] | None = None) -> tuple[LinearTable, list[LaunchChoice]]:
    """`table` with the launches found for the shapes' picks (split-K's when `split`, as CUDA runs
    them) in each row class of `classes`; each class's choice. 16-bit models only (float32 ones
    keep the configuration's tile: gpu/kernels/linear.py). The timer gets (config, launch) for a
    candidate, (config, None) for the pick's own tile."""
    counters = linear.split_k_counters(Workspace(device))
    candidates_of = candidates_of or launch_candidates
    found, choices = [], []
    for n, k, gated in dict.fromkeys(shapes):
        config = table.pick(n, k, gated, split, 1)
        if not config[0] or torch.finfo(dtype).bits > 16:
            continue
        gen = torch.Generator(device=device).manual_seed(n * 37 + k)
        copies, weights, ups = _weights(n, k, gated, device, dtype, gen)
        top = max(max(LAUNCH_ROWS[c]) for c in classes)
        x = torch.randn(top, k, device=device, generator=gen).to(dtype)
        act = linear.ACTIVATIONS["silu"] if gated else 0

        def call(i, rows, launch, config=config, weights=weights, ups=ups, x=x, act=act):
            return linear.run(x[:rows], weights[i], ups[i] if act else None, None, act, config, counters, None,
                              False, launch=launch)
        alone = torch.cat([linear.run(x[r:r + 1], weights[0], ups[0] if act else None, None, act, config, counters,
                                      None, False) for r in range(top)])  # each row in a one-row call
        for row_class in classes:
            counts = LAUNCH_ROWS[row_class]
            pick = {c: timer(lambda i, c=c: call(i, c, None), copies, (config, None)) for c in counts}
            choice = LaunchChoice((n, k, gated), config, row_class, pick)
            for launch in candidates_of(k, config, row_class):
                try:
                    if not all(torch.equal(call(0, c, launch), alone[:c]) for c in counts):
                        choice.unequal += 1
                        continue
                except Exception:  # noqa: BLE001 (a tile this GPU cannot compile or run: not a candidate)
                    continue
                seconds = {c: timer(lambda i, c=c, launch=launch: call(i, c, launch), copies, (config, launch))
                           for c in counts}
                ratio = sum(seconds[c] / pick[c] for c in counts) / len(counts)
                if choice.ratio is None or ratio < choice.ratio:
                    choice.launch, choice.seconds, choice.ratio = launch, seconds, ratio
            if choice.kept:
                found.append(((n, k, gated), config, row_class, choice.launch))
            choices.append(choice)
            if progress is not None:
                progress(launch_line(choice))
    # the launches found over the table's own (kept for the shapes and classes not tuned here)
    merged = LinearTable(launches=tuple(sorted(found))).over(table).launches
    return dataclasses.replace(table, launches=merged), choices


def launch_line(choice: LaunchChoice) -> str:
    """A report line: the class's launch against the pick's own tile."""
    n, k, gated = choice.shape
    counts = sorted(choice.pick)
    pick = "/".join(f"{choice.pick[c] * 1e6:.1f}" for c in counts)
    head = f"N={n} K={k}{' gated' if gated else ''} {list(choice.config)}, {'/'.join(map(str, counts))} rows:"
    if choice.launch is None:
        return f"{head} {pick} us in its own tile, no launch kept the rows' bits"
    best = "/".join(f"{choice.seconds[c] * 1e6:.1f}" for c in counts)
    return (f"{head} {pick} us in its own tile, launch {list(choice.launch)} {best} us"
            f"{'' if choice.kept else ' (not kept: under 3%)'}")


def graph_timer(run: Callable[[int], object], calls: int, config: tuple, replays: int = 20) -> float:
    """Median seconds per call of run(i), captured in one CUDA graph over `calls` weight copies."""
    def each() -> None:
        for i in range(calls):
            run(i)

    graph, _ = capture(each, device_of("cuda"), 1)
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


# -- a draft's one-row picks, chosen inside its captured step ----------------------------------------
#
# Why: tune() times each shape alone, 16 weights of that shape captured one after another. In a
# draft's step each projection follows a different kernel (a norm, the attention merge) and is
# followed by another, and with dependent launch the next kernel's programs are scheduled only once
# every program of this one has passed its release. On an H200 the Llama-3.2-1B step's q/k/v pick
# from tune() (one column a program, 3,072 programs) cost 14 µs a step against two columns a
# program, which tune() had timed as slower; Qwen3-0.6B's step gained 5% from three such changes
# (docs/benchmarks.md, "Draft picks chosen inside the step (H200)"). Why is measured, not explained,
# so a draft's picks are chosen by the step's own time.


class StepTimer(Protocol):
    def __call__(self, picks: dict) -> float:
        """Seconds of one captured one-row step of the draft with these picks ((n, k, gated) ->
        configuration) for its one-row calls."""


@dataclass
class InStep:
    picks: dict  # (n, k, gated) -> configuration: where the descent ended
    before: float  # the starting picks' step, seconds (median of the final comparison)
    after: float  # the final picks' step, seconds
    trials: list  # (shape, configuration, candidate's seconds, current picks' seconds), in order


def step_candidates(n: int, k: int, gated: bool) -> list[tuple]:
    """The matrix-vector configurations a draft's shape is tried with inside its step: 1 to 8
    columns a program, K in pieces of 512 to 4096, 4 or 8 warps, at most 8K weights a program
    (4K a weight when gated: two weights' loads in flight)."""
    pieces = sorted({min(triton.next_power_of_2(k), piece) for piece in (512, 1024, 2048, 4096)})
    most = 4096 if gated else 8192
    return [(False, columns, piece, warps, 1) for columns in (1, 2, 4, 8) for piece in pieces for warps in (4, 8)
            if columns * piece <= most]


def tune_in_step(shapes, start: dict, timer: StepTimer, *, candidates_of=step_candidates, confirm: int = 3,
                 margin: float = 0.004, shortlist: int = 3,
                 progress: Callable[[str], None] | None = None) -> InStep:
    """Coordinate descent over the shapes in order: each candidate of a shape is timed once, each
    time beside the current picks (so that a drifting clock shifts both); the `shortlist` that beat
    the current picks most are timed `confirm` more times each, alternating, and the first whose
    median beats the current picks' median by more than `margin` (a fraction of the step) replaces
    them. A step moves by a few µs between replays of the same graph, so smaller gains are noise.
    A candidate whose step fails to build or run (this GPU cannot compile it) is passed over."""
    current = dict(start)
    trials = []
    for shape in dict.fromkeys(shapes):
        scores = []
        for config in candidates_of(*shape):
            if config == current[shape]:
                continue
            try:
                mine = timer({**current, shape: config})
            except Exception:  # noqa: BLE001 (a configuration this GPU cannot compile or run: not a candidate)
                continue
            theirs = timer(current)
            trials.append((shape, config, mine, theirs))
            scores.append((mine - theirs, config))
        scores.sort()
        for gain, config in scores[:shortlist]:
            if gain >= 0:
                break
            mine, theirs = _alternate(timer, {**current, shape: config}, current, confirm)
            trials.append((shape, config, mine, theirs))
            if mine < theirs * (1 - margin):
                if progress is not None:
                    progress(f"N={shape[0]} K={shape[1]}{' gated' if shape[2] else ''}: {list(current[shape])} -> "
                             f"{list(config)}: step {theirs * 1e3:.4f} -> {mine * 1e3:.4f} ms")
                current[shape] = config
                break
    after, before = _alternate(timer, current, dict(start), confirm)
    return InStep(current, before, after, trials)


def tune_draft(model, kernels, shapes, workspace: Workspace, *, timer: StepTimer | None = None,
               position: int = 512, progress: Callable[[str], None] | None = None) -> InStep:
    """tune_in_step for a draft model on a GPU: `kernels` as its runner takes them (a draft's table,
    LinearTable.for_drafts), starting from that table's one-row picks of `shapes`; timed by
    draft_step_timer unless `timer` is given."""
    table = kernels.linear_table
    start = {shape: table.pick(*shape, kernels.split_k, 1) for shape in shapes}
    if timer is None:
        width = model.config.get_text_config(decoder=True).vocab_size
        timer = draft_step_timer(model, width, kernels, workspace, position=position)
    return tune_in_step(shapes, start, timer, progress=progress)


def _alternate(timer: StepTimer, a: dict, b: dict, times: int) -> tuple[float, float]:
    """Medians of a's and b's steps timed `times` times each, alternating."""
    first, second = [], []
    for _ in range(times):
        first.append(timer(a))
        second.append(timer(b))
    return statistics.median(first), statistics.median(second)


def draft_step_timer(model, width: int, kernels, workspace: Workspace, *, capacity: int = 1024,
                     position: int = 512, steps: int = 50, repeats: int = 5) -> StepTimer:
    """A StepTimer for `model` (a draft, on a GPU): each call builds a runner with the picks over
    `kernels`' table, captures its one-token step and times it at `position` after a random prefix
    (median over `repeats` runs of `steps` steps)."""
    from specgen.gpu.runner import GraphRunner  # noqa: PLC0415 (the runner pulls in transformers)

    base = kernels.linear_table

    def timer(picks: dict) -> float:
        drafts = dict(base.drafts) | picks
        table = LinearTable(base.entries, f"{base.source}, in-step picks", tuple(sorted(drafts.items())),
                            for_draft=True)
        runner = GraphRunner(model, width, capacity, kernels=dataclasses.replace(kernels, linear_table=table),
                             workspace=workspace, shapes=(1,))
        try:
            return step_seconds(runner, 1, position, steps, repeats)
        finally:
            # each runner holds a cache and graphs, and a descent builds a few hundred runners: free
            # them before the next build, not whenever the collector reaches the runner's cycles
            del runner
            gc.collect()
            torch.cuda.empty_cache()

    return timer


def step_seconds(runner, tokens: int, position: int, steps: int = 50, repeats: int = 5) -> float:
    """Median seconds of `runner`'s captured `tokens`-token step at `position` (after a random
    prefix; rolled back after each step), over `repeats` runs of `steps` steps timed with CUDA events."""
    device = runner.device
    ids = torch.randint(0, runner.width, (tokens,), device=device)
    runner.reset()
    runner.forward(torch.randint(0, runner.width, (position,), device=device), want_logits=False)
    for _ in range(3):
        runner.forward(ids)
        runner.truncate(position)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            runner.forward(ids)
            runner.truncate(position)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / steps)
    return statistics.median(times)
