"""The n-gram (prompt lookup) proposer: lookup rules, the incremental index, and lossless decoding."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from decode_helpers import BACKENDS, _chi2_pvalue, finish, model_spec, next_token_probs
from specgen.core.engine import Engine, target_only
from specgen.core.drafters.ngram import NgramProposer
from specgen.core.round import Mode
from specgen.core.settings import Profile, ProposerSpec, SamplingSpec, SpeculationSpec
from tiny_models import build_pair, write_profile


def lookup(context: list[int], k: int, ngram_min: int = 1, ngram_max: int = 4) -> list[int]:
    proposer = NgramProposer(ngram_min, ngram_max)
    proposer.start(context)
    return proposer.lookup(k)


# ---------------------------------------------------------------- lookup on hand-built contexts


def test_no_match_proposes_nothing():
    assert lookup([1, 2, 3, 4], k=4) == []
    assert lookup([7], k=4) == []  # a one-token context has nothing earlier to match


def test_the_suffix_never_matches_itself():
    # (4, 5) occurs only as the suffix; 5 alone also only there.
    assert lookup([3, 4, 5], k=3, ngram_min=1, ngram_max=2) == []


def test_most_recent_of_several_matches():
    context = [1, 2, 9, 6, 1, 2, 8, 5, 1, 2]
    assert lookup(context, k=3, ngram_min=2, ngram_max=2) == [8, 5, 1]


def test_longer_match_wins_over_a_more_recent_shorter_one():
    context = [1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3]
    assert lookup(context, k=3, ngram_min=1, ngram_max=3) == [9, 5, 2]  # (1, 2, 3), not (2, 3)


def test_n_falls_back_from_ngram_max_to_ngram_min():
    assert lookup([1, 2, 3, 9, 4, 2, 3, 8, 7, 2, 3], k=3, ngram_min=1, ngram_max=3) == [8, 7, 2]  # (2, 3)
    assert lookup([4, 6, 5, 4], k=5, ngram_min=1, ngram_max=3) == [6, 5, 4]  # (4)
    assert lookup([4, 6, 5, 4], k=5, ngram_min=2, ngram_max=3) == []  # 1-grams not allowed


def test_match_at_the_end_gives_a_short_continuation():
    # The latest earlier (7, 7) ends one token before the context does: one token follows it.
    assert lookup([5, 7, 7, 7], k=4, ngram_min=2, ngram_max=2) == [7]
    # A match in the middle whose continuation runs into the end of the context.
    assert lookup([1, 2, 3, 1, 2], k=8, ngram_min=2, ngram_max=2) == [3, 1, 2]


def test_k_zero_and_context_shorter_than_ngram_min():
    assert lookup([1, 2, 1, 2], k=0) == []
    assert lookup([1, 1], k=2, ngram_min=3, ngram_max=4) == []


def test_follow_extends_the_context_with_the_committed_tokens():
    proposer = NgramProposer(1, 2)
    proposer.start([1, 2, 3, 1, 2])
    assert proposer.lookup(3) == [3, 1, 2]
    proposer.follow([3, 7])  # one accepted, then 7: context 1 2 3 1 2 3 7
    assert proposer.tokens == [1, 2, 3, 1, 2, 3, 7]
    assert proposer.lookup(3) == []
    proposer.follow([1])  # ... 7 1: the latest 1 was followed by 2 3 7
    assert proposer.lookup(3) == [2, 3, 7]


def brute_force(context: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    length = len(context)
    for n in range(ngram_max, ngram_min - 1, -1):
        if n > length:
            continue
        suffix = context[length - n:]
        for end in range(length - 1, n - 1, -1):  # latest first; end = length would be the suffix itself
            if context[end - n:end] == suffix:
                return context[end:end + k]
    return []


@pytest.mark.parametrize("alphabet,ngram_min,ngram_max", [(2, 1, 4), (4, 2, 3), (6, 1, 1), (3, 3, 6)])
def test_incremental_index_equals_brute_force(alphabet, ngram_min, ngram_max):
    rng = random.Random(alphabet * 100 + ngram_max)
    for _ in range(20):
        context = [rng.randrange(alphabet) for _ in range(rng.randint(1, 30))]
        proposer = NgramProposer(ngram_min, ngram_max)
        proposer.start(context)
        for _ in range(40):
            k = rng.randint(0, 6)
            drafted = proposer.lookup(k)
            assert drafted == brute_force(context, k, ngram_min, ngram_max), (context, k)
            committed = drafted[: rng.randint(0, len(drafted))] + [rng.randrange(alphabet)]
            proposer.follow(committed)
            context = context + committed
        assert proposer.tokens == context


class CountingTable(dict):
    added = 0

    def update(self, items):
        items = list(items)
        self.added += len(items)
        super().update(items)


def test_a_round_indexes_only_the_new_tokens():
    """On a long prompt, a round adds the n-grams of its committed tokens and nothing else."""
    proposer = NgramProposer(1, 4)
    proposer.start(list(range(5000)) * 2)
    proposer.tables = {n: CountingTable(table) for n, table in proposer.tables.items()}
    assert proposer.lookup(8) == list(range(8))
    proposer.follow(list(range(8)) + [12345])  # 9 new tokens: 9 new n-gram ends per n
    assert proposer.lookup(8) == []
    assert [table.added for table in proposer.tables.values()] == [9, 9, 9, 9]


# ---------------------------------------------------------------- decoding with tiny models


def ngram_profile(target, k=4, ngram_min=1, ngram_max=3, backend="torch", **sampling) -> Profile:
    sampling.setdefault("max_tokens", 40)
    sampling.setdefault("ignore_eos", True)
    return Profile("test", "<test>", model_spec(target, backend), None,
                   proposer=ProposerSpec(kind="ngram", ngram_min=ngram_min, ngram_max=ngram_max),
                   speculation=SpeculationSpec(k=k), sampling=SamplingSpec(**sampling))


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("ngram"), noisy=0.1)[0]


def repetitive_prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        piece = [rng.randrange(vocab) for _ in range(rng.randint(2, 6))]
        prompts.append((piece * 3)[: rng.randint(4, 18)])
    return prompts


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_ngram_equals_greedy_target_only(target, backend):
    engine = Engine(ngram_profile(target, backend=backend))
    assert engine.pair.draft is None  # the n-gram proposer loads no draft model
    prompts = repetitive_prompts(8, engine.pair.vocab_size)
    reference = [finish(engine.decoder(target_only(engine.profile)), p).token_ids for p in prompts]
    accepted = 0
    for k in (1, 4, 8):
        profile = replace(engine.profile, speculation=SpeculationSpec(k=k))
        for prompt, expected in zip(prompts, reference):
            decoder = engine.decoder(profile)
            assert set(decoder.programs) == {Mode.HOST} and decoder.lookup is not None
            spec = finish(decoder, prompt)
            assert spec.token_ids == expected, (k, prompt)
            assert decoder.proposer_rounds == {"ngram": spec.stats.rounds, "draft": 0}
            accepted += spec.stats.accepted
    assert accepted > 0  # lookups did propose tokens that the target kept


def test_rounds_report_k_used_and_early_stops(target):
    engine = Engine(ngram_profile(target, k=4, max_tokens=30))
    events = list(engine.decoder().run([5, 6, 7, 8, 5, 6]))
    rounds, result = events[:-1], events[-1]
    left = 30
    for event in rounds:
        assert event.k_used == min(4, left - 1)  # n-gram lookup has no adaptive k
        assert event.early_stop == (event.num_drafted < event.k_used)
        left -= len(event.token_ids)
    assert result.stats.early_stops == sum(e.early_stop for e in rounds)
    assert result.stats.mean_k == pytest.approx(sum(e.k_used for e in rounds) / len(rounds))


def test_cli_proposer_ngram_equals_proposer_none(target, tmp_path):
    from typer.testing import CliRunner

    from specgen.cli.main import app

    profile = write_profile(tmp_path / "p.toml", target, None, proposer={"kind": "ngram"},
                            sampling={"max_tokens": 30, "ignore_eos": True})
    prompt = "def add(a, b):\n    return a + b\ndef add(a, b):\n"
    outputs = {}
    for kind in ("ngram", "none"):
        result = CliRunner().invoke(app, ["generate", prompt, "-p", str(profile), "--proposer", kind,
                                          "--format", "json", "--quiet"])
        assert result.exit_code == 0, result.output
        outputs[kind] = json.loads(result.stdout)
    assert outputs["ngram"]["token_ids"] == outputs["none"]["token_ids"]
    assert outputs["ngram"]["stats"]["drafted"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_ngram_tokens_follow_the_target_distribution(target, backend):
    """χ² test of the first two emitted tokens against the target's exact p, at temperature 1.

    The prompt ends in (a, b), which occurred earlier followed by (c, a, b): every run drafts
    c, a, b with one-hot q. c is picked so that the target gives it p in (0.2, 0.8): both the
    accepted and the recovered path occur often. Bins with expected count < 5 are pooled.
    α = 1e-4 per χ² test (2 tests): the false-failure probability of this test is below 2e-4.
    """
    from scipy.stats import chisquare

    runs = 1000
    engine = Engine(ngram_profile(target, k=3, ngram_min=2, ngram_max=2, temperature=1.0, max_tokens=3,
                                  backend=backend))
    model, vocab = engine.pair.target, engine.pair.vocab_size
    a, b = 7, 8
    prompts = torch.tensor([[a, b, c, a, b] for c in range(vocab)], device=model.device)
    with torch.no_grad():
        p_all = torch.softmax(model(prompts).logits[:, -1].float(), -1).cpu()  # [V, V]
    mass = p_all[torch.arange(vocab), torch.arange(vocab)]
    c = int(torch.argmin((mass - 0.5).abs()))
    assert 0.2 < float(mass[c]) < 0.8, "no drafted token with a mid-range target probability"
    prompt = [a, b, c, a, b]
    firsts, seconds = [], []
    drafted = 0
    for seed in range(runs):
        profile = replace(engine.profile, sampling=replace(engine.profile.sampling, seed=seed))
        result = finish(engine.decoder(profile), prompt)
        drafted += result.stats.drafted
        firsts.append(result.token_ids[0])
        seconds.append(result.token_ids[:2])
    assert drafted >= runs * 2  # the lookup really drafted in (nearly) every run
    assert _chi2_pvalue(firsts, p_all[c], chisquare) > 1e-4
    p1 = next_token_probs(model, prompt + [c])
    follow = [y for x, y in seconds if x == c]  # after an accepted c, the draft a was verified
    assert len(follow) > 200
    assert _chi2_pvalue(follow, p1, chisquare) > 1e-4
