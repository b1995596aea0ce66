"""core/round/batch_head.py: an EAGLE-3 head drafting every row of a batch, on tiny fp32 models.

Batch invariance with the head: each prompt's tokens, fates and every round's drafts (the head's
own work, which a random head's rare acceptances would hide behind the target's picks) at
B = 1, 3, 7 equal decoding that prompt alone with the head in the chain round. Prompts of 1 to 12
ids with ragged max_tokens, more prompts than rows (refills, each prefilling its row of the head's
cache) and, at B = 7, rows that run masked. Greedy exactly, over the whole and a reduced draft
vocabulary; Gumbel coupling with each prompt's seed the same sampled text (target-only's);
rejection coupling the same tokens too (each row draws from its own generator, as alone).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from batch_helpers import alone_rounds, batched_rounds
from decode_helpers import finish, make_profile, random_prompts
from specgen.core.engine import Engine
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair, head_for

SAMPLED = [dict(temperature=0.8, top_k=20), dict(top_p=0.9), dict(), dict(temperature=1.3), dict(min_p=0.1)]


@pytest.fixture(scope="module")
def headed(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch-head")
    target, _ = build_pair(root, noisy=0.1)
    return target, head_for(target, root / "head"), head_for(target, root / "reduced", draft_vocab=150)


def eagle_engine(target, head, k: int = 3, **sampling) -> Engine:
    return Engine(make_profile(target, None, k=k, proposer=ProposerSpec(kind="eagle", head=str(head)), **sampling))


def jobs(profile, count: int, sampled: bool = False) -> list:
    """(ids, settings) of `count` prompts of 1 to 12 ids, each with its own max_tokens and seed."""
    prompts = random_prompts(200, count, seed=count)
    return [(ids, replace(profile.sampling, max_tokens=5 + 4 * (i % 4), seed=100 + i,
                          **(SAMPLED[i % len(SAMPLED)] if sampled else {})))
            for i, ids in enumerate(prompts)]


@pytest.mark.parametrize("vocab", ["whole", "reduced"])
def test_greedy_rows_with_a_head_equal_each_prompt_alone(headed, vocab):
    target, whole, reduced = headed
    engine = eagle_engine(target, whole if vocab == "whole" else reduced, k=3)
    work = jobs(engine.profile, 9)
    reference = alone_rounds(engine, work)
    for batch in (1, 3, 7):
        assert batched_rounds(engine, batch, work) == reference, f"batch {batch}"


@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_sampled_rows_with_a_head_equal_each_prompt_alone(headed, coupling):
    """Each row's own warp settings, max_tokens and seed, sharing the batch."""
    target, whole, _ = headed
    engine = eagle_engine(target, whole, k=4, temperature=1.0, coupling=coupling)
    work = jobs(engine.profile, 8, sampled=True)
    reference = alone_rounds(engine, work)
    for batch in (1, 3, 7):
        assert batched_rounds(engine, batch, work) == reference, f"batch {batch}"


def test_gumbel_rows_with_a_head_give_target_only_text(headed):
    """Seed stability: with Gumbel coupling a prompt's seed gives target-only's text at every B."""
    target, whole, _ = headed
    engine = eagle_engine(target, whole, k=3, temperature=0.9, coupling="gumbel")
    work = jobs(engine.profile, 6)
    plain = Engine(replace(engine.profile, proposer=ProposerSpec(kind="none")))
    reference = [finish(plain.decoder(replace(plain.profile, sampling=spec)), ids).token_ids for ids, spec in work]
    for batch in (3, 7):
        assert [ids for ids, _, _ in batched_rounds(engine, batch, work)] == reference


def test_forgotten_batches_let_go_of_the_target(headed):
    """A batch round's tap hooks the target's layers; forget_batches removes them."""
    target, whole, _ = headed
    engine = eagle_engine(target, whole)
    layers = engine.pair.target.model.layers
    before = sum(len(layer._forward_pre_hooks) for layer in layers)
    engine.batch_decoder(2)
    assert sum(len(layer._forward_pre_hooks) for layer in layers) > before
    engine.forget_batches()
    assert sum(len(layer._forward_pre_hooks) for layer in layers) == before


def test_mtp_batches_are_refused_in_one_line(headed):
    target, _, _ = headed
    profile = make_profile(target, None, k=3, proposer=ProposerSpec(kind="mtp"))
    from specgen.core.engine import batch_refusal

    assert batch_refusal(profile) == ("are drafted by the draft model, an EAGLE-3 head (eagle), prompt lookup "
                                      "(ngram) or hybrid only, not by the mtp proposer")

