"""Adaptive speculation for the draft-model proposer: early stops within a round, adaptive k between rounds.

Rounds are pipelined one deep, so the caches are checked at the end of runs (draft_follows), where
no round is in flight; tests/core/round/test_round.py checks them after every early-stopped round.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from decode_helpers import BACKENDS, _chi2_pvalue, draft_follows, finish, make_profile, next_token_probs, random_prompts
from specgen.core.events import Finished
from specgen.core.engine import Engine, target_only
from specgen.core.drafters.proposers import AdaptiveK
from specgen.core.settings import Profile, ProposerSpec, SpeculationSpec
from tiny_models import build_pair


def adaptive_profile(target, draft, k=4, p_min=0.0, adaptive_k=False, backend="torch", **sampling) -> Profile:
    sampling.setdefault("max_tokens", 30)
    return make_profile(target, draft, k=k, backend=backend, proposer=ProposerSpec(draft_p_min=p_min, adaptive_k=adaptive_k),
                        **sampling)


@pytest.fixture(scope="module")
def noisy_pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("adaptive"), noisy=0.1)


def rounds_of(engine, decoder, prompt):
    """Events of one run; at its end (no round in flight) both caches hold the committed sequence."""
    events = list(decoder.run(prompt))
    result = events[-1]
    assert isinstance(result, Finished)
    draft_follows(engine, decoder, prompt, result.token_ids)
    return events[:-1], result


def test_adaptive_k_budget():
    control = AdaptiveK()
    assert control.budget(6) == 6  # no round yet: the full k
    for _ in range(6):
        control.update(0)
    assert control.budget(6) == 1  # nothing accepted: one draft per round
    budgets = []
    for _ in range(12):
        k = control.budget(6)
        budgets.append(k)
        control.update(k)  # every draft accepted
    assert budgets == sorted(budgets) and budgets[-1] == 6  # grows back, never past the k asked for
    assert control.budget(2) == 2 and control.budget(0) == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p_min,adaptive_k", [(0.5, False), (0.0, True), (0.6, True)])
def test_greedy_output_unchanged(noisy_pair, p_min, adaptive_k, backend):
    engine = Engine(adaptive_profile(*noisy_pair, p_min=p_min, adaptive_k=adaptive_k, backend=backend))
    for k in (2, 5):
        profile = replace(engine.profile, speculation=SpeculationSpec(k=k))
        for prompt in random_prompts(engine.pair.vocab_size, 6, seed=k):
            rounds, result = rounds_of(engine, engine.decoder(profile), prompt)
            assert result.token_ids == finish(engine.decoder(target_only(profile)), prompt).token_ids
            left = profile.sampling.max_tokens
            for event in rounds:
                assert event.num_drafted <= event.k_used <= min(k, left - 1)
                assert event.k_used >= 1 or left == 1  # only the last token can leave no room to draft
                left -= len(event.token_ids)


def test_early_stops_are_counted(noisy_pair):
    engine = Engine(adaptive_profile(*noisy_pair, k=6, p_min=0.9, max_tokens=40))
    rounds, result = rounds_of(engine, engine.decoder(), [3, 4, 5])
    stops = [e for e in rounds if e.early_stop]
    assert stops and len(stops) < len(rounds)  # the draft is unsure sometimes, not always
    assert result.stats.early_stops == len(stops)
    assert all(e.num_drafted < e.k_used for e in stops)
    assert all(e.num_drafted == e.k_used for e in rounds if not e.early_stop)
    assert result.stats.mean_k == pytest.approx(sum(e.k_used for e in rounds) / len(rounds))


def test_adaptive_k_moves_within_bounds(noisy_pair):
    engine = Engine(adaptive_profile(*noisy_pair, k=8, adaptive_k=True, max_tokens=60))
    used = []
    for prompt in random_prompts(engine.pair.vocab_size, 4, seed=5):
        rounds, _ = rounds_of(engine, engine.decoder(), prompt)
        used += [e.k_used for e in rounds[:-1]]  # the last round is cut to fit max_tokens
    assert min(used) >= 1 and max(used) <= 8
    assert min(used) < 8  # a ~50% draft does not keep the full k


def test_identical_draft_accepts_everything_with_early_stops(tmp_path):
    """After an early stop the draft cache holds one more token than usual; if it were rolled
    back wrongly, a draft identical to the target would start to disagree with it."""
    target, draft = build_pair(tmp_path, same=True)
    engine = Engine(adaptive_profile(target, draft, k=5, p_min=0.95, adaptive_k=True, max_tokens=40))
    for prompt in random_prompts(engine.pair.vocab_size, 4, seed=2):
        rounds, result = rounds_of(engine, engine.decoder(), prompt)
        assert result.stats.accepted == result.stats.drafted
        assert result.token_ids == finish(engine.decoder(target_only(engine.profile)), prompt).token_ids


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_tokens_follow_the_target_distribution_with_early_stops(noisy_pair, backend):
    """χ² tests of the first two emitted tokens, sampled drafting, k = 2, draft_p_min on.

    draft_p_min sits just under the draft's max q at the first position, so the first draft is
    always made while the second is stopped in some runs (depending on the first draw), and a
    rule that judged a drawn token by its own q would drop the first draft most of the time.
    Bins with expected count < 5 are pooled; α = 1e-4 per test (2 tests): the false-failure
    probability of this test is below 2e-4.
    """
    from scipy.stats import chisquare

    runs = 1000
    prompt = [1, 2, 3]
    engine = Engine(adaptive_profile(*noisy_pair, k=2, temperature=1.0, max_tokens=3, backend=backend))
    target, draft = engine.pair.target, engine.pair.draft
    p0, q0 = next_token_probs(target, prompt), next_token_probs(draft, prompt)
    p_min = float(q0.max()) * 0.999
    profile = replace(engine.profile, proposer=replace(engine.profile.proposer, draft_p_min=p_min))
    firsts, seconds, stops = [], [], 0
    for seed in range(runs):
        run = replace(profile, sampling=replace(profile.sampling, seed=seed))
        rounds, result = rounds_of(engine, engine.decoder(run), prompt)
        assert rounds[0].num_drafted >= 1
        stops += rounds[0].early_stop
        firsts.append(result.token_ids[0])
        seconds.append(result.token_ids[:2])
    assert runs * 0.05 < stops < runs * 0.95
    assert _chi2_pvalue(firsts, p0, chisquare) > 1e-4
    common = max(set(firsts), key=firsts.count)
    p1 = next_token_probs(target, prompt + [common])
    follow = [y for x, y in seconds if x == common]
    assert len(follow) > 100
    assert _chi2_pvalue(follow, p1, chisquare) > 1e-4
