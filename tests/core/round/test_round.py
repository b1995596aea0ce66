"""core/round/round.py: the round's buffers, draws, device-built warp rows, cache commit rule and runners.

The loop (tests/core/test_decode.py) checks the round's output; these tests drive a Round directly, one
round at a time with no pipeline, so the per-round invariants can be read between rounds:
the target cache holds the committed sequence minus its last id (feed[0, 0]), the draft cache
minus its last two (pending); a one-token prompt is seen twice by the draft.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from decode_helpers import draft_sequence, finish, make_profile, random_prompts, relative_error
from round_helpers import RecordingBackend, StubRunner
from specgen.core.sampling import warp as sampling
from specgen.core.backend import RoundClock
from specgen.core.engine import Engine, draft_picking, target_only
from specgen.core.round import Mode, Round, RoundShape
from specgen.core.runner import EagerRunner
from specgen.core.settings import ProposerSpec, SamplingSpec, SpeculationSpec
from tiny_models import build_pair


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp(request.param), family=request.param, noisy=0.1)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("round"), noisy=0.1)


# ---------------------------------------------------------------- the runner's static cache


def test_slot_cache_rollback_matches_a_fresh_forward(pair):
    engine = Engine(make_profile(*pair))
    runner = EagerRunner(engine.pair.target, engine.width, 64)
    prompt = torch.tensor([5, 6, 7, 8])
    runner.reset()
    runner.forward(prompt[:-1], want_logits=False)
    runner.forward(torch.tensor([8, 40, 41, 42, 43]))  # a round of 4 drafts
    runner.position.sub_(3)  # keep `8, 40`: one draft was accepted
    got = runner.forward(torch.tensor([50, 51])).clone()
    fresh = EagerRunner(engine.pair.target, engine.width, 64)
    want = fresh.forward(torch.tensor([5, 6, 7, 8, 40, 50, 51]))[-2:]
    assert relative_error(got, want) < 1e-5  # float32 rounding only
    assert int(runner.position) == 7


def test_reserve_grows_the_cache_and_decoding_goes_on(llama):
    """Runners sized too small make room when a request needs more (reserve before start)."""
    profile = make_profile(*llama, max_tokens=8)
    engine = Engine(profile)
    engine.target_runner = EagerRunner(engine.pair.target, engine.width, 32)
    engine.draft_runner = EagerRunner(engine.pair.draft, engine.width, 32)
    prompt = (random_prompts(engine.pair.vocab_size, 1, seed=2)[0] * 150)[:150]
    expected = finish(Engine(profile).decoder(target_only(profile)), prompt).token_ids
    assert finish(engine.decoder(), prompt).token_ids == expected
    for runner in (engine.target_runner, engine.draft_runner):
        assert runner.capacity >= len(prompt) + 8


# ---------------------------------------------------------------- rounds one at a time


def drive(engine, decoder, prompt: list[int], rounds: int, seed: int = 0, host: bool = False) -> list[int]:
    """Runs `rounds` rounds of decoder's Round by hand (host=True: alternating with host drafts of
    random length, as hybrid rounds do) and checks both caches after every one. Returns the drafts
    that counted in each round."""
    rnd, k = decoder.round, decoder.setup.k
    rng = random.Random(seed)
    clock = RoundClock(rnd.device)
    gen = torch.Generator(device=rnd.device).manual_seed(seed)
    rnd.reserve(len(prompt) + rounds * (k + 1) + 2)
    rnd.start(prompt)
    committed, counted = list(prompt), []
    for i in range(rounds):
        mode = Mode.HOST if host and i % 2 else Mode.MODEL
        if mode is Mode.HOST:
            rnd.set_host_drafts([rng.randrange(engine.pair.vocab_size) for _ in range(rng.randint(0, k))])
        else:
            rnd.set_budget(k)
        rnd.draw(gen)
        decoder.programs[mode].launch(clock)
        clock.finish()
        clock.wait()
        emitted = [t for t in rnd.out[0].tolist() if t >= 0]
        assert 1 <= len(emitted) <= int(rnd.num_drafts) + 1
        committed += emitted
        counted.append(int(rnd.num_drafts))
        check_caches(engine, rnd, prompt, committed[len(prompt):], f"round {i} ({mode.name})")
    return counted


def check_caches(engine, rnd: Round, prompt: list[int], output: list[int], where: str) -> None:
    """Positions, feed and pending follow the committed sequence; the caches' contents too: one
    step over feed[0, 0] (target) and pending (draft) gives a fresh forward's last logits. The
    probe steps are rolled back, so the round after them is unchanged."""
    committed = prompt + output
    assert int(rnd.target.position) == len(committed) - 1, where
    assert int(rnd.feed[0, 0]) == committed[-1], where
    got = rnd.target.forward(rnd.feed[0, :1].clone())[-1]
    rnd.target.position.sub_(1)
    want = EagerRunner(engine.pair.target, engine.width, len(committed) + 8).forward(torch.tensor(committed))[-1]
    assert relative_error(got, want) < 1e-4, f"{where}: target cache"
    if rnd.draft is None:
        return
    seen = draft_sequence(prompt, output)
    assert int(rnd.draft.position) == len(seen) - 2, f"{where}: draft position"
    assert rnd.drafter.pending[0].tolist() == seen[-2:], where
    got = rnd.draft.forward(rnd.drafter.pending[0].clone())[-1]
    rnd.draft.position.sub_(2)
    want = EagerRunner(engine.pair.draft, engine.width, len(seen) + 8).forward(torch.tensor(seen))[-1]
    assert relative_error(got, want) < 1e-4, f"{where}: draft cache"


@pytest.mark.parametrize("settings", [dict(), dict(temperature=1.0), dict(temperature=0.8, top_k=20, top_p=0.9)])
@pytest.mark.parametrize("prompt", [[7], [3, 9], [2, 3, 4, 5, 6]])
def test_draft_model_rounds_keep_both_caches_committed(llama, settings, prompt):
    engine = Engine(make_profile(*llama, k=4, **settings))
    drive(engine, engine.decoder(), prompt, rounds=6)


@pytest.mark.parametrize("prompt", [[7], [2, 3, 4, 5, 6]])
def test_host_rounds_keep_the_draft_following(llama, prompt):
    """Hybrid rounds: host drafts of 0..k ids (padded to k, masked by num_drafts) between draft-model
    rounds; the draft steps over [committed[-2], feed] in host rounds and keeps following."""
    engine = Engine(make_profile(*llama, k=3, proposer=ProposerSpec(kind="hybrid"), temperature=1.0))
    decoder = engine.decoder()
    assert set(decoder.programs) == {Mode.MODEL, Mode.HOST}
    drive(engine, decoder, prompt, rounds=8, host=True)


def test_host_rounds_without_a_draft(llama):
    engine = Engine(make_profile(*llama, k=3, proposer=ProposerSpec(kind="ngram")))
    decoder = engine.decoder()
    assert set(decoder.programs) == {Mode.HOST} and decoder.round.draft is None
    rnd, clock = decoder.round, RoundClock(torch.device("cpu"))
    prompt = [4, 5, 6]
    rnd.reserve(64)
    rnd.start(prompt)
    committed = list(prompt)
    for drafts in ([], [1, 2, 3], [9], [8, 8]):
        rnd.set_host_drafts(drafts)
        decoder.programs[Mode.HOST].launch(clock)
        committed += [t for t in rnd.out[0].tolist() if t >= 0]
        assert int(rnd.num_drafts) == len(drafts)
        check_caches(engine, rnd, prompt, committed[len(prompt):], f"host drafts {drafts}")


def test_early_stopped_rounds_keep_both_caches_committed(llama):
    """draft_p_min stops drafting at an unsure step: the draft ran k steps anyway, and its cache
    rolls back to the committed sequence all the same."""
    engine = Engine(make_profile(*llama, k=5, proposer=ProposerSpec(draft_p_min=0.9)))
    counted = drive(engine, engine.decoder(), [3, 4, 5], rounds=8)
    assert min(counted) < 5  # some rounds stopped early


# ---------------------------------------------------------------- draws and device-built warp rows


def stub_round(spec: SamplingSpec, k: int, width: int = 60, vocab: int = 50, stop_ids=(3, 7), **shape):
    backend = RecordingBackend()
    fields = dict(k=k, width=width, vocab_size=vocab, drafter="draft", draft_pick="argmax" if spec.greedy else "sample",
                  rows=("penalties",) + ("min_tokens",) * (spec.min_tokens > 0)) | shape
    rnd = Round(RoundShape(**fields), spec, backend, StubRunner(width, 1), StubRunner(width, 2, favourite=4),
                list(stop_ids))
    return rnd, backend


def test_device_penalty_rows_and_masks_equal_the_reference():
    """Each draft step's penalty row and min_tokens mask equal the target's row at that position,
    and the target's rows equal core/sampling/warp.penalty_rows and the rule "padding columns always;
    stop ids while generated + i < min_tokens"."""
    k, width, vocab = 8, 60, 50
    spec = SamplingSpec(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2,
                        min_tokens=6, max_tokens=40)
    rnd, backend = stub_round(spec, k, width, vocab)
    programs = {mode: backend.program(rnd, mode) for mode in Mode}
    clock, gen = RoundClock(rnd.device), torch.Generator().manual_seed(0)
    rnd.start([1, 2, 9, 9])
    rnd.set_host_drafts([])  # a host round without drafts: one token
    rnd.draw(gen)
    programs[Mode.HOST].launch(clock)
    generated = int(rnd.generated)
    assert generated == 1
    counts, seen = rnd.rows.penalties.counts.clone(), rnd.rows.penalties.seen.clone()
    assert bool(seen[[1, 2, 9]].all()) and int(counts.sum()) == 1
    backend.calls.clear()
    rnd.set_budget(k)
    rnd.draw(gen)
    programs[Mode.MODEL].launch(clock)
    drafts = rnd.drafts.clone()
    assert len(set(drafts.tolist())) < k  # repeats: counts above 1 are exercised
    reference = sampling.penalty_rows(counts, seen, drafts)
    assert [rows for rows, _, _ in backend.calls] == [1] * k + [k + 1]
    *steps, (_, target, target_bad) = backend.calls
    assert torch.equal(target[0], reference.counts) and torch.equal(target[1], reference.seen)
    stops = torch.zeros(width, dtype=torch.bool)
    stops[[3, 7]] = True
    padding = torch.arange(width) >= vocab
    for i in range(k + 1):
        want = padding | (stops if generated + i < spec.min_tokens else torch.zeros_like(stops))
        assert torch.equal(target_bad[i], want), f"target row {i}"
    assert bool(target_bad[0, 3]) and not bool(target_bad[k, 3])  # both sides of min_tokens occur
    for i, (_, (step_counts, step_seen), step_bad) in enumerate(steps):
        assert torch.equal(step_counts[0], reference.counts[i]), f"draft step {i} counts"
        assert torch.equal(step_seen[0], reference.seen[i]), f"draft step {i} seen"
        assert torch.equal(step_bad.reshape(-1, width)[0], target_bad[i]), f"draft step {i} mask"


def test_draws_follow_the_documented_order():
    """A seed gives the same numbers as the allocating definitions in core/sampling/warp.py, in the order
    core/round/couplings.py documents: the Exp(1) rows (one per sampled draft step, then the target's row) in one
    draw, then the uniforms."""
    k, width = 3, 33
    rnd, _ = stub_round(SamplingSpec(temperature=1.0), k, width=width, vocab=width, stop_ids=())
    rnd.draw(torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(7)
    rows = sampling.exponentials((k + 1, width), gen, "cpu")
    uniforms = sampling.uniforms((k,), gen, "cpu")
    assert torch.equal(rnd.coupling.noise, rows) and torch.equal(rnd.coupling.uniform, uniforms)
    assert bool((rnd.coupling.noise > 0).all()) and bool((rnd.coupling.uniform > 0).all())
    greedy, _ = stub_round(SamplingSpec(), k, width=width, vocab=width, stop_ids=())
    gen = torch.Generator().manual_seed(7)
    state = gen.get_state()
    greedy.draw(gen)
    assert greedy.coupling.noise is None and torch.equal(gen.get_state(), state)  # greedy rounds draw nothing


# ---------------------------------------------------------------- draft sampling


@pytest.mark.parametrize(("mode", "settings", "expected"), [
    ("auto", dict(), (False, True)),  # greedy: the argmax
    ("auto", dict(temperature=0.8, top_p=0.95), (True, False)),  # top-p alone: temperature-only drafts
    ("auto", dict(temperature=1.0), (True, True)),  # nothing to cut
    ("auto", dict(temperature=0.8, top_k=50, top_p=0.9), (True, True)),
    ("auto", dict(temperature=0.8, top_p=0.9, min_p=0.05), (True, True)),
    ("sample", dict(temperature=0.8, top_p=0.95), (True, True)),
    ("temperature", dict(temperature=0.8, top_k=50), (True, False)),
    ("argmax", dict(temperature=0.8, top_p=0.95), (False, True)),
])
def test_draft_picking_follows_draft_sampling(mode, settings, expected):
    assert draft_picking(mode, SamplingSpec(**settings)) == expected


def test_temperature_drafts_skip_the_cut(llama):
    """speculation.draft_sampling = "temperature": q is the draft's softmax at the request's
    temperature without its top-p (positive where p is 0); "sample" keeps the request's cut."""
    widths = {}
    for mode in ("temperature", "sample"):
        profile = make_profile(*llama, k=3, temperature=0.8, top_p=0.3, seed=14, max_tokens=20,
                               speculation=dict(draft_sampling=mode))
        engine = Engine(profile)
        decoder = engine.decoder()
        for prompt in random_prompts(engine.pair.vocab_size, 3, seed=9):
            first = finish(decoder, prompt)
            assert finish(decoder, prompt).token_ids == first.token_ids  # seeded: reproducible
            widths.setdefault(mode, []).extend((decoder.round.coupling.q > 0).sum(dim=1).tolist())
    vocab = engine.pair.vocab_size
    assert min(widths["temperature"]) == vocab  # every id of the vocabulary is a candidate
    assert max(widths["sample"]) < vocab // 2  # top-p 0.3 of the request keeps few


@pytest.mark.parametrize("kind", ["draft", "ngram", "hybrid"])
def test_penalised_greedy_equals_target_only(llama, kind):
    """Penalty rows built on the device from counts give target-only's output for every proposer."""
    profile = make_profile(*llama, k=3, max_tokens=20, repetition_penalty=1.3, frequency_penalty=0.4,
                           proposer=ProposerSpec(kind=kind))
    engine = Engine(profile)
    drafted = 0
    for prompt in [[4, 5, 6], [4, 5, 6, 4, 5, 6, 4], [9]]:
        spec = finish(engine.decoder(), prompt)
        assert spec.token_ids == finish(engine.decoder(target_only(profile)), prompt).token_ids, prompt
        drafted += spec.stats.drafted
    assert drafted > 0


def test_counts_and_events_add_up(llama):
    engine = Engine(make_profile(*llama, k=3, max_tokens=30))
    events = list(engine.decoder().run([1, 2, 3]))
    result, rounds = events[-1], events[:-1]
    stats = result.stats
    assert stats.accepted + stats.recovered + stats.bonus == stats.emitted == len(result.token_ids) == 30
    for event in rounds:
        assert len(event.token_ids) == event.num_accepted + 1
        assert event.drafted_ids[: event.num_accepted] == event.token_ids[: event.num_accepted]
        assert set(event.timings) == {"draft", "verify", "sample", "other"}
        assert all(value >= 0.0 for value in event.timings.values())


def test_a_round_is_shared_by_decoders_of_the_same_shape(llama):
    """Rounds (buffers and programs) are built once per shape and reused: a second decoder with the
    same settings runs on the same Round and gives the same output."""
    engine = Engine(make_profile(*llama, k=3, max_tokens=12))
    a, b = engine.decoder(), engine.decoder()
    assert a.round is b.round
    assert engine.decoder(replace(engine.profile, speculation=SpeculationSpec(k=4))).round is not a.round
    assert finish(a, [5, 6]).token_ids == finish(b, [5, 6]).token_ids
