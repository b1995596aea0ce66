"""The hybrid proposer: n-gram lookup where the context matches, the draft model elsewhere.

Outputs equal target-only (greedy) on tiny random models, on every backend, and on the shipped
demo pair; the draft cache follows the committed sequence across n-gram rounds (checked at the end
of runs, where no round is in flight; tests/core/round/test_round.py checks it after every round); sampled
output is reproducible and follows the target's distribution; profile, CLI and engine accept the
kind and refuse it without a draft model.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from decode_helpers import BACKENDS, _chi2_pvalue, draft_follows, finish, make_profile, next_token_probs
from specgen.core.engine import Engine, target_only
from specgen.core.errors import ProfileError, UsageError
from specgen.core.drafters.ngram import NgramProposer
from specgen.core.profile import load_profile
from specgen.core.round import Mode
from specgen.core.settings import ModelSpec, Profile, ProposerSpec, SpeculationSpec
from tiny_models import build_pair, write_profile


def hybrid_profile(target, draft, k=3, ngram_min=1, ngram_max=3, backend="torch", **sampling) -> Profile:
    sampling.setdefault("max_tokens", 30)
    return make_profile(target, draft, k=k, backend=backend,
                        proposer=ProposerSpec(kind="hybrid", ngram_min=ngram_min, ngram_max=ngram_max), **sampling)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("hybrid"), noisy=0.1)


@pytest.fixture(scope="module")
def engine(pair):
    return Engine(hybrid_profile(*pair))


def prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    """Half repetitive (lookups match from the first round), half random (the draft starts)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        piece = [rng.randrange(vocab) for _ in range(rng.randint(2, 5))]
        out.append((piece * 3)[: rng.randint(5, 12)] if i % 2 else piece + [rng.randrange(vocab)])
    return out


# ---------------------------------------------------------------- greedy: exactly target-only


def assert_hybrid(decoder) -> None:
    """One round, two modes: the draft model's and the host's (n-gram) drafts, no other path."""
    assert isinstance(decoder.lookup, NgramProposer)
    assert set(decoder.programs) == {Mode.MODEL, Mode.HOST} and decoder.round.draft is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_hybrid_equals_target_only(pair, backend):
    engine = Engine(hybrid_profile(*pair, backend=backend))
    batch = prompts(engine.pair.vocab_size, 8)
    reference = [finish(engine.decoder(target_only(engine.profile)), p).token_ids for p in batch]
    rounds = {"ngram": 0, "draft": 0}
    accepted = 0
    for k in (1, 3, 6):
        profile = replace(engine.profile, speculation=SpeculationSpec(k=k))
        for prompt, expected in zip(batch, reference):
            decoder = engine.decoder(profile)
            assert_hybrid(decoder)
            result = finish(decoder, prompt)
            assert result.token_ids == expected, (k, prompt)
            draft_follows(engine, decoder, prompt, result.token_ids)
            assert sum(decoder.proposer_rounds.values()) == result.stats.rounds
            for kind, count in decoder.proposer_rounds.items():
                rounds[kind] += count
            accepted += result.stats.accepted
    assert rounds["ngram"] > 20 and rounds["draft"] > 20  # both proposers really drafted
    assert accepted > 0


def test_demo_pair_greedy_hybrid_equals_target_only():
    engine = Engine(load_profile("demo", {"proposer.kind": "hybrid", "speculation.k": 3}))
    texts = [json.loads(line)["prompt"] for line in open(engine.profile.target.path + "/../prompts.jsonl")][:3]
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, max_tokens=32, ignore_eos=True))
    for text in texts:
        ids = engine.encode(text)
        decoder = engine.decoder(profile)
        spec = finish(decoder, ids)
        assert spec.token_ids == finish(engine.decoder(target_only(profile)), ids).token_ids
        assert decoder.proposer_rounds["ngram"] > 0 and decoder.proposer_rounds["draft"] > 0
        assert spec.stats.accepted > 0


# ---------------------------------------------------------------- the draft cache


class Launches:
    """Wraps a decoder's programs to record the mode of every round launched, in order."""

    def __init__(self, decoder):
        self.modes: list[Mode] = []
        decoder.programs = {mode: self._wrap(mode, program) for mode, program in decoder.programs.items()}

    def _wrap(self, mode, program):
        modes = self.modes

        class Recorded:
            asynchronous = program.asynchronous

            def prepare(self, slots):
                program.prepare(slots)

            def launch(self, clock, slot=0):
                modes.append(mode)
                program.launch(clock, slot)

        return Recorded()


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 5}])
def test_draft_cache_follows_the_committed_sequence(engine, sampling):
    """At the end of runs that went through n-gram rounds, the draft's cache plus its pending ids
    equals a fresh forward of the whole committed sequence (draft_follows). Runs are cut by
    max_tokens right after each n-gram round of a longer first run (such a round often emits one
    token, and a budget-0 round then ends the run); tests/core/round/test_round.py checks the caches right
    after every host round."""
    last = {Mode.MODEL: 0, Mode.HOST: 0}
    host_rounds = 0
    base = replace(engine.profile, sampling=replace(engine.profile.sampling, max_tokens=30, **sampling))
    for prompt in prompts(engine.pair.vocab_size, 6, seed=4):
        decoder = engine.decoder(base)
        launches = Launches(decoder)
        events = list(decoder.run(prompt))
        ends, generated = [], 0
        host_rounds += launches.modes.count(Mode.HOST)
        for mode, event in zip(launches.modes, events[:-1]):
            generated += len(event.token_ids)
            if mode is Mode.HOST or not ends:
                ends.append(generated)
        for max_tokens in ends:
            profile = replace(base, sampling=replace(base.sampling, max_tokens=max_tokens))
            decoder = engine.decoder(profile)
            launches = Launches(decoder)
            result = finish(decoder, prompt)
            draft_follows(engine, decoder, prompt, result.token_ids)
            last[launches.modes[-1]] += 1
    assert host_rounds > 3 and sum(last.values()) > 6, (host_rounds, last)


# ---------------------------------------------------------------- sampling


def test_seeded_sampling_is_reproducible(engine):
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, temperature=1.0, seed=7))
    prompt = [3, 4, 5, 3, 4]
    a, b = engine.decoder(profile), engine.decoder(profile)
    first, second = finish(a, prompt).token_ids, finish(b, prompt).token_ids
    other = finish(engine.decoder(replace(profile, sampling=replace(profile.sampling, seed=8))), prompt).token_ids
    assert first == second
    assert first != other
    assert a.proposer_rounds == b.proposer_rounds and min(a.proposer_rounds.values()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_hybrid_tokens_follow_the_target_distribution(pair, backend):
    """χ² tests of the first two emitted tokens against the target's exact p, at temperature 1.

    The prompt ends in (a, b), seen earlier followed by (c, a, b), so round 1 is always an n-gram
    round drafting c, a, b with one-hot q; c has target p in (0.2, 0.8), so it is often rejected.
    Then the recovered token x0 breaks the match and round 2 is a draft-model round that starts by
    feeding two pending tokens (b, x0): the second token comes from n-gram rounds (c accepted) and
    from draft rounds alike. Tested: the first token's distribution; and the second token's given
    the most common x0 other than c, which only draft rounds produce. Bins with expected count < 5
    are pooled. α = 1e-4 per χ² test (2 tests): the false-failure probability is below 2e-4.
    """
    from scipy.stats import chisquare

    runs = 800
    profile = hybrid_profile(*pair, k=3, ngram_min=2, ngram_max=2, temperature=1.0, max_tokens=2, backend=backend)
    engine = Engine(profile)
    model, vocab = engine.pair.target, engine.pair.vocab_size
    a, b = 7, 8
    with torch.no_grad():
        ids = torch.tensor([[a, b, c, a, b] for c in range(vocab)], device=model.device)
        p_all = torch.softmax(model(ids).logits[:, -1].float(), -1).cpu()
    mass = p_all[torch.arange(vocab), torch.arange(vocab)]
    c = int(torch.argmin((mass - 0.5).abs()))
    assert 0.2 < float(mass[c]) < 0.8, "no drafted token with a mid-range target probability"
    prompt = [a, b, c, a, b]
    firsts, pairs, draft_rounds = [], [], 0
    for seed in range(runs):
        run = replace(profile, sampling=replace(profile.sampling, seed=seed))
        decoder = engine.decoder(run)
        ids = finish(decoder, prompt).token_ids
        draft_rounds += decoder.proposer_rounds["draft"]
        firsts.append(ids[0])
        pairs.append(ids)
    assert _chi2_pvalue(firsts, p_all[c], chisquare) > 1e-4
    assert draft_rounds > runs * 0.1  # the draft model really drafted second tokens
    x0 = max((x for x in set(firsts) if x != c), key=firsts.count)
    p1 = next_token_probs(model, prompt + [x0])
    follow = [y for x, y in pairs if x == x0]
    assert len(follow) > 100
    assert _chi2_pvalue(follow, p1, chisquare) > 1e-4


# ---------------------------------------------------------------- profile, CLI, engine


def test_profile_accepts_hybrid_and_needs_a_draft(pair, tmp_path):
    target, draft = pair
    path = write_profile(tmp_path / "h.toml", target, draft, proposer={"kind": "hybrid", "ngram_min": 2})
    profile = load_profile(str(path))
    assert profile.proposer.kind == "hybrid" and profile.proposer.ngram_min == 2
    draftless = write_profile(tmp_path / "d.toml", target, None, proposer={"kind": "hybrid"})
    with pytest.raises(ProfileError, match=r"d\.toml:\d+: the hybrid proposer needs a draft model"):
        load_profile(str(draftless))


def test_cli_proposer_hybrid(cli, pair, tmp_path):
    target, draft = pair
    path = write_profile(tmp_path / "p.toml", target, draft, sampling={"max_tokens": 20, "ignore_eos": True})
    prompt = "def add(a, b):\n    return a + b\ndef add(a, b):\n"
    outputs = {}
    for kind in ("hybrid", "none"):
        code, out, err = cli("generate", prompt, "-p", path, "--proposer", kind, "--format", "json", "--quiet")
        assert code == 0, err
        outputs[kind] = json.loads(out)
    assert outputs["hybrid"]["token_ids"] == outputs["none"]["token_ids"]
    assert outputs["hybrid"]["stats"]["drafted"] > 0
    draftless = write_profile(tmp_path / "n.toml", target, None, proposer={"kind": "ngram"})
    code, out, err = cli("generate", prompt, "-p", draftless, "--proposer", "hybrid")
    assert code == 2 and out == ""
    assert err.splitlines()[0].startswith("specgen: error: the hybrid proposer needs a draft model")


def test_engine_without_a_draft_refuses_hybrid(pair):
    target, _ = pair
    profile = Profile("test", "<test>", ModelSpec(str(target)), None, proposer=ProposerSpec(kind="ngram"))
    engine = Engine(profile)
    with pytest.raises(UsageError, match="^the hybrid proposer needs a draft model$"):
        engine.decoder(proposer_kind="hybrid")

