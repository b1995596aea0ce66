"""Penalties and min_tokens at batch (core/round/batch_rows.py through core/batch_decode.py).

Each prompt's tokens at B = 2, 3, 4 (its own repetition, presence and frequency penalties,
min_tokens and stop ids, rows without any among them; more prompts than rows, so that finished
rows are refilled) equal decoding that prompt alone with the chain round, greedy and sampled
(rejection and Gumbel coupling), drafted by the draft model (every round's drafts too), by prompt
lookup and by none; and with the tree round, each row its own tree of the draft model's.
Power: the penalised rows' tokens differ from the same prompts' without penalties, a min_tokens
row runs past the stop id it emits early without it, each row's counts after a run are its
output's, and a χ² test checks a row's first token against the target's penalised distribution
(and refuses the unpenalised one).
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
import pytest
import torch

from dataclasses import replace

from batch_helpers import alone_rounds, batched_rounds
from decode_helpers import _chi2_pvalue, finish, make_profile, random_prompts
from specgen.core.engine import Engine
from specgen.core.errors import UsageError
from specgen.core.sampling.warp import PenaltyRows, WarpParams, warp
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair

# Per-prompt settings sharing one batch: rows without penalties or min_tokens among them.
# (The tiny target's greedy picks lead by a logit or more and rarely repeat an id: rewards of repeats
# change them, which a penalty on ids never picked again would not.)
SETTINGS = [dict(repetition_penalty=0.5), dict(), dict(presence_penalty=1.5, frequency_penalty=1.0),
            dict(min_tokens="stop"), dict(repetition_penalty=1.3, frequency_penalty=0.8, min_tokens="stop"),
            dict(presence_penalty=-2.0, frequency_penalty=-2.0, repetition_penalty=0.3),
            dict(repetition_penalty=0.3, temperature=0.0)]
PENALISED = [0, 2, 4, 5, 6]
# what the batch is built with (the profile's): both parts, which every row shares
PARTS = dict(repetition_penalty=1.2, min_tokens=1)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("batch-penalties"), noisy=0.1)


def engine_for(pair, proposer: str = "draft", **sampling) -> Engine:
    k = 0 if proposer == "none" else 3
    return Engine(make_profile(*pair, k=k, proposer=ProposerSpec(kind=proposer), **(PARTS | sampling)))


def plain(spec):
    return replace(spec, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, min_tokens=0)


def solo(engine: Engine, ids: list[int], spec) -> list[int]:
    return finish(engine.decoder(replace(engine.profile, sampling=spec)), ids).token_ids


def jobs(engine: Engine, count: int = 7) -> list:
    """(ids, settings) of `count` prompts, each with its own max_tokens, seed and SETTINGS; a
    min_tokens row stops at the second id it emits alone without min_tokens, and min_tokens puts
    that stop 3 ids later."""
    work = []
    for i, ids in enumerate(random_prompts(200, count, seed=count)):
        own = dict(SETTINGS[i % len(SETTINGS)])
        stop = own.pop("min_tokens", None)
        spec = replace(engine.profile.sampling, **(dict(max_tokens=8 + 4 * (i % 4), seed=100 + i, min_tokens=0,
                                                         repetition_penalty=1.0) | own))
        if stop:
            free = solo(engine, ids, spec)
            spec = replace(spec, stop_token_ids=(free[1],), min_tokens=free.index(free[1]) + 4)
        work.append((ids, spec))
    return work


def alone(engine: Engine, work: list) -> list[list[int]]:
    return [solo(engine, ids, spec) for ids, spec in work]


def batched(engine: Engine, batch: int, work: list) -> list[list[int]]:
    results = list(engine.batch_decoder(batch).run(work))
    assert [index for index, _ in results] == list(range(len(work)))
    return [finished.token_ids for _, finished in results]


def check_power(engine: Engine, work: list, reference: list) -> None:
    """The settings change what the rows emit: penalised rows differ from their prompts without
    penalties; a min_tokens row runs past its stop id until its min_tokens."""
    differ = [reference[i] != solo(engine, work[i][0], plain(work[i][1])) for i in PENALISED]
    assert all(differ), differ
    for (ids, spec), tokens in zip(work, reference):
        if spec.min_tokens:
            assert len(tokens) >= spec.min_tokens and spec.stop_token_ids[0] not in tokens[: spec.min_tokens - 1]


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, coupling="rejection"),
                                      dict(temperature=1.0, coupling="gumbel")], ids=["greedy", "rejection", "gumbel"])
def test_penalised_rows_equal_each_prompt_alone(pair, sampling):
    """Tokens, fates and every round's drafts (the draft steps' penalties and masks decide them)."""
    engine = engine_for(pair, **sampling)
    work = jobs(engine)
    reference = alone_rounds(engine, work)
    check_power(engine, work, [tokens for tokens, *_ in reference])
    for batch in (2, 3, 4):
        assert batched_rounds(engine, batch, work) == reference, batch


@pytest.mark.parametrize("proposer", ["ngram", "none"])
def test_penalised_rows_of_lookup_and_target_only_equal_each_prompt_alone(pair, proposer):
    """Host drafts (one-hot q, no draft step) and k = 0 (the bonus row alone), sampled."""
    engine = engine_for(pair, proposer, temperature=1.0)
    work = jobs(engine, 5)
    reference = alone(engine, work)
    for batch in (2, 3):
        assert batched(engine, batch, work) == reference, batch


def test_each_rows_counts_are_its_output(pair):
    """After a run of two prompts at B = 2, each row's counts are what it emitted (the commit
    counts every row's own ids, every round): a round that did not count would leave them short."""
    engine = engine_for(pair, temperature=1.0, frequency_penalty=0.5)
    work = [(ids, replace(engine.profile.sampling, max_tokens=9 + 5 * i, seed=i, min_tokens=0))
            for i, ids in enumerate(random_prompts(200, 2, seed=3))]
    decoder = engine.batch_decoder(2)
    results = [finished.token_ids for _, finished in decoder.run(work)]
    counts = decoder.round.rows.penalties.counts
    for b, tokens in enumerate(results):
        assert len(tokens) == work[b][1].max_tokens
        assert torch.equal(counts[b], torch.bincount(torch.tensor(tokens), minlength=counts.shape[1]).int()), b


def test_penalised_batch_rows_follow_the_penalised_distribution(pair):
    """χ² of the first token of 800 seeded runs of one prompt, four rows at a time (drafting: max
    tokens 3), repetition penalty 10 on the prompt's ids: against the target's penalised
    distribution p > 1e-4 (false failure below 1e-4); against the unpenalised one p < 1e-4 (the
    prompt of 40 whose ids carry the most mass, at least a tenth, which the penalty moves)."""
    from scipy.stats import chisquare

    engine = engine_for(pair, temperature=1.0, repetition_penalty=10.0, max_tokens=3, min_tokens=0)
    target, width = engine.pair.target, engine.width

    def distributions(prompt):
        with torch.no_grad():
            logits = target(torch.tensor([prompt])).logits[0, -1:].float()
        seen = torch.zeros(1, logits.shape[1], dtype=torch.bool)
        seen[0, prompt] = True
        params = WarpParams.from_spec(engine.profile.sampling, 1)
        counts = torch.zeros(1, logits.shape[1], dtype=torch.int32)
        penalised = warp(logits, params, PenaltyRows(counts, seen))[1][0]
        return penalised, torch.softmax(logits[0], -1)

    def moved(prompt):
        penalised, free = distributions(prompt)
        return float((penalised - free).abs().sum()) / 2

    prompt = max(random_prompts(width, 40, seed=11), key=moved)
    assert moved(prompt) > 0.1
    penalised, free = distributions(prompt)
    work = [(prompt, replace(engine.profile.sampling, seed=seed)) for seed in range(800)]
    firsts = [finished.token_ids[0] for _, finished in engine.batch_decoder(4).run(work)]
    assert _chi2_pvalue(firsts, penalised, chisquare) > 1e-4
    assert _chi2_pvalue(firsts, free, chisquare) < 1e-4


def test_what_the_batch_was_not_built_with_is_refused(pair):
    """The batch's parts are the profile's: a prompt asking for penalties it lacks is one line."""
    engine = Engine(make_profile(*pair, k=3))
    work = [([1, 2, 3], replace(engine.profile.sampling, repetition_penalty=1.5))]
    with pytest.raises(UsageError) as error:
        list(engine.batch_decoder(2).run(work))
    assert "without penalties" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, coupling="rejection"),
                                      dict(temperature=1.0, coupling="gumbel")], ids=["greedy", "rejection", "gumbel"])
def test_penalised_tree_rows_equal_each_prompt_alone(pair, sampling):
    """Token trees (w = 2, n = 5, k = 3; core/round/batch_tree.py): each tree row counts the drafts
    on its path and masks the stop ids by its depth, as the single tree round's rows do, so each
    prompt's tokens, fates and drafts at B = 2 and 3 are its own alone; the settings change them."""
    profile = make_profile(*pair, k=3, speculation=dict(tree_width=2, tree_nodes=5), **(PARTS | sampling))
    engine = Engine(profile)
    work = jobs(engine)
    reference = alone_rounds(engine, work)
    check_power(engine, work, [tokens for tokens, *_ in reference])
    for batch in (2, 3):
        assert batched_rounds(engine, batch, work) == reference, batch
