"""core/round/batch_lookup.py: prompt lookup drafting every row of a batch, on tiny fp32 models.

Batch invariance with lookup: each prompt's tokens, fates and every round's drafts (each row's
proposer's work) at B = 1, 3, 7 equal decoding that prompt alone with --proposer ngram (the chain
round's host drafts). The target is a bigram model (tiny_models.bigram_target) and most prompts
hold the chain it writes after them, so rows draft, and their drafts are accepted, in most rounds;
every third prompt is random (rows with no match draft nothing that round). Ragged max_tokens, more
prompts than rows (refills restart a row's proposer) and, at B = 7, rows that run masked. Greedy
exactly; Gumbel coupling with each prompt's seed the same sampled text (target-only's too);
rejection coupling the same tokens (each row draws from its own generator what the chain round
draws for host drafts: the target's noise row and the uniforms).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from batch_helpers import LOOKUP_SAMPLED, alone_rounds, batched_rounds, bigram, chain_prompts  # noqa: F401 (bigram: a fixture)
from decode_helpers import finish, make_profile
from specgen.core.engine import Engine, batch_refusal, target_only
from specgen.core.events import Fate
from specgen.core.settings import ProposerSpec

SAMPLED = LOOKUP_SAMPLED



def lookup_engine(target, k: int = 3, **sampling) -> Engine:
    return Engine(make_profile(target, None, k=k, proposer=ProposerSpec(kind="ngram"), **sampling))


def jobs(engine: Engine, count: int, sampled: bool = False) -> list:
    """(ids, settings) of `count` prompts (batch_helpers.chain_prompts), each with its own max_tokens
    and seed (and, sampled, its own warp settings)."""
    return [(ids, replace(engine.profile.sampling, max_tokens=6 + 5 * (i % 4), seed=100 + i,
                          **(SAMPLED[i % len(SAMPLED)] if sampled else {})))
            for i, ids in enumerate(chain_prompts(engine, count, seed=count))]


def lookups(results: list[tuple]) -> tuple[int, int]:
    """(drafts proposed, drafts accepted) over every prompt's rounds."""
    drafted = sum(len(drafts) for _, _, rounds in results for drafts in rounds)
    return drafted, sum(fates.count(Fate.ACCEPTED) for _, fates, _ in results)


def test_greedy_lookup_rows_equal_each_prompt_alone(bigram):
    engine = lookup_engine(bigram, k=4)
    work = jobs(engine, 9)
    reference = alone_rounds(engine, work)
    drafted, accepted = lookups(reference)
    assert accepted > 20 and drafted > accepted  # lookups drafted, were accepted, and were rejected
    assert any(not drafts for _, _, rounds in reference for drafts in rounds)  # and found nothing
    for batch in (1, 3, 7):
        assert batched_rounds(engine, batch, work) == reference, f"batch {batch}"


@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_sampled_lookup_rows_equal_each_prompt_alone(bigram, coupling):
    """Each row's own warp settings (a greedy row among them), max_tokens and seed, sharing the batch."""
    engine = lookup_engine(bigram, k=3, temperature=1.0, coupling=coupling)
    work = jobs(engine, 8, sampled=True)
    reference = alone_rounds(engine, work)
    drafted, accepted = lookups(reference)
    assert drafted > accepted > 0
    for batch in (1, 3, 7):
        assert batched_rounds(engine, batch, work) == reference, f"batch {batch}"


def test_gumbel_lookup_rows_give_target_only_text(bigram):
    """Seed stability: with Gumbel coupling a prompt's seed gives target-only's text at every B."""
    engine = lookup_engine(bigram, k=3, temperature=0.9, coupling="gumbel")
    work = jobs(engine, 6)
    plain = Engine(target_only(engine.profile))
    reference = [finish(plain.decoder(replace(plain.profile, sampling=spec)), ids).token_ids for ids, spec in work]
    for batch in (3, 7):
        assert [ids for ids, _, _ in batched_rounds(engine, batch, work)] == reference


def test_lookup_batches_keep_one_round_in_flight(bigram):
    """The next round's drafts are read from this round's tokens: one round in flight, even with
    pipeline = on."""
    engine = Engine(make_profile(bigram, None, k=3, proposer=ProposerSpec(kind="ngram"),
                                 speculation=dict(pipeline="on")))
    assert not engine.batch_decoder(3).pipelined
    draft = Engine(make_profile(bigram, bigram, k=3, speculation=dict(pipeline="on")))
    assert draft.batch_decoder(3).pipelined


def test_lookup_takes_what_only_a_model_draft_refuses(bigram):
    """draft_p_min with trees is a model's refusal: prompt lookup's tree batches take it."""
    profile = make_profile(bigram, None, k=3, proposer=ProposerSpec(kind="ngram", draft_p_min=0.5),
                           speculation=dict(draft_sampling="argmax", tree_width=2, tree_nodes=4))
    assert batch_refusal(profile) == ""
    assert batch_refusal(replace(profile, proposer=replace(profile.proposer, kind="draft"))) == \
        "take no draft_p_min with token trees yet"


def test_batch_size_auto_with_lookup_and_nothing_measured_is_batch_one(bigram, tmp_path):
    """bench --batch-size --proposer ngram keeps the rows auto reads (tests/cli/test_bench_batches.py);
    with none, batch 1, saying so."""
    engine = lookup_engine(bigram)
    runtime = replace(engine.profile.runtime, batch_size="auto", measured=str(tmp_path))
    choice = engine.resolve_batch(replace(engine.profile, runtime=runtime), 4, 30)
    assert (choice.batch, choice.measured) == (1, False) and choice.reason.startswith("nothing measured for ")
