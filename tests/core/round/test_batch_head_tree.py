"""core/round/batch_head_tree.py through core/batch_decode.py: EAGLE-3 head trees at batch, each
row its own tree, on tiny fp32 models.

Each prompt's tokens and every round's counted drafts (the head's own work) at B = 1, 3, 7 equal
decoding that prompt alone with the head tree of the same (k, width, nodes): prompts of 1 to 12
ids with ragged max_tokens, more prompts than rows (refills, each prefilling its row of the head's
cache and its first extend's features) and, at B = 7, rows that run masked. Greedy exactly, over
the whole and a reduced draft vocabulary; Gumbel coupling with each prompt's seed the same sampled
text, which is target-only's; rejection coupling with drawn children (the recursive walk; a greedy
row among them walks greedily) the same tokens too, each row's numbers from its own generator.
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
import pytest

from dataclasses import replace

from batch_helpers import alone_probes, alone_rounds, batched_probes, batched_rounds
from decode_helpers import finish, make_profile, random_prompts
from specgen.core.engine import Engine
from specgen.core.round import TreeRound
from specgen.core.round.batch_head_tree import BatchHeadTree
from specgen.core.round.batch_tree import BatchTreeRound
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair, head_for

SHAPES = [(3, 2, 6), (4, 3, 8)]  # (k, width, nodes)
# Per-prompt settings sharing one batch at temperature 0.8 (a greedy row among sampled ones).
SAMPLED = [dict(), dict(temperature=0.0), dict(top_k=20), dict(top_p=0.9), dict(min_p=0.1), dict(temperature=1.3)]


@pytest.fixture(scope="module")
def headed(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch-head-trees")
    target, _ = build_pair(root, noisy=0.1)
    return target, head_for(target, root / "head"), head_for(target, root / "reduced", draft_vocab=150)


def head_tree_engine(target, head, shape, **sampling) -> Engine:
    k, width, nodes = shape
    return Engine(make_profile(target, None, k=k, proposer=ProposerSpec(kind="eagle", head=str(head)),
                               speculation=dict(tree_width=width, tree_nodes=nodes), **sampling))


def jobs(profile, count: int, sampled: bool = False) -> list:
    """(ids, settings) of `count` prompts of 1 to 12 ids, each with its own max_tokens and seed."""
    prompts = random_prompts(200, count, seed=count)
    return [(ids, replace(profile.sampling, max_tokens=5 + 4 * (i % 4), seed=100 + i,
                          **(SAMPLED[i % len(SAMPLED)] if sampled else {})))
            for i, ids in enumerate(prompts)]


def check(engine: Engine, work: list) -> list:
    """Every prompt's tokens, fates and every round's counted drafts at B = 1, 3, 7 are the head
    tree round's alone, and so is every round's whole pool of candidates (every level's children,
    on every frontier's parents' hidden states: a random head's drafts are rarely accepted, so its
    deeper levels would not show in the tokens). Returns the tokens."""
    assert isinstance(engine.decoder(replace(engine.profile, sampling=work[0][1])).round, TreeRound)
    reference = alone_rounds(engine, work)
    assert any(drafts for _, _, drafts in reference)  # the head drafted
    pools = alone_probes(engine, work, lambda rnd: rnd.tree.tokens.tolist())
    assert [ids for ids, _ in pools] == [ids for ids, _, _ in reference]
    for batch in (1, 3, 7):
        got = batched_rounds(engine, batch, work)
        rnd = engine.batch_decoder(batch).round
        assert isinstance(rnd, BatchTreeRound) and isinstance(rnd.drafter, BatchHeadTree)
        assert got == reference, f"batch {batch}"
        assert batched_probes(engine, batch, work, lambda rnd, b: rnd.trees.trees[b].tokens.tolist()) == pools
    return [ids for ids, _, _ in reference]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "k%d-w%d-n%d" % s)
def test_greedy_head_tree_rows_equal_each_prompt_alone(headed, shape):
    target, whole, _ = headed
    engine = head_tree_engine(target, whole, shape)
    check(engine, jobs(engine.profile, 7))


def test_greedy_head_tree_rows_over_a_reduced_vocabulary(headed):
    """The head's logits widened into the target's vocabulary (-inf outside its own) per row."""
    target, _, reduced = headed
    engine = head_tree_engine(target, reduced, SHAPES[0])
    check(engine, jobs(engine.profile, 7))


def test_gumbel_head_tree_rows_give_each_prompts_target_only_text(headed):
    """Each row's own warp settings, max_tokens and seed: its text is that prompt's alone with the
    head tree, and target-only's for its seed."""
    target, whole, _ = headed
    engine = head_tree_engine(target, whole, SHAPES[1], temperature=0.8, coupling="gumbel")
    work = jobs(engine.profile, 7, sampled=True)
    tokens = check(engine, work)
    plain = Engine(replace(engine.profile, proposer=ProposerSpec(kind="none"),
                           speculation=replace(engine.profile.speculation, tree_width=1, tree_nodes=0)))
    assert tokens == [finish(plain.decoder(replace(plain.profile, sampling=spec)), ids).token_ids for ids, spec in work]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "k%d-w%d-n%d" % s)
def test_rejection_head_tree_rows_equal_each_prompt_alone(headed, shape):
    """Rejection coupling: sampled rows' drawn children and recursive walks from their own
    generators, a greedy row's greedy walk, in one batch: each row's tokens, fates and drafts its
    own (a drawn child accepted outside the tree, `taken`, is a draft accepted, as alone)."""
    target, whole, _ = headed
    engine = head_tree_engine(target, whole, shape, temperature=0.8, coupling="rejection")
    work = jobs(engine.profile, 7, sampled=True)
    assert engine.decoder(replace(engine.profile, sampling=work[0][1])).round.tree.sampled  # drawn children
    check(engine, work)
