"""The decode loop: prefill, then one round at a time, as a generator of events.

Per round the loop chooses who drafts (the draft model on the device, or the host's n-gram
lookup), launches the round (core/round/) and reads its staged results once. As soon as a
round's results are on the host the next round is queued, and fates, stop ids and strings,
detokenizing, statistics and the event are done while it runs.

Two rounds in flight (`[speculation] pipeline`, DecodeSetup.pipeline): where nothing the host
learns from a round changes the next one (the draft model or a head drafts; no n-gram lookup, no
adaptive k, no logprobs, which read the round's logits), round n + 1 is queued before round n's
results are read, so the GPU does not wait for the host between rounds: its sync, the Python of
a round's bookkeeping and the next launch. Each round reads what the one before left on the
device (its inputs, positions, counts; max_tokens caps the drafts there, Round.limit), and each
of the two has its own staging buffers on the host and its own capture (timing events). The
tokens are the same as one round at a time: every round computes what it would have, and the
random numbers are drawn in the same order. No round is queued behind one that may reach
max_tokens; a round queued behind one cut by a stop id or string is abandoned (the next run
starts afresh).

The loop knows nothing about terminals: it yields RoundEvent per round and a final Finished.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from specgen.core.backend import Program, RoundClock
from specgen.core.models.context import context_error
from specgen.core.models.detok import IncrementalDetokenizer, TextTracker
from specgen.core.errors import UsageError
from specgen.core.events import Fate, Finished, Output, RoundEvent, logprob_entries, text_starts
from specgen.core.drafters.merge_rule import MergeRule
from specgen.core.drafters.ngram import NgramProposer
from specgen.core.drafters.proposers import AdaptiveK
from specgen.core.round import Mode, Round
from specgen.core.sampling.warp import logprobs_from_logits
from specgen.core.settings import SamplingSpec
from specgen.core.stats import AcceptanceStats


@dataclass
class DecodeSetup:
    """What the loop needs besides the round: built once per run by the caller."""

    sampling: SamplingSpec
    k: int
    eos_ids: set[int]
    max_context: int | None = None  # positions the target supports; None = unbounded
    pipeline: str = "auto"  # two rounds in flight where the loop allows it (see above)


@dataclass
class _Launched:
    """A round queued on the device, waiting for its one sync."""

    mode: Mode
    k_used: int | None  # the round's budget: k, cut near max_tokens or by adaptive k (None: set at fetch)
    host: list[int] | None  # the host's drafts (n-gram rounds; a LookupTree in tree rounds)
    slot: int = 0  # its host buffers, clock and capture


@dataclass
class _Run:
    """One run's host state: what settle() reads and grows round by round."""

    stats: AcceptanceStats
    gen: torch.Generator  # rejection coupling's draws
    start: float  # perf_counter at the run's start
    text: TextTracker
    out: Output
    flight: deque = field(default_factory=deque)  # rounds queued, oldest first
    round_end: float = 0.0
    index: int = 0
    reason: str | None = None  # why the run ends, once known


class Decoder:
    """Runs requests through one Round. lookup: the n-gram proposer (ngram and hybrid): a round
    whose context matches drafts on the host, others on the draft model (if there is one), or
    where the round has one (Mode.EMPTY: the ngram proposer's tree round), on its program that
    steps the target over the root alone."""

    def __init__(self, rnd: Round, programs: dict[Mode, Program], tokenizer, setup: DecodeSetup,
                 lookup: NgramProposer | None = None, adaptive_k: bool = False, backend=None,
                 merge: MergeRule | None = None):
        self.round, self.programs, self.tokenizer, self.setup = rnd, programs, tokenizer, setup
        self.lookup = lookup
        self.merge = merge  # hybrid trees: whether a lookup's round merges with the model's tree
        self.adaptive_k = adaptive_k
        self.backend = backend if backend is not None else rnd.backend
        spec = setup.sampling
        self.stop_ids = set(spec.stop_token_ids) | (set() if spec.ignore_eos else set(setup.eos_ids))
        pin = rnd.device.type == "cuda"
        self.depth = self._depth()  # rounds in flight
        self.clocks = [RoundClock(rnd.device) for _ in range(self.depth)]
        self.host_ids = [torch.zeros(rnd.stage_ids.numel(), dtype=torch.long, pin_memory=pin)
                         for _ in range(self.depth)]
        self.host_f = [torch.zeros(rnd.stage_f.numel(), dtype=torch.float32, pin_memory=pin)
                       for _ in range(self.depth)]
        for program in programs.values():
            program.prepare(self.depth)  # the second capture now, not inside the first run
        self.stats = AcceptanceStats()  # of the current (or last) run, live while it goes
        self.proposer_rounds = {"ngram": 0, "draft": 0}  # rounds each proposer drafted (this run)

    def _depth(self) -> int:
        """2 when the next round may be queued before this one's results are read, else 1."""
        setup = self.setup
        if (setup.pipeline == "off" or self.lookup is not None or self.adaptive_k
                or setup.sampling.logprobs is not None):
            return 1
        if setup.pipeline == "on":
            return 2
        return 2 if all(program.asynchronous for program in self.programs.values()) else 1

    @property
    def pipelined(self) -> bool:
        """Whether this decoder keeps two rounds in flight."""
        return self.depth == 2

    def _generator(self, seed: int) -> torch.Generator:
        gen = torch.Generator(device=self.round.device)
        gen.manual_seed(seed)
        return gen

    def check_prompt(self, prompt_ids: list[int], can_truncate: bool = True) -> None:
        """Refuse a prompt that cannot fit with max_tokens and a round's k + 1 rows in the context;
        can_truncate: the command offers --truncate-prompt (the hint then names it)."""
        if not prompt_ids:
            raise UsageError("the prompt is empty", hint="give a prompt as an argument or on stdin")
        error = context_error(len(prompt_ids), self.setup.sampling.max_tokens, self.setup.k, self.setup.max_context,
                              can_truncate)
        if error is not None:
            raise error

    def reserve(self, prompt_tokens: int) -> None:
        """Room in every cache for a run of a prompt this long (a run does it as it starts; a caller
        that times runs does it first for its longest prompt, so that no cache re-allocates, and no
        captured round re-captures, inside a timed run)."""
        # k + 2: a round queued behind the last one fits too (_queue_ahead)
        self.round.reserve(prompt_tokens + self.setup.sampling.max_tokens + self.setup.k + 2)

    def run(self, prompt_ids: list[int]):
        """Prefill, then rounds until a stop or max_tokens: a RoundEvent per round, then Finished."""
        self.check_prompt(prompt_ids)
        spec, rnd = self.setup.sampling, self.round
        run = self._begin(prompt_ids)
        rnd.draw(run.gen)
        run.flight.append(self._launch(0, spec, 0))
        rnd.draw(run.gen)  # the next round's numbers, queued behind this round
        self._queue_ahead(run, 0)
        run.round_end = time.perf_counter()
        while True:
            yield self.settle(run.flight.popleft())
            if run.reason is None and len(run.out.ids) >= spec.max_tokens:
                run.reason = "length"
            if run.reason is not None:
                out, text = run.out, run.text
                tail = text.finish(run.reason == "stop")
                yield Finished(run.reason, text.released, out.ids, out.fates, run.stats, out.pieces, tail,
                               out.logprobs)
                return
            run.index += 1

    def _begin(self, prompt_ids: list[int]) -> _Run:
        """A run's state, both caches prefilled and the host proposer started."""
        spec, rnd = self.setup.sampling, self.round
        self.stats = AcceptanceStats()
        self.proposer_rounds = dict.fromkeys(self.proposer_rounds, 0)
        self.adaptive = AdaptiveK() if self.adaptive_k else None
        if self.merge is not None:
            self.merge.start()
        seed = spec.seed if spec.seed is not None else int(torch.seed()) % 2**63
        start = time.perf_counter()
        self.reserve(len(prompt_ids))
        rnd.start(prompt_ids, seed, max_tokens=spec.max_tokens)
        if self.lookup is not None:
            self.lookup.start(prompt_ids)
        self.stats.prefill_seconds = time.perf_counter() - start
        self.current = _Run(self.stats, self._generator(seed), start,
                            TextTracker(IncrementalDetokenizer(self.tokenizer, prompt_ids), spec.stop),
                            Output(spec.logprobs is not None))
        return self.current

    def settle(self, launched: _Launched) -> RoundEvent:
        """What the host learns from a round: its one sync, the tokens' fates, stop ids, logprobs,
        the proposers' verdict, then (with the next round queued as soon as this one is known not
        to end the run) detokenizing, stop strings, statistics and the event."""
        run, spec = self.current, self.setup.sampling
        ids, drafted, n, taken, p, q, entropy, ranks, tree = self._fetch(launched)
        # The round's tokens are on the host now: the time they count at. Not when the event is
        # yielded: on the CPU the next round's launch runs it to the end before that.
        fetched = time.perf_counter()
        spans = self.clocks[launched.slot].spans()
        if launched.k_used is None:  # queued before the round before it was read: its budget now
            launched.k_used = max(0, min(self.setup.k, spec.max_tokens - len(run.out.ids) - 1))
        self.backend.check(ids[0])
        emitted = [t for t in ids if t >= 0]
        # a tree's walk may end on a draw it accepted outside the tree (taken): a draft accepted too
        num_accepted = len(emitted) - 1 + int(taken)
        drafted = self._cut_at_stop(drafted[:n])
        fates = [Fate.ACCEPTED] * num_accepted + \
            ([] if taken else [Fate.BONUS if num_accepted == n else Fate.RECOVERED])
        run.reason, emitted, fates = self._stop_tokens(emitted, fates)
        logprobs = self._logprobs(emitted, spec) if spec.logprobs is not None else None
        self._follow(launched, emitted, num_accepted, ranks)
        self._next(run, len(run.out.ids) + len(emitted), launched.slot)
        emitted, fates, pieces, starts, delta, logprobs = self._text(run, emitted, fates, logprobs)
        run.stats.released(fetched - run.start, len(emitted))
        now = time.perf_counter()
        timings = {**spans, "other": max(0.0, now - run.round_end - sum(spans.values()))}
        run.round_end = now
        used, kept_accepted = len(drafted), min(num_accepted, len(emitted))
        early_stop = used < launched.k_used
        ranks = ranks if ranks is None else ranks[:kept_accepted]
        # a hybrid tree round: whose nodes the accepted path took, from the ranks and the staged trie
        source = self.round.read_source(ranks, kept_accepted, launched.host)
        run.stats.add_round(used, kept_accepted, len(emitted), timings, early_stop=early_stop,
                            k_used=launched.k_used, ranks=ranks, source=source)
        event = RoundEvent(run.index, emitted, fates, delta, pieces, used, kept_accepted, drafted, timings,
                           q and q[:used], p and p[:used], logprobs, k_used=launched.k_used, early_stop=early_stop)
        event.target_entropy = entropy and entropy[:used]
        event.ranks, event.tree = ranks, tree
        event.source, event.lookup_nodes = source or (None, None)
        run.out.add(event, starts)
        return event

    def _next(self, run: _Run, generated: int, slot: int) -> None:
        """Queue the next round (and the one after it, with two in flight) unless this one ends the run."""
        if run.reason is None and generated < self.setup.sampling.max_tokens:
            if not run.flight:
                run.flight.append(self._launch(generated, self.setup.sampling, slot))
                self.round.draw(run.gen)
            self._queue_ahead(run, generated)

    def _text(self, run: _Run, emitted: list[int], fates: list, logprobs):
        """Detokenize the round's ids; a stop string cuts them where the text ends (this round's
        and the run's), and ends the run."""
        text = run.text
        pieces = [text.detok.add([t]) for t in emitted]
        before = len(text.text)
        delta, stop_hit = text.add("".join(pieces))
        starts = text_starts(before, pieces)
        if stop_hit and run.reason is None:  # the ids end where the text ends, in this round and before
            run.reason = "stop"
            keep = sum(1 for at in starts if at < len(text.text))
            emitted, fates, pieces, starts = emitted[:keep], fates[:keep], pieces[:keep], starts[:keep]
            logprobs = logprobs and logprobs[:keep]
            run.stats.drop(run.out.trim(len(text.text)))
        return emitted, fates, pieces, starts, delta, logprobs

    def _queue_ahead(self, run: _Run, generated: int) -> None:
        """With two in flight: queue the round after the one in flight, unless that one may end the
        run on length (it emits up to k + 1 tokens). So a run that ends on max_tokens leaves no round
        behind it; one cut by a stop id or string may leave one, which the next run's start waits for."""
        flight = run.flight
        if self.depth == 2 and len(flight) == 1 and generated + self.setup.k + 1 < self.setup.sampling.max_tokens:
            flight.append(self._launch(None, self.setup.sampling, 1 - flight[0].slot))
            self.round.draw(run.gen)

    def _launch(self, generated: int | None, spec: SamplingSpec, slot: int) -> _Launched:
        """Choose who drafts, queue the round and the copy of its results (no sync). generated:
        the tokens before this round; None when the round before it is still in flight (two rounds
        in flight: the budget set for the run's first round stands, and the device caps it at
        max_tokens)."""
        rnd = self.round
        budget = None
        if generated is not None:
            budget = min(self.setup.k, spec.max_tokens - generated - 1)
            if self.adaptive is not None:
                budget = self.adaptive.budget(budget)
        mode = Mode.MODEL if Mode.MODEL in self.programs else Mode.HOST
        host = None
        if self.lookup is not None:
            host = self.lookup.lookup(budget)
            if host or mode is Mode.HOST:
                mode = Mode.HOST
        if mode is Mode.HOST and not host and Mode.EMPTY in self.programs:
            mode = Mode.EMPTY  # nothing found: the program over the root alone, which has no drafts to set
        if mode is Mode.HOST and Mode.MERGED in self.programs and (Mode.HOST not in self.programs
                                                                  or self.merge.merge()):
            mode = Mode.MERGED  # hybrid trees: the lookup's trie merged with the model's tree
        if mode in (Mode.HOST, Mode.MERGED):
            rnd.set_host_drafts(host or [], mode)
        elif mode is Mode.MODEL and budget is not None:
            rnd.set_budget(budget)
        self.proposer_rounds["draft" if mode is Mode.MODEL else "ngram"] += 1
        clock = self.clocks[slot]
        self.programs[mode].launch(clock, slot)
        self.host_ids[slot].copy_(rnd.stage_ids, non_blocking=True)
        if rnd.floats:
            self.host_f[slot].copy_(rnd.stage_f, non_blocking=True)
        clock.finish()
        return _Launched(mode, budget, host, slot)

    def _fetch(self, launched: _Launched):
        """The round's one sync, then plain host reads of its staged results."""
        self.clocks[launched.slot].wait()
        rnd = self.round
        values, floats = self.host_ids[launched.slot].tolist(), self.host_f[launched.slot].tolist()
        ids, drafted, n, taken = rnd.read_ids(values)
        p, q, entropy = rnd.read_floats(floats, launched.mode)
        return ids, drafted, n, taken, p, q, entropy, rnd.read_ranks(values), rnd.read_tree(floats, launched.mode)

    def _follow(self, launched: _Launched, emitted: list[int], num_accepted: int, ranks: list[int] | None) -> None:
        """Host proposers, adaptive k and hybrid trees' merge rule learn the round's verdict before
        the next round (ranks: a tree round's accepted nodes' sibling indices)."""
        if self.lookup is not None:
            self.lookup.follow(emitted)
        if self.adaptive is not None and launched.k_used > 0:
            self.adaptive.update(num_accepted)
        if self.merge is not None and launched.mode in (Mode.HOST, Mode.MERGED):
            source = self.round.read_source(ranks and ranks[:num_accepted], num_accepted, launched.host)
            self.merge.update(launched.mode is Mode.MERGED, len(emitted), source and source[0])

    def _logprobs(self, emitted: list[int], spec: SamplingSpec) -> list[dict]:
        """Log-probabilities of the emitted ids (read before the next launch rewrites the logits)."""
        logits = self.round.target_logits[: len(emitted)]
        if spec.logprobs_mode == "raw":
            logp = torch.log_softmax(logits, dim=-1)
        else:
            params, penalties, bad = self.round.rows.last
            logp = logprobs_from_logits(self.round.target_logits, params, penalties, bad)[: len(emitted)]
        chosen = logp[torch.arange(len(emitted)), torch.tensor(emitted, device=logp.device)].tolist()
        if spec.logprobs == 0:
            return logprob_entries(emitted, chosen, None, None)
        top = logp.topk(spec.logprobs, dim=-1)
        return logprob_entries(emitted, chosen, top.values.tolist(), top.indices.tolist())

    def _cut_at_stop(self, drafted: list[int]) -> list[int]:
        """Drafts after a drafted stop id were never meant to be proposed."""
        for i, token in enumerate(drafted):
            if token in self.stop_ids:
                return drafted[: i + 1]
        return drafted

    def _stop_tokens(self, emitted, fates):
        """Cut the round after the first stop token (EOS unless ignore_eos, or a stop_token_id)."""
        for i, token in enumerate(emitted):
            if token in self.stop_ids:
                reason = "stop_token" if token in self.setup.sampling.stop_token_ids else "eos"
                return reason, emitted[: i + 1], fates[: i + 1]
        return None, emitted, fates
