"""`specgen bench --batch-size 1,4,16`: batches, target-only against speculative, at each batch size.

At each batch size B > 1 the same prompts go through core/batch_decode.py's BatchDecoder
(continuous batching, B rows), at B = 1 one after another through the single-prompt decoder
(core/decode.py, what `generate` runs at batch 1: run_alone), once target-only (k = 0) and once
per k of the sweep with the run's one proposer (PROPOSERS: the draft model, or an EAGLE-3 head),
after an untimed warm-up over the B longest prompts (captures, and caches grown to their size
before the clock starts). What is measured, per run:

    tokens_per_second    every prompt's tokens over the wall seconds of the whole run (the
                         batch's throughput)
    row_ms_per_token     per row: the milliseconds from its start (its prefill included) to its
                         last token, over its tokens; summarised over the prompts as bench's other
                         figures are (median, p25, p75, min, max: what one request waits per token)

Speculation costs the draft's steps and a verification step k + 1 rows wide; at batch 1 those
are nearly free (the step streams the weights once whatever its rows), but as B grows a step's
rows cost compute of their own and the speculative round's extra rows stop paying.
`recommend` (core/batch_cost.py, which `batch_size` auto reads too) says, per batch size,
whether the best speculative run beats target-only there and where speculation stops paying: the
smallest measured B at which the best speculative tokens/s is below target-only's. A complete
bench keeps its rows for `batch_size` auto (core/measured.py, cli/bench.py).

Each run also weighs its rounds against their floor (core/bench/floors.py, `batch_bytes`): the
weights streamed once a step and each row's keys and values read, the drafter's k steps (the draft
model's, or the head's: floors.head_batch_bytes) and the target's one, over the device's copy
bandwidth. A round's device time is measured around each
launch (`RoundMeter`: CUDA events, read after the run; on the CPU, where a launch runs the round,
its wall time); the rows and cached positions each round reads are summed on the device before
its launch, so nothing waits for them.
"""

from __future__ import annotations

import gc
import time
from dataclasses import replace
from typing import Callable

import torch

from specgen.core.batch_cost import recommend  # noqa: F401 (the bench's recommendation, batch auto's too)
from specgen.core.bench.bench_plan import shape_label
from specgen.core.bench import floors
from specgen.core.stats import AcceptanceStats

SCHEMA = "specgen.bench.batches/1"
# the proposers measured, one a run (every proposer batches take: core/engine.py batch_refusal); a
# lookup's rows (ngram, hybrid) hold what its matches bought on the prompts measured
PROPOSERS = ("draft", "eagle", "ngram", "hybrid")


def measure(engine, prompt_ids: list[list[int]], settings_for: Callable, batch_sizes: tuple[int, ...],
            ks: tuple[int, ...], temperature: float, warmup: int = 1, progress=None,
            bandwidth: float | None = None, proposer: str = "draft",
            shapes: Callable = lambda k: (None,)) -> list[dict]:
    """Every (B, method) run: target-only (k 0) and each k of `ks` with `proposer` (one of
    PROPOSERS), each in every tree shape of shapes(k) ((tree_width, tree_nodes), (1, 0) a chain,
    None the profile's own: core/bench/bench_plan.py, Plan.shapes), at each batch size, in order.
    settings_for(k, temperature, proposer, tree) -> Profile; progress(steps, label) after each
    run; bandwidth: the device's copy bandwidth in bytes/s (floors.copy_bandwidth), None off CUDA."""
    if proposer not in PROPOSERS:
        raise ValueError(f"batches draft with {' or '.join(PROPOSERS)}, not {proposer}")
    results = []
    for batch in batch_sizes:
        runs = [(0, None)] + [(k, tree) for k in ks for tree in shapes(k)]
        for k, tree in runs:
            profile = settings_for(k or ks[0], temperature, "none" if k == 0 else proposer, tree)
            result = run(engine, profile, batch, prompt_ids, warmup, bandwidth)
            results.append(result)
            label = f"batch {batch}, " + ("target-only" if k == 0 else shape_label(result))
            engine.forget_batches()  # its caches: B rows each, not kept past the run
            if progress is not None:
                progress(1, label)
    return results


def run(engine, profile, batch: int, prompt_ids: list[list[int]], warmup: int = 1,
        bandwidth: float | None = None) -> dict:
    """One timed run of every prompt through `batch` rows; each prompt its own seed (the profile's + i).
    The profile's proposer drafts (none at k 0). At batch 1 the prompts go one after another
    through the single-prompt decoder (run_alone), which `generate` runs at batch 1."""
    if batch == 1:
        return run_alone(engine, profile, prompt_ids, warmup, bandwidth)
    decoder = engine.batch_decoder(batch, profile)
    base = profile.sampling.seed or 0
    work = [(ids, replace(profile.sampling, seed=base + i)) for i, ids in enumerate(prompt_ids)]
    longest = sorted(range(len(work)), key=lambda i: -len(work[i][0]))[:batch]
    for _ in range(warmup):
        for _ in decoder.run([work[i] for i in sorted(longest)]):
            pass
    decoder.program = meter = RoundMeter(decoder.program, decoder.round)  # the timed run's rounds only
    finished, seconds = _timed(decoder.round.device, lambda: [f for _, f in decoder.run(work)])
    k = decoder.round.k
    width = getattr(decoder.round, "tree_width", 1)  # a BatchTreeRound's; chains are width 1, k nodes
    return _result(engine, profile, "batch", batch, k, width, decoder.round.nodes if width > 1 else k, len(work),
                   finished, seconds, meter, bandwidth)


def _timed(device: torch.device, run: Callable[[], list]) -> tuple[list, float]:
    """run()'s results and its wall seconds, after a collection, between syncs of the device."""
    # the runs before this one let go of their batch rounds (Engine.forget_batches), whose captured
    # graphs and caches are freed whenever the collector reaches their reference cycles; collected
    # here, outside the timed run. Why (not proven): on an H200 one B = 8 run lost 140 ms with equal
    # rounds before this collect, and none since; freeing device memory waits for the device.
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    finished = run()
    if cuda:
        torch.cuda.synchronize(device)
    return finished, time.perf_counter() - began


def _result(engine, profile, decoder: str, batch: int, k: int, width: int, nodes: int, prompts: int,
            finished: list, seconds: float, meter, bandwidth: float | None) -> dict:
    """A run's row of the document (docs/bench-schema.md, "Batches")."""
    from specgen.core.bench.run import summarise

    stats = AcceptanceStats()
    for f in finished:
        stats.merge(f.stats)
    tokens = sum(len(f.token_ids) for f in finished)
    per_row = [1000 * f.stats.generation_seconds / len(f.token_ids) for f in finished if f.token_ids]
    proposer = profile.proposer.kind if k else "none"
    target, drafter = step_bytes(engine, proposer)
    model = profile.proposer.drafter(proposer) if k else "none"  # who drafts on the device: its floor
    return {"batch_size": batch, "decoder": decoder, "method": "speculative" if k else "target-only",
            "proposer": proposer, "k": k, "tree_width": width, "tree_nodes": nodes,
            "prompts": prompts, "tokens": tokens, "seconds": seconds,
            "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
            "row_ms_per_token": summarise(per_row),
            "mean_accepted_length": stats.mean_accepted_length if k else None,
            **round_floor(meter, target, drafter, model, k, bandwidth)}


def run_alone(engine, profile, prompt_ids: list[list[int]], warmup: int = 1,
              bandwidth: float | None = None) -> dict:
    """batch 1: every prompt through the single-prompt decoder (core/decode.py), one after another,
    as `generate` runs a prompts file at batch 1, after `warmup` untimed runs of the longest prompt
    (caches grown to it, rounds captured). Why not the batch decoder at one row: its round carries
    every row's bookkeeping and its loop refills rows, so at B = 1 it measured what no command runs,
    and understated batch 1 against the batches beside it. Measured as `run` measures the batch
    decoder: every prompt's tokens over the wall seconds of the whole run; a round's device time is
    its phases' CUDA events (core/backend.py's clock; on the CPU their wall time), its floor's
    positions those each round starts from (AloneMeter)."""
    base = profile.sampling.seed or 0
    longest = max(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    reach = len(prompt_ids[longest]) + profile.sampling.max_tokens  # what tree_width auto weighs

    def decoder(i: int):
        return engine.decoder(replace(profile, sampling=replace(profile.sampling, seed=base + i)), positions=reach)

    for _ in range(warmup):
        for _ in decoder(longest).run(prompt_ids[longest]):
            pass
    runs, seconds = _timed(engine.pair.device,
                           lambda: [list(decoder(i).run(ids)) for i, ids in enumerate(prompt_ids)])
    meter = AloneMeter()  # read after the clock stops
    finished = [events.pop() for events in runs]
    for ids, events, done in zip(prompt_ids, runs, finished):
        meter.add(len(ids), events, done.stats)
    k = decoder(0).setup.k
    shape = engine.tree_report(profile, positions=reach) if k else {"tree_width": 1, "tree_nodes": 0}
    return _result(engine, profile, "single", 1, k, shape["tree_width"], shape["tree_nodes"], len(prompt_ids),
                   finished, seconds, meter, bandwidth)


class AloneMeter:
    """RoundMeter's figures for single-prompt runs, from their round events: the rounds, their
    device seconds (the phases' spans, the host's `other` left out) and the floor's sums, each
    round's row at the target position it starts from (prompt ids - 1 + tokens emitted before it:
    the batch round's count), the draft model's one less, a head's origin P - e."""

    def __init__(self):
        self.seconds_total = 0.0
        self.sums = [0, 0, 0, 0]  # rows, target positions, draft model positions, head origins

    def add(self, prompt: int, events: list, stats: AcceptanceStats) -> None:
        """A run of a prompt of `prompt` ids: its round events and its statistics."""
        self.seconds_total += sum(v for phase, v in stats.seconds.items() if phase != "other")
        emitted = last = 0
        for event in events:
            at = prompt - 1 + emitted
            self.sums[0] += 1
            self.sums[1] += at
            self.sums[2] += max(at - 1, 0)
            self.sums[3] += max(at - last, 0)
            last = len(event.token_ids)
            emitted += last

    @property
    def rounds(self) -> int:
        return self.sums[0]  # one row a round

    def seconds(self) -> float:
        return self.seconds_total

    def totals(self) -> tuple[int, int, int, int]:
        return tuple(self.sums)


class RoundMeter:
    """A BatchDecoder's program, measured: each launch's device time (CUDA events around it, read
    after the run; on the CPU the launch runs the round, so its wall time), and, queued on the
    device before it, the sums the round's floor needs: the rows that hold a prompt (`active`),
    their cached positions in each model, and where a head's first call extends from (P - e,
    core/round/batch_head.py's origin). Only bench wraps a program in it; the round is
    launched as it is (a captured one replayed), the sums and events lie outside it."""

    def __init__(self, program, rnd):
        self.program, self.rnd = program, rnd
        self.cuda = rnd.device.type == "cuda"
        # per row, summed over the rounds: held a prompt, target positions, draft model positions (the
        # target's where no draft model runs), a head's origins P - e
        self.sums = torch.zeros(4, rnd.batch, dtype=torch.long, device=rnd.device)
        self.origin = torch.zeros(rnd.batch, dtype=torch.long, device=rnd.device)
        self.ends = torch.tensor([0, rnd.positions.shape[0] - 1], device=rnd.device)  # target, last model
        self.spans: list = []  # (start, end) events, or seconds
        # on CUDA the sums are one captured program: eight launches a round would add some 40 µs of
        # the host's time to every round the bench times (7% of a bench-pair round at B = 1)
        self.graph = None
        if self.cuda:
            from specgen.gpu.capture import capture

            self.graph, _ = capture(self._add, rnd.device, 1, settle=self.sums.zero_)  # the warm-up's sums undone

    def __getattr__(self, name):  # asynchronous, and whatever else the decoder asks of its program
        return getattr(self.program, name)

    def _add(self) -> None:
        """This round's rows and positions onto the sums (the round's tensors are allocated once:
        a capture reads them at every replay)."""
        rnd = self.rnd
        self.sums[0].add_(rnd.active)
        self.sums[1:3] += rnd.positions.index_select(0, self.ends) * rnd.active
        torch.sub(rnd.positions[0], rnd.emitted, out=self.origin)  # the round reads them as its head does
        self.sums[3] += self.origin.clamp_(min=0) * rnd.active

    def launch(self) -> None:
        self.rnd.flush()  # the rows' starts and stops, which the sums read (the program's flush is then a no-op)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._add()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.program.launch()
            end.record()
            self.spans.append((start, end))
        else:
            began = time.perf_counter()
            self.program.launch()
            self.spans.append(time.perf_counter() - began)

    @property
    def rounds(self) -> int:
        return len(self.spans)

    def seconds(self) -> float:
        """The rounds' device time, after the run's last sync."""
        if self.cuda:
            return sum(start.elapsed_time(end) for start, end in self.spans) / 1e3
        return sum(self.spans)

    def totals(self) -> tuple[int, int, int, int]:
        """(rows, target positions, draft model positions, head origins), each summed over the
        rounds (read after the run)."""
        rows, target, draft, origins = self.sums.sum(1).tolist()
        return rows, target, draft, origins


def model_bytes(model) -> floors.StepBytes:
    """floors.StepBytes of a model of the round, from the model and the dtype its cache holds."""
    return floors.StepBytes(floors.streamed_bytes(model),
                            floors.cache_bytes_per_position(model.config, model.dtype.itemsize))


def step_bytes(engine, proposer: str) -> tuple[floors.StepBytes, floors.StepBytes | None]:
    """floors.StepBytes of the target and of the model that drafts for `proposer` (hybrid's
    `hybrid_with`): the draft model, the EAGLE-3 head (floors.head_step_bytes), None for prompt
    lookup and none."""
    target = model_bytes(engine.pair.target)
    model = engine.profile.proposer.drafter(proposer)
    if model == "eagle":
        return target, floors.head_step_bytes(engine.heads["eagle"].head)
    if model == "draft" and engine.pair.draft is not None:
        return target, model_bytes(engine.pair.draft)
    return target, None


def round_floor(meter: RoundMeter, target: floors.StepBytes, drafter: floors.StepBytes | None, model: str,
                k: int, bandwidth: float | None) -> dict:
    """A run's rounds against their floor (docs/bench-schema.md, "Batches"): the mean device ms of
    a round, the mean bytes its floor reads by model (`draft`: what the model that drafts reads,
    `model` being ProposerSpec.drafter's draft or eagle, or 0 where it is none: prompt lookup
    drafts on the host; hybrid's is its model's k steps, its lookup's rounds counted as the
    model's), and, where the bandwidth is known, the floor in ms and the round over it."""
    rounds = meter.rounds
    out = {"rounds": rounds, "round_ms": 1e3 * meter.seconds() / rounds if rounds else None,
           "rows_per_round": None, "round_floor_bytes": None, "round_floor_ms": None, "round_over_floor": None}
    if not rounds:
        return out
    rows, target_positions, draft_positions, origins = meter.totals()
    out["rows_per_round"] = rows / rounds
    if model == "eagle":
        parts = {"target": floors.batch_bytes(target, None, 0, rounds, rows, target_positions)["target"],
                 "draft": floors.head_batch_bytes(drafter, k, rounds, rows, target_positions, origins)}
    else:
        parts = floors.batch_bytes(target, drafter, k, rounds, rows, target_positions, draft_positions)
        if k and model == "none":  # prompt lookup: nothing streamed to draft
            parts["draft"] = 0
    if parts["target"] is None or (k and parts["draft"] is None):
        return out
    out["round_floor_bytes"] = {"target": parts["target"] / rounds,
                                "draft": parts["draft"] / rounds if k else None}
    if bandwidth is not None:
        floor = sum(v for v in out["round_floor_bytes"].values() if v is not None) / bandwidth * 1e3
        out["round_floor_ms"] = floor
        out["round_over_floor"] = out["round_ms"] / floor
    return out


def document(results: list[dict], engine, temperature: float, startup_seconds: float, prompts: int,
             max_tokens: int, incomplete: bool = False, bandwidth: float | None = None,
             proposer: str = "draft") -> dict:
    """The JSON document of a batch bench (docs/bench-schema.md, "Batches"); proposer: the one
    the speculative runs drafted with (PROPOSERS)."""
    from specgen.core.engine import device_name
    from specgen.core.measured import drafting_head

    recommendations, stops = recommend(results)
    profile = engine.profile
    pair = {"target": profile.target.path, "draft": profile.draft.path if profile.draft is not None else None,
            "head": drafting_head(profile.proposer, proposer),
            "device_name": device_name(engine.pair.device),
            "dtype": str(engine.pair.target.dtype).removeprefix("torch.")}
    return {"schema": SCHEMA, "profile": profile.name, "proposer": proposer, "pair": pair,
            "environment": engine.describe(),
            "startup_seconds": startup_seconds, "temperature": temperature,
            "coupling": engine.profile.sampling.coupling if temperature > 0 else None,
            "prompts": prompts, "max_tokens": max_tokens,
            "batch_sizes": list(dict.fromkeys(r["batch_size"] for r in results)),
            "floor": floor_facts(engine, bandwidth, proposer),
            "results": results, "recommendations": recommendations, "speculation_stops_paying_at": stops,
            "incomplete": incomplete}


def floor_facts(engine, bandwidth: float | None, proposer: str = "draft") -> dict:
    """What the runs' floors are made of: the bandwidth and, for the target and the proposer's
    drafter (`draft`: the draft model or the head), its weight bytes (all of them), the bytes of
    them only a round's first drafter call reads (a head's fc) and its cache's bytes a position."""
    steps = dict(zip(("target", "draft"), step_bytes(engine, proposer)))
    return {"copy_bandwidth_bytes_per_s": bandwidth,
            "streamed_bytes": {name: s.weights + s.first if s is not None else None for name, s in steps.items()},
            "first_call_bytes": {name: s.first if s is not None else None for name, s in steps.items()},
            "cache_bytes_per_position": {name: s.per_position if s is not None else None for name, s in steps.items()}}
