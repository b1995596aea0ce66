"""core/round/batch_lookup_tree.py: prompt lookup's token trees at batch, each row its own trie.

Each prompt's tokens, fates and every round's drafts at B = 1, 3, 7 equal decoding that prompt
alone with the lookup tree round of the same (k, width, nodes) (core/round/host_tree.py; its empty
program where the lookup finds nothing). The target is a bigram model (tiny_models.bigram_target)
and most prompts hold its chain and a copy with one id changed (batch_helpers.branch_prompts), so
the lookups branch and the target takes the branch the copy does not; every third prompt is random
(rows whose lookup finds nothing: the root alone). Ragged max_tokens, more prompts than rows
(refills restart a row's lookup) and, at B = 7, rows that run masked. Greedy exactly; Gumbel
coupling the same sampled text (target-only's); rejection coupling the same tokens (each row's
generator draws what the single round draws for a host tree: the target's noise row and the
uniforms [k, w], no children's rows; sampled rows walk the siblings, a greedy row greedily).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from batch_helpers import LOOKUP_SAMPLED, alone_rounds, batched_rounds, bigram, branch_prompts  # noqa: F401 (bigram: a fixture)
from decode_helpers import finish, make_profile
from specgen.core.engine import Engine, target_only
from specgen.core.events import Fate
from specgen.core.round import TreeRound
from specgen.core.round.batch_lookup_tree import BatchLookupTree
from specgen.core.round.batch_tree import BatchTreeRound
from specgen.core.settings import ProposerSpec

SHAPES = [(4, 2, 6), (3, 3, 8)]  # (k, width, nodes)
SAMPLED = LOOKUP_SAMPLED



def lookup_tree_engine(target, shape, **sampling) -> Engine:
    k, width, nodes = shape
    return Engine(make_profile(target, None, k=k, proposer=ProposerSpec(kind="ngram", ngram_min=1, ngram_max=3),
                               speculation=dict(tree_width=width, tree_nodes=nodes), **sampling))


def jobs(engine: Engine, count: int, sampled: bool = False) -> list:
    """(ids, settings) of `count` branch_prompts, each with its own max_tokens and seed (and,
    sampled, its own warp settings)."""
    return [(ids, replace(engine.profile.sampling, max_tokens=6 + 5 * (i % 4), seed=100 + i,
                          **(SAMPLED[i % len(SAMPLED)] if sampled else {})))
            for i, ids in enumerate(branch_prompts(engine, count, seed=count))]


def check(engine: Engine, work: list) -> list[tuple]:
    """Every prompt's tokens, fates and every round's drafts at B = 1, 3, 7 are the lookup tree
    round's alone; returns those."""
    assert isinstance(engine.decoder(replace(engine.profile, sampling=work[0][1])).round, TreeRound)
    reference = alone_rounds(engine, work)
    assert sum(f.count(Fate.ACCEPTED) for _, f, _ in reference) > 10  # the tries' drafts are taken
    assert any(not drafts for _, _, rounds in reference for drafts in rounds)  # and some found nothing
    for batch in (1, 3, 7):
        decoder = engine.batch_decoder(batch)
        assert isinstance(decoder.round, BatchTreeRound) and isinstance(decoder.round.drafter, BatchLookupTree)
        assert not decoder.pipelined  # the next round's tries are read from this round's tokens
        assert batched_rounds(engine, batch, work) == reference, f"batch {batch}"
    return reference


def branched(engine: Engine, work: list) -> bool:
    """Whether some round's trie has a node of two children (the lookups branch)."""
    decoder = engine.decoder(replace(engine.profile, sampling=work[0][1]))
    lookup = decoder.lookup
    for ids, _ in work:
        lookup.start(ids)
        tree = lookup.lookup(engine.profile.speculation.k)
        if len(set(tree.parents)) < len(tree.parents):
            return True
    return False


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "k%d-w%d-n%d" % s)
def test_greedy_lookup_tree_rows_equal_each_prompt_alone(bigram, shape):
    engine = lookup_tree_engine(bigram, shape)
    work = jobs(engine, 9)
    assert branched(engine, work)
    check(engine, work)


@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_sampled_lookup_tree_rows_equal_each_prompt_alone(bigram, coupling):
    """Each row's own warp settings (a greedy row among them), max_tokens and seed, sharing the batch."""
    engine = lookup_tree_engine(bigram, SHAPES[0], temperature=1.0, coupling=coupling)
    check(engine, jobs(engine, 8, sampled=True))


def test_gumbel_lookup_tree_rows_give_target_only_text(bigram):
    """Seed stability: with Gumbel coupling a prompt's seed gives target-only's text at every B."""
    engine = lookup_tree_engine(bigram, SHAPES[1], temperature=0.9, coupling="gumbel")
    work = jobs(engine, 6)
    plain = Engine(target_only(engine.profile))
    reference = [finish(plain.decoder(replace(plain.profile, sampling=spec)), ids).token_ids for ids, spec in work]
    for batch in (3, 7):
        assert [ids for ids, _, _ in batched_rounds(engine, batch, work)] == reference
