"""The decode loop end to end on CPU, through the real loader, with tiny random-weight models."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from specgen.core.decode import Fate, Finished
from specgen.core.engine import Engine, target_only
from specgen.core.settings import ModelSpec, Profile, SamplingSpec, SpeculationSpec
from tiny_models import build_pair


def make_profile(target, draft, k=3, **sampling) -> Profile:
    sampling.setdefault("max_tokens", 24)
    sampling.setdefault("ignore_eos", True)
    return Profile("test", "<test>", ModelSpec(str(target)), ModelSpec(str(draft)),
                   speculation=SpeculationSpec(k=k), sampling=SamplingSpec(**sampling))


def finish(decoder, ids) -> Finished:
    events = list(decoder.run(ids))
    assert isinstance(events[-1], Finished)
    return events[-1]


def random_prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for _ in range(count)]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return build_pair(root, family=request.param, noisy=0.1)


@pytest.fixture(scope="module")
def noisy_pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("noisy"), noisy=0.1)


def test_greedy_speculative_equals_greedy_target_only(pair):
    engine = Engine(make_profile(*pair))
    vocab = engine.pair.vocab_size
    prompts = random_prompts(vocab, 20)
    reference = [finish(engine.decoder(target_only(engine.profile)), p).token_ids for p in prompts]
    for k in (1, 3, 8):
        profile = replace(engine.profile, speculation=SpeculationSpec(k=k))
        for prompt, expected in zip(prompts, reference):
            got = finish(engine.decoder(profile), prompt).token_ids
            assert got == expected, f"k={k} prompt={prompt}"


def test_noisy_draft_greedy_equal_and_partly_accepted(noisy_pair):
    engine = Engine(make_profile(*noisy_pair, k=4, max_tokens=40))
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


def test_max_tokens_exact_for_every_k(noisy_pair):
    engine = Engine(make_profile(*noisy_pair))
    for k in (1, 2, 5, 8):
        for max_tokens in (1, 2, 7):
            profile = replace(engine.profile, speculation=SpeculationSpec(k=k),
                              sampling=replace(engine.profile.sampling, max_tokens=max_tokens))
            result = finish(engine.decoder(profile), [3, 4])
            assert len(result.token_ids) == max_tokens and result.reason == "length"


def test_stop_token_ids_and_min_tokens(noisy_pair):
    engine = Engine(make_profile(*noisy_pair, max_tokens=40))
    free = finish(engine.decoder(), [9, 10, 11]).token_ids
    stop_id = free[5]
    first = free.index(stop_id)
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, stop_token_ids=(stop_id,)))
    stopped = finish(engine.decoder(profile), [9, 10, 11])
    assert stopped.reason == "stop_token"
    assert stopped.token_ids == free[: first + 1]
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


def test_sampled_tokens_follow_the_target_distribution(noisy_pair):
    """χ² test of the first two emitted tokens (same round, k = 3) against the target's exact p.

    Bins with expected count < 5 are pooled. α = 1e-4 per χ² test (2 tests): the false-failure
    probability of this test is below 2e-4.
    """
    from scipy.stats import chisquare

    runs = 1500
    engine = Engine(make_profile(*noisy_pair, k=3, temperature=1.0, max_tokens=4))
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


def next_token_probs(model, ids: list[int]) -> torch.Tensor:
    """softmax of the model's last logits for one sequence: [V] float32 on the CPU, wherever the model is."""
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0, -1]
    return torch.softmax(logits.float(), -1).cpu()


def _chi2_pvalue(samples: list[int], probs: torch.Tensor, chisquare) -> float:
    n = len(samples)
    counts = torch.bincount(torch.tensor(samples), minlength=probs.shape[0]).double()
    expected = probs.double() * n
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().unsqueeze(0)])
    wanted = torch.cat([expected[big], expected[~big].sum().unsqueeze(0)])
    wanted = wanted * observed.sum() / wanted.sum()
    return float(chisquare(observed.numpy(), wanted.numpy()).pvalue)


def test_unrelated_draft_still_lossless(tmp_path):
    """A draft that is a different random model: nearly everything is recovered, output unchanged."""
    target, draft = build_pair(tmp_path)
    engine = Engine(make_profile(target, draft, k=3, max_tokens=16))
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
