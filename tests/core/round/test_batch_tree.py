"""core/round/batch_tree.py through core/batch_decode.py: token trees at batch, each row its own tree.

Each prompt's tokens at B = 1, 3, 7 (prompts of different lengths, max_tokens and sampling
settings in one batch, more prompts than rows so that finished rows are refilled, more rows than
prompts so that some run masked) equal decoding that prompt alone with the tree round of the same
(k, width, nodes): greedy exactly, with every round's drafts; Gumbel coupling with the prompt's
seed the same sampled text; rejection coupling (drawn children, the recursive walk; a greedy row
among them walks greedily) the same tokens too, each row's numbers drawn by its own generator in
the order and shapes the tree round draws them. What batches do not take of trees (merged
hybrid trees) is a one-line error; a shape left auto runs as a chain; an EAGLE-3 head's trees are taken
(tests/core/round/test_batch_head_tree.py), and prompt lookup's
(tests/core/round/test_batch_lookup_tree.py).
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
import pytest

from dataclasses import replace

from batch_helpers import alone_rounds, batched_rounds
from decode_helpers import finish, make_profile, random_prompts
from specgen.core.engine import Engine, batch_refusal
from specgen.core.errors import UsageError
from specgen.core.events import Fate
from specgen.core.round import TreeRound
from specgen.core.round.batch_tree import BatchTreeRound
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair

SHAPES = [(3, 2, 5), (1, 3, 3), (4, 3, 9)]  # (k, width, nodes)
# Per-prompt settings sharing one batch (a greedy row among sampled ones included).
SETTINGS = [dict(temperature=0.0), dict(temperature=0.8, top_k=20), dict(top_p=0.9), dict(min_p=0.1), dict(),
            dict(temperature=1.3), dict(top_p=0.8, top_k=5)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("batch-trees"), noisy=0.1)


def tree_engine(pair, shape, **sampling) -> Engine:
    k, width, nodes = shape
    return Engine(make_profile(*pair, k=k, speculation=dict(tree_width=width, tree_nodes=nodes), **sampling))


def jobs(profile, count: int, sampled: bool) -> list:
    """(ids, settings) of `count` prompts of 1 to 12 ids, each with its own max_tokens and seed."""
    prompts = random_prompts(200, count, seed=count)
    specs = [replace(profile.sampling, max_tokens=6 + 4 * (i % 4), seed=100 + i,
                     **(SETTINGS[i % len(SETTINGS)] if sampled else {})) for i in range(count)]
    return list(zip(prompts, specs))


def check(engine: Engine, work: list) -> None:
    """Every prompt's tokens, every round's counted drafts, its fates (a drawn child accepted
    outside the tree, `taken`, a draft accepted, as alone) and what its trees bought over their
    chains (the rows' tree statistics: tree rounds, tokens against the chain's, each depth's
    branch wins) at B = 1, 3, 7 are the tree round's alone."""
    assert isinstance(engine.decoder(replace(engine.profile, sampling=work[0][1])).round, TreeRound)
    reference = alone_rounds(engine, work)
    assert sum(f.count(Fate.ACCEPTED) for _, f, _ in reference) > 0  # the trees' drafts are taken
    stats = [tree_stats(finish(engine.decoder(replace(engine.profile, sampling=spec)), ids).stats)
             for ids, spec in work]
    assert sum(s[0] for s in stats) > 0
    for batch in (1, 3, 7):
        finished = []
        got = batched_rounds(engine, batch, work, finished)
        assert isinstance(engine.batch_decoder(batch).round, BatchTreeRound)
        assert [tree_stats(f.stats) for f in finished] == stats, batch
        assert got == reference, batch


def tree_stats(stats) -> tuple:
    """What a run's trees bought (core/stats.py): tree rounds, their tokens and the chain's inside
    them, each depth's chain reach and branch wins."""
    return stats.tree_rounds, stats.tree_emitted, stats.chain_emitted, stats.chain_at, stats.branch_at


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "k%d-w%d-n%d" % s)
def test_greedy_tree_rows_equal_each_prompt_alone(pair, shape):
    """7 prompts: at B = 3 rows finish and are refilled; at B = 7 ragged max_tokens free rows that
    then run masked."""
    engine = tree_engine(pair, shape)
    check(engine, jobs(engine.profile, 7, sampled=False))


@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "k%d-w%d-n%d" % s)
def test_gumbel_tree_rows_equal_each_prompt_alone(pair, shape):
    """Each row's own temperature, top-k, top-p, min-p, max_tokens and seed; sampled rows draw
    their children with their noise rows, the greedy row takes its top-w."""
    engine = tree_engine(pair, shape, temperature=1.0, coupling="gumbel")
    work = jobs(engine.profile, 7, sampled=True)
    check(engine, work)


@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "k%d-w%d-n%d" % s)
def test_rejection_tree_rows_equal_each_prompt_alone(pair, shape):
    """Rejection coupling: sampled rows' drawn children and recursive walks from their own
    generators, a greedy row's greedy walk, in one batch: each row's tokens and drafts its own."""
    engine = tree_engine(pair, shape, temperature=1.0, coupling="rejection")
    work = jobs(engine.profile, 7, sampled=True)
    check(engine, work)


@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_argmax_tree_rows_equal_each_prompt_alone(pair, coupling):
    """draft_sampling = argmax: every row's children are its top-w, sampled rows walk them as
    siblings (rejection coupling) or follow the target's race (Gumbel), as alone."""
    k, width, nodes = SHAPES[0]
    engine = Engine(make_profile(*pair, k=k, temperature=1.0, coupling=coupling,
                                 speculation=dict(tree_width=width, tree_nodes=nodes, draft_sampling="argmax")))
    check(engine, jobs(engine.profile, 7, sampled=True))


def test_rejection_tree_rows_are_seed_stable(pair):
    """A row's tokens are its seed's wherever it sits: the same prompts in another order and
    batch size give each prompt the same tokens."""
    engine = tree_engine(pair, SHAPES[0], temperature=1.0, coupling="rejection")
    work = jobs(engine.profile, 6, sampled=True)
    first = [f.token_ids for _, f in engine.batch_decoder(3).run(work)]
    again = [f.token_ids for _, f in engine.batch_decoder(4).run(work[::-1])]
    assert again[::-1] == first
    assert len({tuple(ids) for ids in first}) == len(first)


def test_what_batches_do_not_take_of_trees_is_one_line(pair):
    """Merged hybrid trees (hybrid_merge auto or always) at batch."""
    profile = make_profile(*pair, k=3, proposer=ProposerSpec(kind="hybrid"),
                           speculation=dict(tree_width=2, tree_nodes=4, hybrid_merge="always"))
    assert "hybrid_merge = never only" in batch_refusal(profile) and "\n" not in batch_refusal(profile)
    with pytest.raises(UsageError) as error:
        Engine(profile).batch_decoder(2)
    assert "hybrid_merge = never only" in str(error.value) and "\n" not in str(error.value)


def test_a_tree_shape_left_auto_runs_as_a_chain(pair):
    """tree_nodes auto at a set batch size with nothing measured at batch (core/engine.py
    _set_batch): the batch's rows are chains of k, as one request's auto with nothing measured."""
    engine = Engine(make_profile(*pair, k=3, speculation=dict(tree_width=2, tree_nodes="auto")))
    assert batch_refusal(engine.profile) == ""
    decoder = engine.batch_decoder(2)
    assert not isinstance(decoder.round, BatchTreeRound) and decoder.round.k == 3


@pytest.mark.parametrize("kind", ["eagle", "ngram"])
def test_head_and_lookup_trees_are_taken_at_batch(pair, kind):
    """An EAGLE-3 head's trees and prompt lookup's at batch are decoded, each row its own
    (core/round/batch_head_tree.py, core/round/batch_lookup_tree.py)."""
    profile = make_profile(*pair, k=3, proposer=ProposerSpec(kind=kind), speculation=dict(tree_width=2,
                                                                                           tree_nodes=4))
    assert batch_refusal(profile) == ""
