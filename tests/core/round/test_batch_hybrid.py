"""core/round/batch_hybrid.py: the hybrid proposer drafting every row of a batch, on tiny fp32 models.

Batch invariance with hybrid: each prompt's tokens, fates and every round's drafts at B = 1, 3, 7
equal decoding that prompt alone with --proposer hybrid (its turns: host rounds where the lookup
matches, model rounds else), with the draft model and with an EAGLE-3 head (hybrid_with). The
target is a bigram model (tiny_models.bigram_target) and most prompts hold the chain it writes
after them (batch_helpers.chain_prompts), so rows take both turns, and in one batch some rows take
the lookup's drafts while others take the model's; every third prompt is random. The draft model is
a noisy copy of the original target (its attention matters: a cache that missed the lookup's tokens
would change its drafts). Ragged max_tokens, more prompts than rows (refills restart a row's
proposer and its model's cache row) and, at B = 7, rows that run masked. Greedy exactly; Gumbel
coupling with each prompt's seed the same sampled text; rejection coupling the same tokens (each
row's generator draws, every round, the noise rows of the model's steps and the target's and the
uniforms, as alone). Hybrid's trees too (core/round/batch_hybrid_tree.py: each row the lookup's
trie or the model's tree, its own turn), greedy, Gumbel and rejection; merged trees at batch are
refused in one line.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from batch_helpers import alone_rounds, batched_rounds, chain_prompts
from decode_helpers import finish, make_profile
from specgen.core.engine import Engine, batch_refusal
from specgen.core.errors import UsageError
from specgen.core.events import Fate
from specgen.core.round.batch_hybrid import BatchHybrid
from specgen.core.round.batch_hybrid_tree import BatchHybridTree
from specgen.core.settings import ProposerSpec
from tiny_models import bigram_target, build_pair, head_for

SAMPLED = [dict(temperature=0.7, top_k=20), dict(top_p=0.9), dict(), dict(temperature=0.0), dict(min_p=0.1)]
MODELS = pytest.mark.parametrize("model", ["draft", "eagle"])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(bigram target, a noisy draft of the original target, an EAGLE-3 head on the bigram target)."""
    root = tmp_path_factory.mktemp("batch-hybrid")
    target, draft = build_pair(root, noisy=0.1)
    bigram = bigram_target(target, root / "bigram")
    return bigram, draft, head_for(bigram, root / "head")


def hybrid_engine(models, model: str, k: int = 3, adaptive_k: bool = False, draft_p_min: float = 0.0,
                  speculation: dict | None = None, **sampling) -> Engine:
    bigram, draft, head = models
    proposer = ProposerSpec(kind="hybrid", hybrid_with=model, head=str(head) if model == "eagle" else "",
                            adaptive_k=adaptive_k, draft_p_min=draft_p_min)
    return Engine(make_profile(bigram, draft if model == "draft" else None, k=k, proposer=proposer,
                               speculation=speculation, **sampling))


def jobs(engine: Engine, count: int, sampled: bool = False) -> list:
    """(ids, settings) of `count` chain_prompts, each with its own max_tokens and seed (and, sampled,
    its own warp settings)."""
    return [(ids, replace(engine.profile.sampling, max_tokens=6 + 5 * (i % 4), seed=100 + i,
                          **(SAMPLED[i % len(SAMPLED)] if sampled else {})))
            for i, ids in enumerate(chain_prompts(engine, count, seed=count))]


def turns(engine: Engine, work: list) -> dict:
    """The rounds each proposer drafted over the prompts decoded alone."""
    total = {"ngram": 0, "draft": 0}
    for ids, spec in work:
        decoder = engine.decoder(replace(engine.profile, sampling=spec))
        finish(decoder, ids)
        total = {kind: total[kind] + decoder.proposer_rounds[kind] for kind in total}
    return total


def check(engine: Engine, work: list, part=BatchHybrid) -> list:
    """Both turns are taken alone, and every prompt's tokens, fates and drafts at B = 1, 3, 7 are
    its own alone, and so are its statistics of whose nodes each tree's path took (returned)."""
    taken = turns(engine, work)
    assert taken["ngram"] > 5 and taken["draft"] > 5, taken
    reference = alone_rounds(engine, work)
    assert sum(fates.count(Fate.ACCEPTED) for _, fates, _ in reference) > 0
    sources = [source_stats(finish(engine.decoder(replace(engine.profile, sampling=spec)), ids).stats)
               for ids, spec in work]
    for batch in (1, 3, 7):
        decoder = engine.batch_decoder(batch)
        assert isinstance(decoder.round.drafter, part) and not decoder.pipelined
        finished = []
        assert batched_rounds(engine, batch, work, finished) == reference, f"batch {batch}"
        assert [source_stats(f.stats) for f in finished] == sources, f"batch {batch}"
    if part is BatchHybridTree:  # tree rounds recorded
        assert sum(s[0] for s in sources) > 0, sources
    return sources


def source_stats(stats) -> tuple:
    """Whose nodes a hybrid tree round's path took (core/stats.py; zeros for chains)."""
    return (stats.source_rounds, stats.merged_rounds, stats.lookup_paths, stats.model_paths, stats.lookup_accepted,
            stats.model_accepted, stats.lookup_at)


@MODELS
def test_greedy_hybrid_rows_equal_each_prompt_alone(models, model):
    engine = hybrid_engine(models, model, k=4)
    check(engine, jobs(engine, 9))


@MODELS
@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_sampled_hybrid_rows_equal_each_prompt_alone(models, model, coupling):
    """Each row's own warp settings (a greedy row among them), max_tokens and seed, sharing the batch."""
    engine = hybrid_engine(models, model, k=3, temperature=1.0, coupling=coupling)
    check(engine, jobs(engine, 8, sampled=True))


@MODELS
def test_argmax_and_p_min_hybrid_rows_equal_each_prompt_alone(models, model):
    """draft_sampling = argmax and draft_p_min: the model's rows draft their argmax, each cut at its
    own first unsure step, the lookup's rows uncut (their q one-hot either way); rejection coupling."""
    engine = hybrid_engine(models, model, k=3, draft_p_min=0.3, speculation=dict(draft_sampling="argmax"),
                           temperature=1.0)
    check(engine, jobs(engine, 8, sampled=True))


@MODELS
def test_adaptive_k_hybrid_rows_equal_each_prompt_alone(models, model):
    """adaptive_k: each row's budget its own from its rounds before (the lookup's and the model's),
    as alone; rejection coupling."""
    engine = hybrid_engine(models, model, k=5, adaptive_k=True, temperature=1.0, coupling="rejection")
    check(engine, jobs(engine, 8))


TREES = dict(tree_width=2, tree_nodes=6)


@MODELS
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0, coupling="gumbel"),
                                      dict(temperature=1.0, coupling="rejection"),
                                      dict(temperature=1.0, coupling="rejection", repetition_penalty=1.3,
                                           presence_penalty=0.2)], ids=["greedy", "gumbel", "rejection", "penalties"])
def test_hybrid_tree_rows_equal_each_prompt_alone(models, model, sampling):
    """hybrid's trees (hybrid_merge never): each row the lookup's trie where it matches, else the
    model's tree, its own turn in each round; each prompt's tokens and drafts as alone (sampled:
    each row's own warp settings, a greedy row among them; penalties: each tree row counting the
    drafts on its path, the trie's or the model's)."""
    engine = hybrid_engine(models, model, k=3, speculation=TREES, **sampling)
    sources = check(engine, jobs(engine, 8, sampled=bool(sampling)), part=BatchHybridTree)
    if "repetition_penalty" not in sampling:  # paths through the lookup's nodes (penalties steer off them)
        assert sum(s[2] for s in sources) > 0, sources


def test_merged_hybrid_trees_and_mtp_at_batch_are_refused_in_one_line(models):
    bigram, draft, _ = models
    trees = make_profile(bigram, draft, k=3, proposer=ProposerSpec(kind="hybrid"),
                         speculation=dict(TREES, hybrid_merge="auto"))
    assert batch_refusal(trees) == ("take hybrid's trees with hybrid_merge = never only (each row the lookup's "
                                    "trie or the model's tree), not auto")
    with pytest.raises(UsageError) as error:
        Engine(trees).batch_decoder(2)
    assert "\n" not in str(error.value) and str(error.value).startswith("batches (batch_size 2) take hybrid's trees")
    mtp = make_profile(bigram, None, k=3, proposer=ProposerSpec(kind="hybrid", hybrid_with="mtp"))
    assert batch_refusal(mtp) == ("are drafted by the draft model, an EAGLE-3 head (eagle), prompt lookup (ngram) "
                                  "or hybrid only, not by the hybrid proposer with mtp (hybrid_with)")
