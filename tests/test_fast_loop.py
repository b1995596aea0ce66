"""The GPU round's logic on CPU: static slot cache, device-side picks, one fetch per round.

gpu/loop.py and gpu/runner.py run here without graphs (use_graphs=False, as for a model that
cannot be captured), so CI checks everything but the capture itself; tests/test_gpu.py adds that.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specgen.core.engine import Engine, target_only
from specgen.core.runner import EagerRunner
from specgen.core.settings import Profile, SpeculationSpec
from specgen.gpu import loop
from specgen.gpu.runner import GraphRunner
from test_decode import finish, random_prompts
from test_decode import make_profile as _make_profile


def make_profile(target, draft, k=3, **sampling) -> Profile:
    """test_decode's profile pinned to float32 on the CPU: these tests compare the fast path's round
    logic with the core loop token for token, which bf16 on a GPU would not give (docs/benchmarks.md)."""
    profile = _make_profile(target, draft, k=k, **sampling)
    return replace(profile, target=replace(profile.target, device="cpu", dtype="float32"),
                   draft=replace(profile.draft, device="cpu", dtype="float32"))
from tiny_models import build_pair


def fast_engine(profile: Profile, capacity: int = 128) -> Engine:
    """An Engine whose runners, proposer and round are the fast path's, run eagerly on CPU."""
    engine = Engine(profile)
    target = GraphRunner(engine.pair.target, engine.width, capacity, use_graphs=False, name="target")
    draft = GraphRunner(engine.pair.draft, engine.width, capacity, use_graphs=False, name="draft")
    engine.fast_path = loop.FastPath(target, draft)
    engine.target_runner, engine.draft_runner = target, draft
    return engine


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp(request.param), family=request.param, noisy=0.1)


def test_slot_cache_rollback_matches_a_fresh_forward(pair):
    engine = Engine(make_profile(*pair))
    runner = GraphRunner(engine.pair.target, engine.width, 64, use_graphs=False)
    prompt = torch.tensor([5, 6, 7, 8])
    runner.reset()
    runner.forward(prompt[:-1], want_logits=False)
    runner.forward(torch.tensor([8, 40, 41, 42, 43]))  # a round of 4 drafts
    runner.truncate(3 + 2)  # keep `8, 40`: two of them were accepted
    got = runner.forward(torch.tensor([50, 51])).clone()
    fresh = EagerRunner(engine.pair.target, engine.width)
    fresh.reset()
    want = fresh.forward(torch.tensor([5, 6, 7, 8, 40, 50, 51]))[-2:]
    assert float((got - want).norm() / want.norm()) < 1e-5  # float32 rounding only
    assert runner.length == 7


def test_greedy_fast_loop_equals_target_only(pair):
    engine = fast_engine(make_profile(*pair))
    reference_engine = Engine(engine.profile)
    prompts = random_prompts(engine.pair.vocab_size, 12)
    reference = [finish(reference_engine.decoder(target_only(engine.profile)), p).token_ids for p in prompts]
    for k in (1, 3, 8):
        profile = replace(engine.profile, speculation=SpeculationSpec(k=k))
        for prompt, expected in zip(prompts, reference):
            assert finish(engine.decoder(profile), prompt).token_ids == expected, f"k={k} prompt={prompt}"
        for prompt, expected in zip(prompts[:3], reference):
            assert finish(engine.decoder(target_only(profile)), prompt).token_ids == expected


def test_seeded_sampling_matches_the_core_loop(pair):
    """Same draws in the same order: the fast round reproduces the core round token for token."""
    profile = make_profile(*pair, k=4, temperature=0.8, top_p=0.95, seed=3, max_tokens=30)
    fast, core = fast_engine(profile), Engine(profile)
    for prompt in random_prompts(fast.pair.vocab_size, 4, seed=5):
        a, b = finish(fast.decoder(), prompt), finish(core.decoder(), prompt)
        assert a.token_ids == b.token_ids
        assert a.stats.accepted == b.stats.accepted and a.stats.rounds == b.stats.rounds


def test_counts_and_events_add_up(pair):
    engine = fast_engine(make_profile(*pair, k=3, max_tokens=30))
    events = list(engine.decoder().run([1, 2, 3]))
    result, rounds = events[-1], events[:-1]
    stats = result.stats
    assert stats.accepted + stats.recovered + stats.bonus == stats.emitted == len(result.token_ids) == 30
    for event in rounds:
        assert len(event.token_ids) == event.num_accepted + 1
        assert event.drafted_ids[: event.num_accepted] == event.token_ids[: event.num_accepted]
        assert set(event.timings) == {"draft", "verify", "sample", "other"}


def test_max_tokens_and_stop_tokens(pair):
    engine = fast_engine(make_profile(*pair, max_tokens=40))
    for k in (1, 5):
        for max_tokens in (1, 2, 7):
            profile = replace(engine.profile, speculation=SpeculationSpec(k=k),
                              sampling=replace(engine.profile.sampling, max_tokens=max_tokens))
            result = finish(engine.decoder(profile), [3, 4])
            assert len(result.token_ids) == max_tokens and result.reason == "length"
    free = finish(engine.decoder(), [9, 10, 11]).token_ids
    stop_id = free[5]
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, stop_token_ids=(stop_id,)))
    stopped = finish(engine.decoder(profile), [9, 10, 11])
    assert stopped.reason == "stop_token"
    assert stopped.token_ids == free[: free.index(stop_id) + 1]
    assert stopped.stats.drafted == sum(stopped.stats.drafted_at)


def test_long_prompt_grows_the_cache(pair):
    engine = fast_engine(make_profile(*pair, max_tokens=8), capacity=32)
    prompt = random_prompts(engine.pair.vocab_size, 1, seed=2)[0] * 12
    expected = finish(Engine(engine.profile).decoder(target_only(engine.profile)), prompt).token_ids
    assert finish(engine.decoder(), prompt).token_ids == expected
    assert engine.target_runner.capacity >= len(prompt) + 8


def spy_fused(monkeypatch) -> dict:
    """Counts fused rounds (gpu/fused.py) as they are launched."""
    from specgen.gpu import fused

    counts = {"fused": 0}
    original = fused.FusedRound.launch

    def launch(self, *args, **kwargs):
        counts["fused"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(fused.FusedRound, "launch", launch)
    return counts


@pytest.mark.parametrize("settings", [
    dict(),  # greedy: every round but the last ones is fused
    dict(temperature=0.8, top_p=0.95, seed=11),  # sampled draft (temperature only) and random verification
    dict(temperature=0.8, top_k=20, top_p=0.9, seed=13),  # sampled draft with the request's cut
    dict(temperature=0.7, seed=12, min_tokens=9),  # per-phase rounds first (min_tokens mask), then fused
])
def test_fused_rounds_match_the_core_loop(pair, monkeypatch, settings):
    """The one-program round gives the core loop's tokens and counts, hand-overs included."""
    counts = spy_fused(monkeypatch)
    profile = make_profile(*pair, k=3, max_tokens=37, **settings)
    fast, core = fast_engine(profile), Engine(profile)
    for prompt in random_prompts(fast.pair.vocab_size, 4, seed=8) + [[7]]:  # [7]: a 1-token prompt
        a, b = finish(fast.decoder(), prompt), finish(core.decoder(), prompt)
        assert a.token_ids == b.token_ids, f"prompt={prompt}"
        assert (a.stats.rounds, a.stats.accepted, a.stats.drafted) == (b.stats.rounds, b.stats.accepted, b.stats.drafted)
        a, b = finish(fast.decoder(target_only(profile)), prompt), finish(core.decoder(target_only(profile)), prompt)
        assert a.token_ids == b.token_ids
    assert counts["fused"] > 0.5 * 10 * 37 / 4  # most rounds of the 10 runs were fused


def test_temperature_drafts_skip_the_cut_on_every_path(pair, monkeypatch):
    """speculation.draft_sampling = "temperature": q is the draft's softmax at the request's
    temperature, without its top-p (so q is positive where p is 0); the fast path (fused rounds
    included) and the core loop still agree token for token."""
    from specgen.core.proposers import DraftModelProposer

    counts = spy_fused(monkeypatch)
    widths = {True: [], False: []}  # cut -> ids with q > 0, per drafted row
    original = DraftModelProposer.propose

    def propose(self, *args, **kwargs):
        proposal = original(self, *args, **kwargs)
        if proposal.probs is not None:
            widths[self.cut] += (proposal.probs > 0).sum(dim=1).tolist()
        return proposal

    monkeypatch.setattr(DraftModelProposer, "propose", propose)
    profile = make_profile(*pair, k=3, temperature=0.8, top_p=0.3, seed=14, max_tokens=37)
    cut = replace(profile, speculation=replace(profile.speculation, draft_sampling="sample"))
    uncut = replace(profile, speculation=replace(profile.speculation, draft_sampling="temperature"))
    fast, core = fast_engine(uncut), Engine(uncut)
    for prompt in random_prompts(fast.pair.vocab_size, 3, seed=9):
        a, b = finish(fast.decoder(), prompt), finish(core.decoder(), prompt)
        assert a.token_ids == b.token_ids, f"prompt={prompt}"
        assert (a.stats.rounds, a.stats.accepted) == (b.stats.rounds, b.stats.accepted)
        finish(Engine(cut).decoder(), prompt)
    assert counts["fused"] > 0
    assert widths[False] and widths[True]
    assert min(widths[False]) == fast.pair.vocab_size  # every id of the vocabulary is a candidate
    assert max(widths[True]) < fast.pair.vocab_size // 2  # top-p 0.3 of the request keeps few


@pytest.mark.parametrize(("mode", "sampling", "expected"), [
    ("auto", dict(), (False, True)),  # greedy: the argmax
    ("auto", dict(temperature=0.8, top_p=0.95), (True, False)),  # top-p alone: temperature-only drafts
    ("auto", dict(temperature=1.0), (True, True)),  # nothing to cut
    ("auto", dict(temperature=0.8, top_k=50, top_p=0.9), (True, True)),
    ("auto", dict(temperature=0.8, top_p=0.9, min_p=0.05), (True, True)),
    ("sample", dict(temperature=0.8, top_p=0.95), (True, True)),
    ("temperature", dict(temperature=0.8, top_k=50), (True, False)),
    ("argmax", dict(temperature=0.8, top_p=0.95), (False, True)),
])
def test_draft_picking_follows_draft_sampling(mode, sampling, expected):
    from specgen.core.engine import draft_picking
    from specgen.core.settings import SamplingSpec

    assert draft_picking(mode, SamplingSpec(**sampling)) == expected


def test_penalties_and_ngram_stay_phase_by_phase(pair, monkeypatch):
    counts = spy_fused(monkeypatch)
    profile = make_profile(*pair, k=3, max_tokens=20, repetition_penalty=1.3)
    fast, core = fast_engine(profile), Engine(profile)
    prompt = [4, 5, 6]
    assert finish(fast.decoder(), prompt).token_ids == finish(core.decoder(), prompt).token_ids
    ngram = finish(fast.decoder(proposer_kind="ngram"), prompt).token_ids
    assert ngram == finish(core.decoder(proposer_kind="ngram"), prompt).token_ids
    assert counts["fused"] == 0


def test_fused_round_starts_from_a_rolled_back_state(pair, monkeypatch):
    """At the start of every fused round: the target cache holds the committed sequence minus its
    last token and the draft cache minus two, on the device and in the host counters; `pending`
    and feed[0] are the committed tail. (The previous round's rollback was done by the program.)"""
    from specgen.gpu import fused

    engine = fast_engine(make_profile(*pair, k=4, max_tokens=30))
    decoder = engine.decoder()
    seen = []
    original = fused.FusedRound.launch

    def launch(self, *args, **kwargs):
        committed = self.target.length + 1
        seen.append((int(self.target.position), self.target.length, int(self.draft.position), self.draft.length,
                     committed, self.pending.tolist(), int(self.feed[0]), list(decoder.tail)))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(fused.FusedRound, "launch", launch)
    result = finish(decoder, [2, 3, 4, 5])
    assert len(seen) >= 3
    sequence = [2, 3, 4, 5] + result.token_ids
    for target_pos, target_len, draft_pos, draft_len, committed, pending, first, tail in seen:
        assert target_pos == target_len == committed - 1
        assert draft_pos == draft_len == committed - 2
        assert pending == tail == sequence[committed - 2 : committed]
        assert first == tail[-1]
