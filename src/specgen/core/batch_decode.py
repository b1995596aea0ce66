"""The batch loop: a queue of prompts through B rows of one BatchRound (continuous batching).

Up to B prompts are in flight, each in a row of its own; a round runs every row at once and its
one sync brings back every row's staged ids. The host then settles each row as the single
decode loop settles a run (core/decode.py: stop ids, max_tokens, stop strings, statistics), and
a row that finished takes the next prompt of the queue at once, so a long prompt never holds the
others back. Results come out in input order, each as soon as every earlier prompt is done: what
waits are the results that finished while an earlier prompt still runs, at most WAITING x B of
them (then free rows take no prompt until it is done), and the queue is read one prompt at a time,
never the whole file: memory is bounded by B, not by the file.

Two rounds in flight (`[speculation] pipeline`, as core/decode.py's): round i + 1 is queued before
round i's staged ids are read, so the device does not wait for the host between rounds (its sync,
each row's settling, refills, the next launch). Nothing the host learns from round i changes round
i + 1: each row's budget is k on the device, where count_drafts_rows caps it at max_tokens (`limit`),
the same cap the host would set; each round copies its staged ids into host buffers of its own. A
row that ends in round i (a stop id or string, max_tokens) has run on in round i + 1: the host
drops what it made there (its results are those of a prompt that has finished), and the row is
stopped and refilled at round i's settling, queued behind round i + 1. Rows stay what they are
alone: a row's rounds and draws are the ones it makes alone, in the same order; rounds past its
end only add rounds nobody reads. Adaptive k chooses each row's budget from the round before it,
and prompt lookup and hybrid (the round's host_drafts) each row's drafts from the tokens before
them, so with either one round is in flight: at launch each row's budget (and, for lookup, its
drafts from its own proposer, core/round/batch_lookup.py, core/round/batch_hybrid.py) is set from
what the rows hold, and a row's proposer follows the tokens it emitted when its round settles.

Logprobs (a row's sampling.logprobs): after a round whose rows ask, the round's logprobs part
(core/round/batch_logprobs.py) is queued behind it, before the next round can rewrite its logits,
and its staged values are copied into a host buffer of the round's own, like its ids, so two
rounds stay in flight; at the round's settling each row that asks takes the entries of the tokens
it kept, cut where a stop id or string cuts them, as core/decode.py's. A round where no row asks
computes and copies nothing more.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

from specgen.core.drafters.proposers import AdaptiveK
from specgen.core.events import Fate, Finished
from specgen.core.models.detok import IncrementalDetokenizer, TextTracker
from specgen.core.round.batch_round import BatchRound
from specgen.core.settings import SamplingSpec
from specgen.core.stats import AcceptanceStats


ACCEPTED, BONUS, RECOVERED = Fate.ACCEPTED, Fate.BONUS, Fate.RECOVERED
WAITING = 4  # results held for an earlier prompt still running, per row, before free rows stop taking prompts


@dataclass(slots=True)
class _Row:
    """One prompt's host state while it holds a row."""

    index: int
    spec: SamplingSpec
    gen: torch.Generator  # rejection coupling's draws, from the prompt's seed
    text: TextTracker
    start: float
    stops: frozenset  # the ids that end it: its stop ids, and the model's eos unless ignore_eos
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    # the tokens emitted so far and their fates (no per-token text: nothing a batch writes shows it)
    ids: list[int] = field(default_factory=list)
    fates: list[Fate] = field(default_factory=list)
    adaptive: AdaptiveK | None = None
    budget: int = 0
    reason: str | None = None
    logprobs: list[dict] | None = None  # the tokens' logprob entries, where its settings ask for them
    decoded: int = 0  # ids[:decoded] went through text's detokenizer (see caught_up)

    def caught_up(self) -> TextTracker:
        """Its text with every id so far detokenized. Without stop strings nothing reads the text
        before the row ends (a batch shows no per-token text), so the ids wait and go through the
        detokenizer at once, as a round's do (IncrementalDetokenizer.add_all: the text of any split
        of the ids is the same); with stop strings every round's go at its settling, where a stop
        string must end the row."""
        if self.decoded < len(self.ids):
            self.text.add(self.text.detok.add_all(self.ids[self.decoded:]))
            self.decoded = len(self.ids)
        return self.text


@dataclass
class _Launched:
    """A round queued on the device: who held each row when it was launched (None: a free row),
    and which host buffers its staged ids (and logprobs, where a row asked: `logprobs`) are copied into."""

    rows: list
    slot: int
    logprobs: bool = False


class BatchDecoder:
    """Runs prompts through `rnd`, each round by `program` (the backend's: run as it is, or
    captured). eos_ids: the model's; cut(spec): whether the draft's q keeps the prompt's top-k /
    top-p / min-p (core/engine.draft_picking); adaptive_k: each row its own; pipeline: auto | on |
    off, two rounds in flight (auto: where the program only queues a round)."""

    def __init__(self, rnd: BatchRound, program, tokenizer, eos_ids: set[int], cut, adaptive_k: bool = False,
                 pipeline: str = "auto"):
        self.round, self.program = rnd, program
        self.tokenizer, self.eos_ids, self.cut, self.adaptive_k = tokenizer, eos_ids, cut, adaptive_k
        self.rows: list[_Row | None] = [None] * rnd.batch
        asynchronous = getattr(program, "asynchronous", False)
        # the next round's budgets or drafts depend on this round's tokens: one round in flight
        serial = adaptive_k or rnd.host_drafts
        self.depth = 1 if serial or pipeline == "off" or (pipeline == "auto" and not asynchronous) else 2
        cuda = rnd.device.type == "cuda"
        # each round in flight its own host copy of the staged ids (pinned: the copy is queued, not waited
        # for) and its own event: the round's one sync
        self.host = [torch.zeros(rnd.stage_ids.shape, dtype=torch.long, pin_memory=cuda) for _ in range(self.depth)]
        self.host_logprobs: list[torch.Tensor | None] = [None] * self.depth  # likewise, once a row asks
        self.events = [torch.cuda.Event() if cuda else None for _ in range(self.depth)]
        # each row's generator, reseeded by each prompt it takes: the state a new one would have,
        # without making one per prompt (a draw queued from the last prompt's took its state by value)
        self.gens: list[torch.Generator | None] = [None] * rnd.batch
        self.host_drafts = rnd.host_drafts  # (fixed by the drafter) settling hands its proposer each row's tokens
        self.entropy = random.SystemRandom()  # an unseeded prompt's seed

    @property
    def pipelined(self) -> bool:
        return self.depth == 2

    def run(self, jobs: Iterable[tuple[list[int], SamplingSpec]]) -> Iterator[tuple[int, Finished]]:
        """(index, Finished) for each (prompt ids, settings) of `jobs`, in their order, each as soon
        as every earlier one is out. Should the queue fail (a prompts file that turned unreadable),
        it is read no further, the prompts taken run to their end and come out, then the error.
        Should a round or a row's start fail, every result finished by then comes out first (in
        order, leaving out the prompts still running), then the error; on Ctrl-C the prompts still
        running come out too, as far as they got (reason "interrupted")."""
        queue, done, ready = enumerate(jobs), {}, 0
        self.exhausted, self.failure = False, None
        for b, row in enumerate(self.rows):  # a run the caller stopped reading left its rows
            if row is not None:
                self.rows[b] = None
                self.round.stop(b)
        flight: deque[_Launched] = deque()
        self.fetched = time.perf_counter()
        try:
            self._fill(queue, done)
            while any(self.rows) or flight:
                while any(self.rows) and len(flight) < self.depth:
                    flight.append(self._launch(flight))
                self._settle_round(flight.popleft(), done)
                while ready in done:
                    yield ready, done.pop(ready)
                    ready += 1
                self._fill(queue, done)
            if self.failure is not None:
                raise self.failure
        except GeneratorExit:  # the caller stopped reading: nothing to hand over
            raise
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):  # what the prompts in flight produced, as one prompt's Ctrl-C
                done.update((row.index, self._interrupted(row)) for row in self.rows if row is not None)
            for index in sorted(done):
                yield index, done.pop(index)
            raise

    def _fill(self, queue, done: dict) -> None:
        """Each free row takes the queue's next prompt, while fewer than WAITING x B results wait
        for an earlier prompt (a long prompt holds back what finished after it, never more:
        memory is bounded by B, not by the file); the rows left free run masked."""
        for b, row in enumerate(self.rows):
            if row is None and not self.exhausted and len(done) < WAITING * self.round.batch:
                self.exhausted = not self._refill(b, queue)

    def _refill(self, b: int, queue) -> bool:
        """Row b takes the queue's next prompt; False when the queue is empty or failed (its error
        kept for the end of the run, after the prompts taken)."""
        try:
            job = next(queue, None)
        except Exception as exc:
            self.failure = exc
            return False
        if job is None:
            return False
        index, (ids, spec) = job
        started = time.perf_counter()
        # unseeded: 63 bits from the OS, as torch.seed() gives (which also reseeds every device's
        # default generator, nothing of specgen's draws from, at ~10x the cost)
        seed = spec.seed if spec.seed is not None else self.entropy.getrandbits(63)
        gen = self.gens[b]
        if gen is None:
            gen = self.gens[b] = torch.Generator(device=self.round.device)
        gen.manual_seed(seed)
        self.round.start(b, ids, spec, seed, self.cut(spec))
        stops = frozenset(spec.stop_token_ids) | (frozenset() if spec.ignore_eos else frozenset(self.eos_ids))
        row = _Row(index, spec, gen, TextTracker(IncrementalDetokenizer(self.tokenizer, ids), spec.stop), started,
                   stops, adaptive=AdaptiveK() if self.adaptive_k else None,
                   logprobs=[] if spec.logprobs is not None else None)
        row.stats.prefill_seconds = time.perf_counter() - started
        self.rows[b] = row
        return True

    def _launch(self, flight: deque) -> _Launched:
        """Queue a round for the rows as they are, and the copy of its staged ids (no sync). With
        adaptive k or host drafts (one round in flight) each row's budget is its own, set first (host
        drafts: each row's drafts up to it); otherwise every row's is k (BatchRound.start) and the
        device caps it at max_tokens."""
        rnd = self.round
        if self.adaptive_k or self.host_drafts:
            for row in self.rows:
                if row is not None:
                    row.budget = self._budget(row) if row.adaptive is None else row.adaptive.budget(self._budget(row))
            rnd.set_budgets([row.budget if row is not None else 0 for row in self.rows])
        logprobs = False
        for b, row in enumerate(self.rows):
            if row is not None:
                rnd.draw(b, row.gen)
                logprobs = logprobs or row.logprobs is not None
        slot = 1 - flight[-1].slot if flight else 0
        self.program.launch()
        self.host[slot].copy_(rnd.stage_ids, non_blocking=True)
        if logprobs:  # queued behind the round, before the next one rewrites its logits
            staged = rnd.logprobs.stage([row.spec if row is not None else None for row in self.rows])
            if self.host_logprobs[slot] is None:
                self.host_logprobs[slot] = torch.zeros(staged.shape, dtype=staged.dtype,
                                                       pin_memory=rnd.device.type == "cuda")
            self.host_logprobs[slot].copy_(staged, non_blocking=True)
        if self.events[slot] is not None:
            self.events[slot].record()
        return _Launched(list(self.rows), slot, logprobs)

    def _budget(self, row: _Row) -> int:
        """The drafts a round may make for row (before adaptive k): what the device's limit leaves."""
        return max(0, min(self.round.k, row.spec.max_tokens - len(row.ids) - 1))

    def _settle_round(self, launched: _Launched, done: dict) -> None:
        """The round's one sync and one read of every row's staged ids; each row that held its
        prompt through the round settled (a row whose prompt ended in an earlier round ran on past
        its end: nothing of it is read), and the rows that end now freed."""
        rnd = self.round
        if self.events[launched.slot] is not None:
            self.events[launched.slot].synchronize()
        staged = self.host[launched.slot].tolist()
        now = time.perf_counter()
        timings, self.fetched = {"other": now - self.fetched}, now  # the batch's round, not split into phases
        live = [(b, row) for b, row in enumerate(launched.rows) if row is not None and row.reason is None]
        first = min([staged[b][0] for b, _ in live], default=0)
        rnd.backend.check(first)  # the kernels' error sentinel (a row's first id), as one request's
        logprobs = self.host_logprobs[launched.slot] if launched.logprobs else None
        settle, follows = self._settle, self.host_drafts
        for b, row in live:
            before = len(row.ids)
            if settle(row, staged[b], timings, now, logprobs, b):
                done[row.index] = self._finish(row)
                self.rows[b] = None
                rnd.stop(b)
            elif follows:  # a host drafter's proposer reads the row's new tokens (a row that goes on keeps them all)
                rnd.follow(b, row.ids[before:])

    def _settle(self, row: _Row, staged: list[int], timings: dict, now: float, logprobs: torch.Tensor | None = None,
                b: int = 0) -> bool:
        """Row's share of the round (core/decode.py, `Decoder.settle`); True when it is done.
        logprobs: the host copy of the round's staged logprobs (row b's), where a row asked."""
        k = self.round.k
        ids, stops, spec, adaptive = row.ids, row.stops, row.spec, row.adaptive
        if adaptive is None:  # the budget the device kept to (with adaptive k: set at launch)
            budget = spec.max_tokens - len(ids) - 1
            row.budget = budget = k if budget > k else budget if budget > 0 else 0
        else:
            budget = row.budget
        emitted = staged[: k + 1]
        if emitted[k] < 0:  # -1 past what the row emitted
            emitted = [t for t in emitted if t >= 0]
        n = staged[2 * k + 1]
        # a tree's walk may end on a draw it accepted outside the tree (taken): a draft accepted too
        taken, ranks = self.round.read_tree(staged)
        accepted = len(emitted) - 1 + int(taken)
        used = n
        if stops:
            drafted = staged[k + 1: k + 1 + n]
            if not stops.isdisjoint(drafted):  # none past a drafted stop id
                used = next(i + 1 for i, t in enumerate(drafted) if t in stops)
            if not stops.isdisjoint(emitted):
                end = next(i + 1 for i, t in enumerate(emitted) if t in stops)
                row.reason = "stop_token" if emitted[end - 1] in spec.stop_token_ids else "eos"
                emitted = emitted[:end]
        if adaptive is not None and budget > 0:
            adaptive.update(accepted)
        if row.logprobs is not None:
            entries = self.round.logprobs.entries(logprobs, b, emitted, spec)
        if spec.stop:  # stop strings: the round's text now (without, it waits: _Row.caught_up)
            emitted = self._text(row, emitted)
        if row.logprobs is not None:
            row.logprobs += entries[: len(emitted)]
        count = len(emitted)
        kept = accepted if accepted < count else count
        stats = row.stats
        stats.released(now - row.start, count)
        ranks = ranks if ranks is None else ranks[:kept]
        stats.add_round(used, kept, count, timings, used < budget, budget, ranks=ranks,
                        source=self.round.read_source(b, ranks, kept))
        ids += emitted
        if spec.stop:
            row.decoded = len(ids)
        if count > kept:
            row.fates += [ACCEPTED] * kept + [BONUS if accepted == n else RECOVERED]
        else:
            row.fates += [ACCEPTED] * kept
        if row.reason is None and len(ids) >= spec.max_tokens:
            row.reason = "length"
        return row.reason is not None

    def _text(self, row: _Row, emitted: list[int]) -> list[int]:
        """Detokenize the round's ids at once; a stop string cuts the ids where the text ends (as
        core/decode.py's `Decoder._text`, which takes them one at a time and keeps each one's text:
        here only a stop string needs that, replayed when it hits). Returns the ids kept."""
        text = row.text
        _, stop_hit = text.add(text.detok.add_all(emitted))
        if stop_hit and row.reason is None:
            row.reason = "stop"
            at, keep = 0, 0  # the ids whose text starts before the cut, earlier rounds' included
            for piece in text.detok.pieces():
                if at >= len(text.text):
                    break
                at, keep = at + len(piece), keep + 1
            if keep < len(row.ids):
                row.stats.drop(row.fates[keep:])
                del row.ids[keep:], row.fates[keep:]
                if row.logprobs is not None:
                    del row.logprobs[keep:]
            emitted = emitted[: max(0, keep - len(row.ids))]
        return emitted

    def _interrupted(self, row: _Row) -> Finished:
        return Finished("interrupted", row.caught_up().released, row.ids, row.fates, row.stats, logprobs=row.logprobs)

    def _finish(self, row: _Row) -> Finished:
        tail = row.caught_up().finish(row.reason == "stop")
        return Finished(row.reason, row.text.released, row.ids, row.fates, row.stats, [], tail, row.logprobs)
