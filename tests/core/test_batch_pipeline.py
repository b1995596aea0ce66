"""core/batch_decode.py with two rounds in flight (`pipeline = "on"`, what a captured round gets
under "auto"): round i + 1 is launched before round i is read, and every row's tokens still equal
decoding its prompt alone, whether it ends on max_tokens, a stop id or a stop string; a row that
ends in round i yields nothing of round i + 1, which ran it past its end."""

from __future__ import annotations

from dataclasses import replace

import pytest

from decode_helpers import finish, make_profile, random_prompts
from specgen.core.engine import Engine
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair

SAMPLED = [dict(temperature=0.8, top_k=20), dict(top_p=0.9), dict(temperature=0.0), dict(min_p=0.1), dict()]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("batch_pipeline"), noisy=0.1)


def engine_for(pair, **sampling) -> Engine:
    return Engine(make_profile(*pair, k=3, speculation=dict(pipeline="on"), **sampling))


def alone(engine: Engine, work: list):
    return [finish(engine.decoder(replace(engine.profile, sampling=spec)), ids) for ids, spec in work]


def work_for(engine: Engine, count: int, sampled: bool = False) -> list:
    prompts = random_prompts(200, count, seed=30 + count)
    return [(ids, replace(engine.profile.sampling, max_tokens=5 + 3 * (i % 5), seed=200 + i,
                          **(SAMPLED[i % len(SAMPLED)] if sampled else {})))
            for i, ids in enumerate(prompts)]


def with_stops(engine: Engine, work: list) -> list:
    """Every third prompt ends on a stop id its output reaches alone, every third on a stop string:
    rows end mid-round, at rounds the host learns of only after the next was launched."""
    full = alone(engine, work)
    out = []
    for i, ((ids, spec), done) in enumerate(zip(work, full)):
        if i % 3 == 1 and len(done.token_ids) > 3:
            spec = replace(spec, stop_token_ids=(done.token_ids[2],))
        elif i % 3 == 2 and len(done.text) > 4:
            spec = replace(spec, stop=(done.text[2:4],))
        out.append((ids, spec))
    return out


class Counted:
    """The decoder's program, counting launches (and each launch's rows still running)."""

    def __init__(self, decoder):
        self.decoder, self.inner = decoder, decoder.program
        self.asynchronous = self.inner.asynchronous
        self.launches = 0

    def launch(self) -> None:
        self.launches += 1
        self.inner.launch()


def batched(engine: Engine, batch: int, work: list):
    decoder = engine.batch_decoder(batch)
    assert decoder.pipelined
    results = list(decoder.run(work))
    assert [index for index, _ in results] == list(range(len(work)))
    return [finished for _, finished in results]


def summary(results) -> list[tuple]:
    return [(f.token_ids, f.text, f.reason) for f in results]


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_greedy_rows_equal_each_prompt_alone_with_two_rounds_in_flight(pair, batch):
    """Stop ids, stop strings and max_tokens ending rows mid-flight; 11 prompts: refills at B = 1
    and 3, masked rows at B = 8."""
    engine = engine_for(pair)
    work = with_stops(engine, work_for(engine, 11))
    reference = alone(engine, work)
    assert {f.reason for f in reference} == {"length", "stop_token", "stop"}
    assert summary(batched(engine, batch, work)) == summary(reference)


@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_sampled_rows_equal_each_prompt_alone_with_two_rounds_in_flight(pair, coupling):
    """Each row's draws come from its own generator (rejection) or key (Gumbel): a round past a
    row's end draws from that row's own numbers only, so the rows after it in its slot are as alone."""
    engine = engine_for(pair, temperature=1.0, coupling=coupling)
    work = with_stops(engine, work_for(engine, 9, sampled=True))
    reference = alone(engine, work)
    for batch in (1, 3):
        assert summary(batched(engine, batch, work)) == summary(reference)


def test_a_row_ending_in_a_round_yields_nothing_of_the_round_launched_behind_it(pair):
    """One prompt at B = 1: its last round is read after the round behind it was launched (one
    launch more than the rounds it made alone), and its tokens are its tokens alone, no more."""
    engine = engine_for(pair)
    ids, spec = work_for(engine, 1)[0]
    spec = replace(spec, max_tokens=12)
    reference = finish(engine.decoder(replace(engine.profile, sampling=spec)), ids)
    decoder = engine.batch_decoder(1)
    decoder.program = counted = Counted(decoder)
    [(_, finished)] = list(decoder.run([(ids, spec)]))
    assert counted.launches == reference.stats.rounds + 1
    assert (finished.token_ids, finished.text) == (reference.token_ids, reference.text)


def test_one_round_in_flight_where_the_next_depends_on_this_one(pair):
    """Adaptive k sets each row's budget from its last round: one round in flight, even with
    pipeline on; auto keeps one on the torch backend (its rounds run as they are launched)."""
    adaptive = Engine(make_profile(*pair, k=3, speculation=dict(pipeline="on"),
                                   proposer=ProposerSpec(adaptive_k=True)))
    assert not adaptive.batch_decoder(2).pipelined
    assert not Engine(make_profile(*pair, k=3)).batch_decoder(2).pipelined
    assert not Engine(make_profile(*pair, k=3, speculation=dict(pipeline="off"))).batch_decoder(2).pipelined
