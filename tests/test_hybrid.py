"""The hybrid proposer: n-gram lookup where the context matches, the draft model elsewhere.

Outputs equal target-only (greedy) on tiny random models, the shipped demo pair and the GPU round's
logic on CPU; the draft cache follows the committed sequence across n-gram rounds; sampled output
is reproducible and follows the target's distribution; profile, CLI and engine accept the kind and
refuse it without a draft model.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from specgen.core.engine import Engine, target_only
from specgen.core.errors import ProfileError, UsageError
from specgen.core.hybrid import HybridProposer
from specgen.core.profile import load_profile
from specgen.core.runner import EagerRunner
from specgen.core.settings import ModelSpec, Profile, ProposerSpec, SamplingSpec, SpeculationSpec
from test_decode import _chi2_pvalue, finish, next_token_probs
from tiny_models import build_pair, write_profile


def hybrid_profile(target, draft, k=3, ngram_min=1, ngram_max=3, **sampling) -> Profile:
    sampling.setdefault("max_tokens", 30)
    sampling.setdefault("ignore_eos", True)
    return Profile("test", "<test>", ModelSpec(str(target)), ModelSpec(str(draft)),
                   proposer=ProposerSpec(kind="hybrid", ngram_min=ngram_min, ngram_max=ngram_max),
                   speculation=SpeculationSpec(k=k), sampling=SamplingSpec(**sampling))


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


class Spy:
    """Wraps a hybrid proposer's draft model: pending lengths fed per draft round, and after every
    commit, that the draft cache plus its pending tokens is exactly the committed sequence."""

    def __init__(self, decoder):
        self.proposer = decoder.proposer
        self.decoder = decoder
        self.fed: list[int] = []
        draft = self.proposer.draft
        propose, commit = draft.propose, self.proposer.commit

        def spy_propose(k, state, generator):
            self.fed.append(len(draft.pending))
            return propose(k, state, generator)

        def spy_commit(num_accepted, next_token):
            commit(num_accepted, next_token)
            committed = len(self.prompt) + decoder.state.generated
            assert draft.runner.length + len(draft.pending) == committed

        draft.propose, self.proposer.commit = spy_propose, spy_commit

    def run(self, prompt):
        self.prompt = prompt
        return finish(self.decoder, prompt)


# ---------------------------------------------------------------- greedy: exactly target-only


def test_greedy_hybrid_equals_target_only(engine):
    batch = prompts(engine.pair.vocab_size, 8)
    reference = [finish(engine.decoder(target_only(engine.profile)), p).token_ids for p in batch]
    rounds = {"ngram": 0, "draft": 0}
    accepted = 0
    for k in (1, 3, 6):
        profile = replace(engine.profile, speculation=SpeculationSpec(k=k))
        for prompt, expected in zip(batch, reference):
            decoder = engine.decoder(profile)
            assert isinstance(decoder.proposer, HybridProposer)
            result = finish(decoder, prompt)
            assert result.token_ids == expected, (k, prompt)
            for kind, count in decoder.proposer.rounds.items():
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
        assert decoder.proposer.rounds["ngram"] > 0 and decoder.proposer.rounds["draft"] > 0
        assert spec.stats.accepted > 0


# ---------------------------------------------------------------- the draft cache


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 5}])
def test_draft_cache_follows_the_committed_sequence(engine, sampling):
    """After n-gram rounds the draft's pending tokens are fed in one multi-token step; at the end of
    runs that stop after either kind of round, the draft's logits after feeding them equal a fresh
    forward of the whole committed sequence."""
    fresh = EagerRunner(engine.pair.draft, engine.width)
    multi = 0
    for max_tokens in range(8, 26, 3):
        profile = replace(engine.profile, sampling=replace(engine.profile.sampling, max_tokens=max_tokens, **sampling))
        for prompt in prompts(engine.pair.vocab_size, 4, seed=max_tokens):
            spy = Spy(engine.decoder(profile))
            result = spy.run(prompt)
            multi += sum(n > 1 for n in spy.fed)
            draft = spy.proposer.draft
            got = draft.runner.forward(torch.tensor(draft.pending))[-1]
            fresh.reset()
            want = fresh.forward(torch.tensor(prompt + result.token_ids))[-1]
            assert float((got - want).norm() / want.norm()) < 1e-4  # float32 rounding only
    assert multi > 10  # many draft rounds started with several pending tokens


# ---------------------------------------------------------------- sampling


def test_seeded_sampling_is_reproducible(engine):
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, temperature=1.0, seed=7))
    prompt = [3, 4, 5, 3, 4]
    a, b = engine.decoder(profile), engine.decoder(profile)
    first, second = finish(a, prompt).token_ids, finish(b, prompt).token_ids
    other = finish(engine.decoder(replace(profile, sampling=replace(profile.sampling, seed=8))), prompt).token_ids
    assert first == second
    assert first != other
    assert a.proposer.rounds == b.proposer.rounds and min(a.proposer.rounds.values()) > 0


@pytest.mark.slow
def test_sampled_hybrid_tokens_follow_the_target_distribution(engine):
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
    model, vocab = engine.pair.target, engine.pair.vocab_size
    a, b = 7, 8
    with torch.no_grad():
        ids = torch.tensor([[a, b, c, a, b] for c in range(vocab)], device=model.device)
        p_all = torch.softmax(model(ids).logits[:, -1].float(), -1).cpu()
    mass = p_all[torch.arange(vocab), torch.arange(vocab)]
    c = int(torch.argmin((mass - 0.5).abs()))
    assert 0.2 < float(mass[c]) < 0.8, "no drafted token with a mid-range target probability"
    prompt = [a, b, c, a, b]
    profile = hybrid_profile(*engine_paths(engine), k=3, ngram_min=2, ngram_max=2, temperature=1.0, max_tokens=2)
    firsts, pairs, draft_rounds = [], [], 0
    for seed in range(runs):
        run = replace(profile, sampling=replace(profile.sampling, seed=seed))
        decoder = engine.decoder(run)
        ids = finish(decoder, prompt).token_ids
        draft_rounds += decoder.proposer.rounds["draft"]
        firsts.append(ids[0])
        pairs.append(ids)
    assert _chi2_pvalue(firsts, p_all[c], chisquare) > 1e-4
    assert draft_rounds > runs * 0.1  # the draft model really drafted second tokens
    x0 = max((x for x in set(firsts) if x != c), key=firsts.count)
    p1 = next_token_probs(model, prompt + [x0])
    follow = [y for x, y in pairs if x == x0]
    assert len(follow) > 100
    assert _chi2_pvalue(follow, p1, chisquare) > 1e-4


def engine_paths(engine: Engine) -> tuple[str, str]:
    return engine.profile.target.path, engine.profile.draft.path


# ---------------------------------------------------------------- the GPU round's logic (on CPU)


def test_fast_path_keeps_the_hybrid_proposer(engine):
    """gpu/loop.py's FastPath.adopt passes the hybrid through; its GraphDecoder (run eagerly on CPU
    over static caches, as in test_fast_loop.py) gives target-only output."""
    from test_fast_loop import fast_engine

    fast = fast_engine(engine.profile)
    for prompt in prompts(engine.pair.vocab_size, 4, seed=3):
        decoder = fast.decoder()
        assert isinstance(decoder.proposer, HybridProposer) and decoder.proposer.runner is fast.draft_runner
        expected = finish(engine.decoder(target_only(engine.profile)), prompt).token_ids
        assert finish(decoder, prompt).token_ids == expected
        assert min(decoder.proposer.rounds.values()) > 0


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

