"""core/round/batch_round.py through core/batch_decode.py: batch invariance on tiny fp32 models.

Each prompt's tokens at B = 2, 3, 4 (prompts of different lengths, max_tokens and sampling
settings in one batch, more prompts than rows so that finished rows are refilled, and more rows
than prompts so that some run masked) equal decoding that prompt alone with the chain round:
greedy exactly; Gumbel coupling with the prompt's seed the same sampled text; rejection coupling
the same tokens too, since each row draws from its own generator, seeded by its prompt, in the
order and shapes the chain round draws. A χ² test checks a batch row's tokens against the
target's distribution on their own.
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
import pytest

from dataclasses import replace

from decode_helpers import _chi2_pvalue, finish, make_profile, next_token_probs, random_prompts
from specgen.core.engine import Engine
from specgen.core.errors import UsageError
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair

# Per-prompt settings sharing one batch (a greedy row among sampled ones included).
SETTINGS = [dict(temperature=0.0), dict(temperature=0.8, top_k=20), dict(top_p=0.9), dict(min_p=0.1), dict(),
            dict(temperature=1.3), dict(top_p=0.8, top_k=5)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("batches"), noisy=0.1)


def jobs(profile, count: int, sampled: bool) -> list:
    """(ids, settings) of `count` prompts of 1 to 12 ids, each with its own max_tokens and seed."""
    prompts = random_prompts(200, count, seed=count)
    specs = [replace(profile.sampling, max_tokens=6 + 4 * (i % 4), seed=100 + i,
                     **(SETTINGS[i % len(SETTINGS)] if sampled else {})) for i in range(count)]
    return list(zip(prompts, specs))


def alone(engine: Engine, work: list) -> list[list[int]]:
    return [finish(engine.decoder(replace(engine.profile, sampling=spec)), ids).token_ids for ids, spec in work]


def batched(engine: Engine, batch: int, work: list) -> list[list[int]]:
    results = list(engine.batch_decoder(batch).run(work))
    assert [index for index, _ in results] == list(range(len(work)))
    return [finished.token_ids for _, finished in results]


@pytest.mark.parametrize("count", [2, 7])
def test_greedy_rows_equal_each_prompt_alone(pair, count):
    """7 prompts: rows finish and are refilled; 2 prompts at B = 3, 4: rows run masked."""
    engine = Engine(make_profile(*pair, k=3))
    work = jobs(engine.profile, count, sampled=False)
    reference = alone(engine, work)
    for batch in (2, 3, 4):
        assert batched(engine, batch, work) == reference


@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_sampled_rows_equal_each_prompt_alone(pair, coupling):
    """Each row's own temperature, top-k, top-p, min-p, max_tokens and seed, sharing the batch."""
    engine = Engine(make_profile(*pair, k=3, temperature=1.0, coupling=coupling))
    work = jobs(engine.profile, 7, sampled=True)
    reference = alone(engine, work)
    assert len({tuple(ids) for ids in reference}) == len(reference)
    for batch in (2, 3, 4):
        assert batched(engine, batch, work) == reference


def test_adaptive_k_and_stop_strings_per_row(pair):
    """Each row adapts its own k; a row's stop string ends that row alone, where it ends alone."""
    engine = Engine(make_profile(*pair, k=4, proposer=ProposerSpec(adaptive_k=True)))
    work = jobs(engine.profile, 5, sampled=False)
    text = finish(engine.decoder(replace(engine.profile, sampling=work[1][1])), work[1][0]).text
    work[1] = (work[1][0], replace(work[1][1], stop=(text[len(text) // 2:][:3],)))
    reference = [finish(engine.decoder(replace(engine.profile, sampling=spec)), ids) for ids, spec in work]
    assert reference[1].reason == "stop"
    results = [finished for _, finished in engine.batch_decoder(3).run(work)]
    assert [(f.token_ids, f.text, f.reason) for f in results] == [(f.token_ids, f.text, f.reason) for f in reference]


def test_batch_rows_follow_the_target_distribution(pair):
    """χ² of the first emitted token of 800 seeded runs of one prompt, four rows at a time, each
    round drafting (max_tokens 3: one or two drafts). α = 1e-4: false failure below 1e-4."""
    from scipy.stats import chisquare

    engine = Engine(make_profile(*pair, k=3, temperature=1.0, max_tokens=3))
    prompt = [7, 8, 9]
    work = [(prompt, replace(engine.profile.sampling, seed=seed)) for seed in range(800)]
    firsts = [finished.token_ids[0] for _, finished in engine.batch_decoder(4).run(work)]
    assert _chi2_pvalue(firsts, next_token_probs(engine.pair.target, prompt), chisquare) > 1e-4


PICKS = {"argmax": dict(speculation=dict(draft_sampling="argmax")),
         "p_min": dict(proposer=ProposerSpec(draft_p_min=0.3)),
         "argmax, p_min": dict(speculation=dict(draft_sampling="argmax"), proposer=ProposerSpec(draft_p_min=0.3))}


@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
@pytest.mark.parametrize("pick", list(PICKS))
def test_argmax_drafts_and_p_min_rows_equal_each_prompt_alone(pair, coupling, pick):
    """draft_sampling = argmax (every row drafts its argmax; rejection coupling verifies them as
    one-hot q) and draft_p_min (each row's count cut at its own first unsure step): each row's
    tokens and fates (so its counts) as alone, a greedy row among sampled ones."""
    engine = Engine(make_profile(*pair, k=3, temperature=1.0, coupling=coupling, **PICKS[pick]))
    work = jobs(engine.profile, 7, sampled=True)
    reference = [finish(engine.decoder(replace(engine.profile, sampling=spec)), ids) for ids, spec in work]
    for batch in (2, 4):
        results = [finished for _, finished in engine.batch_decoder(batch).run(work)]
        assert [(f.token_ids, f.fates) for f in results] == [(f.token_ids, f.fates) for f in reference]
    if "p_min" in pick:  # the cut happened: fewer drafts than the budget's
        drafted = sum(f.stats.drafted for f in reference)
        plain = Engine(make_profile(*pair, k=3, temperature=1.0, coupling=coupling,
                                    speculation=PICKS[pick].get("speculation")))
        assert drafted < sum(finish(plain.decoder(replace(plain.profile, sampling=spec)), ids).stats.drafted
                             for ids, spec in work)


def test_argmax_drafts_of_an_all_greedy_batch_equal_each_prompt_alone(pair):
    """draft_sampling = argmax with every row greedy: the batch verifies greedily and writes no
    one-hot q (BatchDraftPick.count), each row's tokens and fates as alone."""
    engine = Engine(make_profile(*pair, k=3, coupling="rejection", speculation=dict(draft_sampling="argmax")))
    work = jobs(engine.profile, 5, sampled=False)
    reference = [finish(engine.decoder(replace(engine.profile, sampling=spec)), ids) for ids, spec in work]
    results = [finished for _, finished in engine.batch_decoder(3).run(work)]
    assert [(f.token_ids, f.fates) for f in results] == [(f.token_ids, f.fates) for f in reference]


def test_argmax_drafts_at_batch_follow_the_target_distribution(pair):
    """χ² as above with the draft's argmax verified as one-hot q (a wrong q would skew it)."""
    from scipy.stats import chisquare

    engine = Engine(make_profile(*pair, k=3, temperature=1.0, max_tokens=3,
                                 speculation=dict(draft_sampling="argmax")))
    prompt = [7, 8, 9]
    work = [(prompt, replace(engine.profile.sampling, seed=seed)) for seed in range(800)]
    firsts = [finished.token_ids[0] for _, finished in engine.batch_decoder(4).run(work)]
    assert _chi2_pvalue(firsts, next_token_probs(engine.pair.target, prompt), chisquare) > 1e-4


@pytest.mark.parametrize("change, named", [
    (dict(proposer=ProposerSpec(kind="hybrid"), speculation=dict(tree_width=2, tree_nodes=4, hybrid_merge="always")),
     "hybrid's trees with hybrid_merge = never only"),
    (dict(proposer=ProposerSpec(draft_p_min=0.5), speculation=dict(tree_width=2, tree_nodes=4)),
     "no draft_p_min with token trees"),
])
def test_what_batches_do_not_take_is_one_line(pair, change, named):
    with pytest.raises(UsageError) as error:
        Engine(make_profile(*pair, k=3, **change)).batch_decoder(2)
    assert named in str(error.value) and "\n" not in str(error.value)
