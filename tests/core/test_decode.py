"""The decode loop end to end through the real loader, with tiny random-weight models.

Greedy identity and the χ² lossless tests run on every backend that can run here (BACKENDS: the
torch backend on the CPU, the CUDA backend where a GPU exists); the loop's own behaviour (stops,
counts, logprobs, text) is backend-independent and runs on the torch backend.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from decode_helpers import BACKENDS, _chi2_pvalue, draft_follows, finish, make_profile, next_token_probs, random_prompts
from specgen.core.events import Fate
from specgen.core.engine import Engine, target_only
from specgen.core.settings import SpeculationSpec
from tiny_models import build_pair


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return build_pair(root, family=request.param, noisy=0.1)


@pytest.fixture(scope="module")
def noisy_pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("noisy"), noisy=0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_speculative_equals_greedy_target_only(pair, backend):
    """k in 1, 3, 8 on Llama and Qwen2; after every run both caches follow the committed sequence."""
    engine = Engine(make_profile(*pair, backend=backend))
    assert engine.backend.name == backend
    vocab = engine.pair.vocab_size
    prompts = random_prompts(vocab, 20)
    assert any(len(p) == 1 for p in prompts)  # the one-token start is covered
    reference = [finish(engine.decoder(target_only(engine.profile)), p).token_ids for p in prompts]
    for k in (1, 3, 8):
        profile = replace(engine.profile, speculation=SpeculationSpec(k=k))
        for prompt, expected in zip(prompts, reference):
            decoder = engine.decoder(profile)
            got = finish(decoder, prompt).token_ids
            assert got == expected, f"k={k} prompt={prompt}"
            draft_follows(engine, decoder, prompt, got)


GUMBEL_WARPS = {
    "t0.8-top_p": dict(temperature=0.8, top_p=0.9),
    "t1.2-top_k-min_p": dict(temperature=1.2, top_k=20, min_p=0.02),
    "penalties-min_tokens": dict(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.3,
                                 frequency_penalty=0.2, min_tokens=10, ignore_eos=False),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("warp", list(GUMBEL_WARPS))
def test_gumbel_sampled_text_is_target_only_text(noisy_pair, backend, warp):
    """Gumbel coupling: with the same seed, every k, proposer, adaptive k and draft_p_min gives the
    tokens target-only decoding gives (and rejection coupling does not: the test can fail)."""
    profile = make_profile(*noisy_pair, k=4, max_tokens=32, backend=backend, coupling="gumbel",
                           **GUMBEL_WARPS[warp])
    engine = Engine(profile)
    settings = [(k, kind, {}) for k in (1, 2, 4, 8) for kind in ("draft", "ngram", "hybrid")]
    settings += [(4, "draft", dict(adaptive_k=True)), (6, "hybrid", dict(draft_p_min=0.3))]
    accepted, differs = 0, 0
    for seed, prompt in enumerate(random_prompts(engine.pair.vocab_size, 3, seed=7)):
        seeded = replace(profile, sampling=replace(profile.sampling, seed=seed))
        expected = finish(engine.decoder(target_only(seeded)), prompt).token_ids
        for k, kind, proposer in settings:
            run = replace(seeded, speculation=SpeculationSpec(k=k),
                          proposer=replace(seeded.proposer, kind=kind, **proposer))
            result = finish(engine.decoder(run), prompt)
            assert result.token_ids == expected, (seed, k, kind, proposer)
            accepted += result.stats.accepted
        rejection = replace(seeded, sampling=replace(seeded.sampling, coupling="rejection"))
        differs += finish(engine.decoder(rejection), prompt).token_ids != expected
    assert accepted > 0 and differs > 0


def test_gumbel_noise_follows_positions_not_rounds(noisy_pair):
    """The noise is a function of (seed, position, token): a run restarted from its own prompt plus
    its first m tokens continues with the same tokens (the rounds now fall elsewhere), and a
    longer max_tokens only extends the text."""
    profile = make_profile(*noisy_pair, k=4, max_tokens=30, coupling="gumbel", temperature=1.0, seed=3)
    engine = Engine(profile)
    prompt = [5, 9, 2]
    whole = finish(engine.decoder(), prompt).token_ids
    for m in (1, 7, 13):
        restarted = replace(profile, sampling=replace(profile.sampling, max_tokens=30 - m))
        assert finish(engine.decoder(restarted), prompt + whole[:m]).token_ids == whole[m:], m
    shorter = replace(profile, sampling=replace(profile.sampling, max_tokens=11))
    assert finish(engine.decoder(shorter), prompt).token_ids == whole[:11]


@pytest.mark.parametrize("backend", BACKENDS)
def test_noisy_draft_greedy_equal_and_partly_accepted(noisy_pair, backend):
    engine = Engine(make_profile(*noisy_pair, k=4, max_tokens=40, backend=backend))
    rates = []
    for prompt in random_prompts(engine.pair.vocab_size, 10, seed=1):
        spec = finish(engine.decoder(), prompt)
        base = finish(engine.decoder(target_only(engine.profile)), prompt)
        assert spec.token_ids == base.token_ids
        rates.append(spec.stats.acceptance_rate)
    assert 0.05 < sum(rates) / len(rates) < 0.99  # the noisy draft is a real, imperfect draft


def test_identical_draft_accepts_everything(tmp_path):
    target, draft = build_pair(tmp_path, same=True)
    engine = Engine(make_profile(target, draft, k=4, max_tokens=31))
    result = finish(engine.decoder(), [5, 6, 7])
    stats = result.stats
    assert stats.acceptance_rate == 1.0
    assert stats.drafted == stats.accepted > 0
    assert len(result.token_ids) == 31
    # Rounds of 4 accepted + 1 bonus; the last round is cut by max_tokens (k shrinks to fit).
    assert stats.mean_accepted_length > 4.0
    assert result.fates[:5] == [Fate.ACCEPTED] * 4 + [Fate.BONUS]


def test_counts_add_up(noisy_pair):
    engine = Engine(make_profile(*noisy_pair, k=3, max_tokens=30))
    events = list(engine.decoder().run([1, 2, 3]))
    result = events[-1]
    rounds = events[:-1]
    stats = result.stats
    assert stats.accepted + stats.recovered + stats.bonus == stats.emitted == len(result.token_ids) == 30
    assert stats.rounds == len(rounds)
    assert sum(stats.drafted_at) == stats.drafted and sum(stats.accepted_at) == stats.accepted
    for event in rounds:
        assert len(event.token_ids) == event.num_accepted + 1
        assert event.drafted_ids[: event.num_accepted] == event.token_ids[: event.num_accepted]
    assert 1.0 <= stats.mean_accepted_length <= 4.0


def test_tokens_count_when_their_round_reaches_the_host(noisy_pair, monkeypatch):
    """Each round's tokens are stamped when its results are read, not when its event is yielded: on
    the CPU the next round's launch runs it to the end in between, which used to put two rounds into
    the time to first token. A clock that moves one unit per launch makes the stamps exact."""
    from types import SimpleNamespace

    from specgen.core import decode
    from specgen.core.stats import decode_rate

    clock = SimpleNamespace(now=0.0)
    launch = decode.Decoder._launch

    def timed_launch(self, *args):
        clock.now += 1.0  # one unit per round
        return launch(self, *args)

    monkeypatch.setattr(decode, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(decode.Decoder, "_launch", timed_launch)
    engine = Engine(make_profile(*noisy_pair, k=3, max_tokens=30))
    events = list(engine.decoder().run([1, 2, 3]))
    stats = events[-1].stats
    assert stats.rounds >= 3
    assert stats.first_token_seconds == 1.0 and stats.first_round_tokens == len(events[0].token_ids)
    assert stats.generation_seconds == stats.rounds
    assert stats.decode_seconds == stats.rounds - 1
    assert stats.decode_tokens == 30 - len(events[0].token_ids)
    assert stats.decode_tokens_per_second == decode_rate(30, len(events[0].token_ids), 1.0, stats.rounds)
    assert stats.decode_tokens_per_second == stats.decode_tokens / (stats.rounds - 1)
    assert stats.tokens_per_second == 30 / stats.rounds


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_tokens_exact_for_every_k(noisy_pair, backend):
    engine = Engine(make_profile(*noisy_pair, backend=backend))
    for k in (1, 2, 5, 8):
        for max_tokens in (1, 2, 7):
            profile = replace(engine.profile, speculation=SpeculationSpec(k=k),
                              sampling=replace(engine.profile.sampling, max_tokens=max_tokens))
            decoder = engine.decoder(profile)
            result = finish(decoder, [3, 4])
            assert len(result.token_ids) == max_tokens and result.reason == "length"
            assert result.stats.emitted == max_tokens
            draft_follows(engine, decoder, [3, 4], result.token_ids)


def test_stop_token_ids_and_min_tokens(noisy_pair):
    engine = Engine(make_profile(*noisy_pair, max_tokens=40))
    free = finish(engine.decoder(), [9, 10, 11]).token_ids
    stop_id = free[5]
    first = free.index(stop_id)
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, stop_token_ids=(stop_id,)))
    stopped = finish(engine.decoder(profile), [9, 10, 11])
    assert stopped.reason == "stop_token"
    assert stopped.token_ids == free[: first + 1]
    assert stopped.stats.emitted == len(stopped.token_ids) and stopped.stats.drafted == sum(stopped.stats.drafted_at)
    # min_tokens masks the stop id until enough tokens exist, so it cannot end the output early.
    profile = replace(profile, sampling=replace(profile.sampling, min_tokens=first + 3))
    later = finish(engine.decoder(profile), [9, 10, 11])
    assert len(later.token_ids) >= first + 3
    assert stop_id not in later.token_ids[: first + 2]


def test_eos_stops_unless_ignored(noisy_pair):
    engine = Engine(make_profile(*noisy_pair, max_tokens=60))
    eos = next(iter(engine.eos_ids))
    # Find a prompt whose greedy continuation reaches EOS when EOS is not ignored.
    for prompt in random_prompts(engine.pair.vocab_size, 40, seed=3):
        free = finish(engine.decoder(), prompt).token_ids
        if eos in free:
            break
    else:
        pytest.skip("no prompt reached EOS with this random model")
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, ignore_eos=False))
    stopped = finish(engine.decoder(profile), prompt)
    assert stopped.reason == "eos"
    assert stopped.token_ids == free[: free.index(eos) + 1]


def test_stop_strings_are_cut_from_the_text(noisy_pair):
    engine = Engine(make_profile(*noisy_pair, max_tokens=40))
    free = finish(engine.decoder(), [20, 21]).text
    assert len(free) > 12
    stop = free[6:9]
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, stop=(stop,)))
    events = list(engine.decoder(profile).run([20, 21]))
    result = events[-1]
    assert result.reason == "stop"
    assert result.text == free[: free.index(stop)]
    streamed = "".join(e.text for e in events[:-1]) + result.tail
    assert streamed == result.text
    assert_ids_end_where_the_text_ends(engine, result, free_ids=finish(engine.decoder(), [20, 21]).token_ids)


def assert_ids_end_where_the_text_ends(engine, result, free_ids):
    """token_ids, fates, pieces and counts of a stop-string run: the tokens whose text starts before
    the cut, nothing after it, the first ids of the free run."""
    n = len(result.token_ids)
    assert n == len(result.fates) == len(result.pieces) and n > 0
    assert result.token_ids == free_ids[:n]
    text = "".join(result.pieces)
    assert text.startswith(result.text)
    assert len("".join(result.pieces[:-1])) < len(result.text) or result.text == "", "a token after the cut was kept"
    assert len(text) >= len(result.text), "a token the text needs was cut"
    assert result.stats.emitted == n, f"stats count {result.stats.emitted} emitted tokens, token_ids has {n}"
    assert result.stats.accepted + result.stats.recovered + result.stats.bonus == n


def test_stop_string_across_rounds_cuts_token_ids(noisy_pair):
    """A stop string that starts in one round's text and ends in the next one's: Finished.token_ids
    (and fates, pieces, stats) end with the last token whose text starts before the cut, even when
    that token belongs to the earlier round."""
    engine = Engine(make_profile(*noisy_pair, k=1, max_tokens=40))
    prompt = [20, 21]
    events = list(engine.decoder().run(prompt))
    free, rounds = events[-1], events[:-1]
    cases = 0
    offset = 0
    for event, following in zip(rounds, rounds[1:]):
        offset += len("".join(event.pieces))
        last, first = event.pieces[-1] if event.pieces else "", "".join(following.pieces)[:1]
        if not last or not first:
            continue
        stop = last[-1] + first  # from the last character of this round to the first of the next
        begin = free.text.find(stop)
        if begin < 0 or begin != offset - 1:
            continue  # the same characters occur earlier: not this boundary
        profile = replace(engine.profile, sampling=replace(engine.profile.sampling, stop=(stop,)))
        result = finish(engine.decoder(profile), prompt)
        assert result.reason == "stop" and result.text == free.text[:begin]
        assert_ids_end_where_the_text_ends(engine, result, free.token_ids)
        cases += 1
        if cases == 3:
            break
    assert cases > 0, "no round boundary to put a stop string across"


def test_seeded_sampling_is_reproducible(noisy_pair):
    engine = Engine(make_profile(*noisy_pair, temperature=1.0, seed=7, max_tokens=30))
    a = finish(engine.decoder(), [1, 2]).token_ids
    b = finish(engine.decoder(), [1, 2]).token_ids
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, seed=8))
    c = finish(engine.decoder(profile), [1, 2]).token_ids
    assert a == b
    assert a != c


def test_logprobs_match_target_only(noisy_pair):
    engine = Engine(make_profile(*noisy_pair, max_tokens=12, logprobs=3))
    spec = finish(engine.decoder(), [4, 5])
    base = finish(engine.decoder(target_only(engine.profile)), [4, 5])
    assert spec.token_ids == base.token_ids
    assert len(spec.logprobs) == 12
    for a, b in zip(spec.logprobs, base.logprobs):
        assert a["token_id"] == b["token_id"]
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)
        assert [t["token_id"] for t in a["top"]] == [t["token_id"] for t in b["top"]]
        assert a["logprob"] <= 0.0


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_tokens_follow_the_target_distribution(noisy_pair, backend):
    """χ² test of the first two emitted tokens (same round, k = 3) against the target's exact p.

    Bins with expected count < 5 are pooled. α = 1e-4 per χ² test (2 tests): the false-failure
    probability of this test is below 2e-4.
    """
    from scipy.stats import chisquare

    runs = 1500
    engine = Engine(make_profile(*noisy_pair, k=3, temperature=1.0, max_tokens=4, backend=backend))
    prompt = [7, 8, 9]
    model = engine.pair.target
    p0 = next_token_probs(model, prompt)
    firsts, seconds = [], []
    for seed in range(runs):
        profile = replace(engine.profile, sampling=replace(engine.profile.sampling, seed=seed))
        ids = finish(engine.decoder(profile), prompt).token_ids
        firsts.append(ids[0])
        seconds.append(ids[:2])
    assert _chi2_pvalue(firsts, p0, chisquare) > 1e-4
    common = max(set(firsts), key=firsts.count)
    p1 = next_token_probs(model, prompt + [common])
    follow = [b for a, b in seconds if a == common]
    assert len(follow) > 100
    assert _chi2_pvalue(follow, p1, chisquare) > 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_unrelated_draft_still_lossless(tmp_path, backend):
    """A draft that is a different random model: nearly everything is recovered, output unchanged."""
    target, draft = build_pair(tmp_path)
    engine = Engine(make_profile(target, draft, k=3, max_tokens=16, backend=backend))
    for prompt in random_prompts(engine.pair.vocab_size, 5, seed=9):
        spec = finish(engine.decoder(), prompt)
        assert spec.token_ids == finish(engine.decoder(target_only(engine.profile)), prompt).token_ids


def test_padded_draft_vocab_is_accepted(tmp_path):
    """A draft with extra (padding) output rows works; padding ids are never produced."""
    target, draft = build_pair(tmp_path, draft_rows=400)
    engine = Engine(make_profile(target, draft, k=3, max_tokens=16, temperature=1.0, seed=1))
    result = finish(engine.decoder(), [1, 2, 3])
    assert all(t < engine.pair.vocab_size for t in result.token_ids)
    assert len(result.token_ids) == 16


def test_chat_template_wraps_the_prompt(noisy_pair):
    from specgen.core.errors import UsageError

    engine = Engine(make_profile(*noisy_pair))
    with pytest.raises(UsageError, match="no chat template"):
        engine.encode("hi", chat=True)
    engine.tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    ids = engine.encode("hi", chat=True)
    assert engine.tokenizer.decode(ids) == "<user>hi<assistant>"
    assert engine.encode("hi") != ids


PIPELINE_CASES = {
    "greedy": dict(),
    "rejection": dict(temperature=0.8, top_p=0.9, seed=7),
    "gumbel": dict(temperature=1.0, top_k=20, seed=3, coupling="gumbel"),
    "penalties-min_tokens": dict(temperature=1.0, repetition_penalty=1.3, frequency_penalty=0.2, min_tokens=9,
                                 ignore_eos=False, seed=11),
}


def _run(engine, profile, prompt) -> tuple:
    decoder = engine.decoder(profile)
    events = list(decoder.run(prompt))
    *rounds, done = events
    if done.reason == "length":  # no round was left queued behind the run's last
        draft_follows(engine, decoder, prompt, done.token_ids)
    per_round = [(e.token_ids, e.fates, e.drafted_ids, e.num_accepted, e.k_used, e.early_stop, e.text,
                  e.target_p, e.draft_q)
                 for e in rounds]
    stats = done.stats
    return per_round, (done.token_ids, done.reason, done.text, done.fates, stats.emitted, stats.drafted,
                       stats.accepted, stats.rounds, stats.drafted_at, stats.accepted_at)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(PIPELINE_CASES))
def test_two_rounds_in_flight_give_the_same_run(noisy_pair, backend, case):
    """pipeline = "on" (round n + 1 queued before round n is read, its drafts capped at max_tokens on
    the device) against "off": the same rounds, tokens, fates, drafts, budgets and statistics, for
    every k and max_tokens near a round's size, with stop ids and a stop string ending runs early;
    after a run that ended on length, both caches follow the committed sequence."""
    engine = Engine(make_profile(*noisy_pair, backend=backend, **PIPELINE_CASES[case]))
    free = finish(engine.decoder(), [5, 6, 7]).token_ids
    endings = [{}, {"stop_token_ids": (free[6],)}, {"stop": (engine.tokenizer.decode(free[8:10]),)}]
    for k in (1, 4):
        for max_tokens in (1, 2, 6, 24):
            for ending in endings:
                runs = []
                for pipeline in ("on", "off"):
                    profile = replace(engine.profile, speculation=SpeculationSpec(k=k, pipeline=pipeline),
                                      sampling=replace(engine.profile.sampling, max_tokens=max_tokens, **ending))
                    assert engine.decoder(profile).pipelined == (pipeline == "on")
                    runs.append(_run(engine, profile, [5, 6, 7]))
                assert runs[0] == runs[1], f"k={k} max_tokens={max_tokens} {ending}"


def test_one_round_in_flight_where_the_host_steers(noisy_pair):
    """The n-gram and hybrid proposers, adaptive k and logprobs read a round before the next is
    chosen: one round in flight whatever the setting; auto keeps one on the CPU's eager rounds."""
    from specgen.core.settings import ProposerSpec

    engine = Engine(make_profile(*noisy_pair))
    on = replace(engine.profile, speculation=SpeculationSpec(pipeline="on"))
    assert engine.decoder(on).pipelined
    assert not engine.decoder().pipelined  # auto, eager rounds
    assert not engine.decoder(replace(on, sampling=replace(on.sampling, logprobs=2))).pipelined
    assert not engine.decoder(replace(on, proposer=ProposerSpec(adaptive_k=True))).pipelined
    assert not engine.decoder(replace(on, proposer=ProposerSpec(kind="hybrid"))).pipelined
