"""Batch decoding with what each round drafted: for batch invariance tests that check the drafter's
own work (a random head's drafts are rarely accepted, so tokens alone would hide them)."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

import pytest

from decode_helpers import finish
from specgen.core.engine import Engine, target_only
from specgen.core.events import RoundEvent


def alone_rounds(engine: Engine, work: list) -> list[tuple]:
    """Each prompt's (tokens, fates, every round's counted drafts) decoded alone."""
    out = []
    for ids, spec in work:
        events = list(engine.decoder(replace(engine.profile, sampling=spec)).run(ids))
        drafts = [e.drafted_ids for e in events if isinstance(e, RoundEvent)]
        out.append((events[-1].token_ids, events[-1].fates, drafts))
    return out


class Recorder:
    """The batch's program, noting after each round the counted drafts of every row that holds a
    prompt (the staged ids: output row | drafts | count; none past a drafted stop id of the row's,
    as both decoders count them: a tree's staged path goes on below a stop id its walk rejected,
    which a row short of its min_tokens always does), by the prompt's index, and what
    probe(round, row) reads of its round (None: nothing). The torch backend's program is eager:
    one round in flight, so a row holds its prompt through its rounds only."""

    asynchronous = False

    def __init__(self, decoder, probe=None):
        self.decoder, self.inner, self.probe = decoder, decoder.program, probe
        self.drafts = defaultdict(list)
        self.probed = defaultdict(list)
        decoder.program = self

    def launch(self) -> None:
        self.inner.launch()
        k = self.decoder.round.k
        for b, (row, staged) in enumerate(zip(self.decoder.rows, self.decoder.round.stage_ids.tolist())):
            if row is not None:
                drafts = staged[k + 1: k + 1 + staged[2 * k + 1]]
                cut = next((i + 1 for i, t in enumerate(drafts) if t in row.stops), len(drafts))
                self.drafts[row.index].append(drafts[:cut])
                if self.probe is not None:
                    self.probed[row.index].append(self.probe(self.decoder.round, b))


class AloneProbe:
    """A decoder's program that notes after each round what probe(round) reads of it (eager, as
    the torch backend's: the round is done when launch returns)."""

    def __init__(self, inner, decoder, probe, into: list):
        self.inner, self.decoder, self.probe, self.into = inner, decoder, probe, into
        self.asynchronous = inner.asynchronous

    def prepare(self, slots: int) -> None:
        self.inner.prepare(slots)

    def launch(self, *args) -> None:
        self.inner.launch(*args)
        self.into.append(self.probe(self.decoder.round))


def alone_probes(engine: Engine, work: list, probe) -> list[tuple]:
    """Each prompt's (tokens, every round's probe(round)), decoded alone."""
    out = []
    for ids, spec in work:
        decoder = engine.decoder(replace(engine.profile, sampling=spec))
        seen: list = []
        decoder.programs = {mode: AloneProbe(program, decoder, probe, seen)
                            for mode, program in decoder.programs.items()}
        out.append((finish(decoder, ids).token_ids, seen))
    return out


def batched_probes(engine: Engine, batch: int, work: list, probe) -> list[tuple]:
    """Each prompt's (tokens, every round's probe(round, its row)) through `batch` rows, in order."""
    decoder = engine.batch_decoder(batch)
    recorder = Recorder(decoder, probe)
    return [(f.token_ids, recorder.probed[i]) for i, f in decoder.run(work)]


def batched_rounds(engine: Engine, batch: int, work: list, finished: list | None = None) -> list[tuple]:
    """Each prompt's (tokens, fates, every round's counted drafts) through `batch` rows, in order;
    finished: a list that takes each prompt's Finished (its statistics), in order."""
    decoder = engine.batch_decoder(batch)
    assert not decoder.pipelined
    recorder = Recorder(decoder)
    results = list(decoder.run(work))
    assert [index for index, _ in results] == list(range(len(work)))
    if finished is not None:
        finished += [f for _, f in results]
    return [(f.token_ids, f.fates, recorder.drafts[i]) for i, f in results]


def chain_prompts(engine: Engine, count: int, seed: int = 0) -> list[list[int]]:
    """Prompts that hold the text a bigram target (tiny_models.bigram_target) writes after them, so
    that prompt lookup finds drafts it accepts: the target's greedy chain from a random id (3 to 14
    ids), then the chain's first one or two ids again; every third prompt a random one (1 to 12 ids)
    whose lookups find little at first."""
    return _bigram_prompts(engine, count, seed, (2, 13), lambda rng, i, chain: chain + chain[: 1 + i % 2])


def branch_prompts(engine: Engine, count: int, seed: int = 0) -> list[list[int]]:
    """Prompts where prompt lookup's trees branch, for a bigram target (tiny_models.bigram_target):
    the target's greedy chain from a random id (4 to 12 ids), a copy of it with one id changed past
    its second, then the chain's first two ids again, so that the suffix has two continuations
    (the copy's, rank 0, latest; the chain's, which the target writes); every third prompt a random
    one (1 to 12 ids) whose lookups find little at first."""
    def branched(rng, i, chain):
        tweak = list(chain)
        tweak[rng.randrange(2, len(tweak))] = rng.randrange(200)
        return chain + tweak + chain[:2]
    return _bigram_prompts(engine, count, seed, (3, 11), branched)


def _bigram_prompts(engine: Engine, count: int, seed: int, grown: tuple[int, int], shape) -> list[list[int]]:
    """`count` prompts: every third random (1 to 12 ids), the others shape(rng, i, chain) of the
    target's greedy chain from a random id, grown by a number of ids in `grown`."""
    rng = random.Random(seed)
    plain = target_only(engine.profile)
    prompts = []
    for i in range(count):
        if i % 3 == 2:
            prompts.append([rng.randrange(200) for _ in range(rng.randint(1, 12))])
            continue
        first = [rng.randrange(200)]
        prompts.append(shape(rng, i, first + _greedy(engine, plain, first, rng.randint(*grown))))
    return prompts


def _greedy(engine: Engine, profile, ids: list[int], tokens: int) -> list[int]:
    """The target's greedy text after ids (target-only)."""
    events = list(engine.decoder(replace(profile, sampling=replace(profile.sampling, max_tokens=tokens,
                                                                   temperature=0.0))).run(ids))
    return events[-1].token_ids


# Per-row settings of prompt lookup's batches (tests/core/round/test_batch_lookup*.py): a greedy row
# among sampled ones with every cut
LOOKUP_SAMPLED = [dict(temperature=0.7, top_k=20), dict(top_p=0.9), dict(), dict(temperature=0.0), dict(min_p=0.1)]


@pytest.fixture(scope="module")
def bigram(tmp_path_factory):
    """A bigram target (tiny_models.bigram_target) whose text prompt lookup finds in its prompts;
    a test module takes it by importing it."""
    from tiny_models import bigram_target, build_pair

    root = tmp_path_factory.mktemp("batch-bigram")
    target, _ = build_pair(root)
    return bigram_target(target, root / "bigram")
