"""Token trees at batch on the kernels: core/round/batch_tree.py, batch_head_tree.py and
batch_lookup_tree.py over the Triton step and round kernels.

The draft model's trees: on the interpreter's kernel tables rejection-coupled rows (drawn
children, the recursive walk kernel over [B, ...]) equal each prompt alone. An EAGLE-3 head's
trees: on the interpreter's kernel tables greedy rows (tokens and every round's pool of
candidates) equal each prompt alone; on a GPU bfloat16 greedy rows at B = 7, 16 equal batch 1.
Prompt lookup's trees: on the interpreter's kernel tables sampled rows (the sibling walk kernel
over [B, ...]) equal each prompt alone. On a GPU, for each of the three drafters, float32 rows at
B = 1, 7 equal each prompt alone (greedy, Gumbel, rejection), and the captured round equals the
round run eagerly.
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)

from dataclasses import replace

import pytest
import torch

from batch_helpers import alone_rounds, batched_rounds, branch_prompts
from batch_kernel_helpers import (TREE_SAMPLINGS, HeadTables, KernelTables, accepted_lookups, alone, assert_rows_equal,
                                  batched, captured_against_eager, cuda_eagle_engine, fated, jobs)
from decode_helpers import make_profile, on_cuda
from gpu_helpers import kernels
from specgen.core.engine import Engine
from specgen.core.settings import ProposerSpec


# -- the draft model's token trees at batch (core/round/batch_tree.py) ------------------------------


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
# rejection with drawn children alone (the recursive walk, draws per row): each case takes the
# interpreter near three minutes; the torch tests (tests/core/round/test_batch_tree.py) cover the others
@pytest.mark.parametrize("sampling", [dict(temperature=0.9, coupling="rejection")], ids=["rejection"])
def test_batch_tree_rows_on_the_kernel_tables_equal_each_prompt_alone(pair, sampling):
    """Each row's tree on the kernels a GPU captures: the step kernels over [B, w] and [B, n + 1]
    tree rows (attention over each row's tails), the top-w kernels, the tree's construction over
    every row at once, the walk kernels over [B, ...], the compaction kernel over [B, k] slots:
    each row's tokens and drafts are the tree round's on the same kernels."""
    tables = kernels(attention=True, linear=True, rope=True, warp=True, norm=True, step_io=True)
    profile = make_profile(*pair, k=3, speculation=dict(tree_width=2, tree_nodes=5), **sampling)
    engine = Engine(profile, backend=KernelTables(tables))
    work = jobs(engine.profile, 3, seed=1)
    reference = [(ids, drafts) for ids, _, drafts in alone_rounds(engine, work)]
    assert [(ids, drafts) for ids, _, drafts in batched_rounds(engine, 2, work)] == reference


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
def test_batch_lookup_tree_rows_on_the_kernel_tables_equal_each_prompt_alone(bigram):
    """Prompt lookup's tries at batch on the kernels a GPU captures: the target's [B, n + 1] tree
    step over each row's staged trie, the sibling walk kernel over [B, ...] for sampled rows: each
    row's tokens, fates and drafts are the lookup tree round's on the same kernels."""
    tables = kernels(attention=True, linear=True, rope=True, warp=True, norm=True, step_io=True)
    profile = make_profile(bigram, None, k=3, proposer=ProposerSpec(kind="ngram"),
                           speculation=dict(tree_width=2, tree_nodes=5), temperature=0.9, coupling="rejection")
    engine = Engine(profile, backend=KernelTables(tables))
    work = tree_jobs(engine, "lookup", 3, seed=1)
    reference = alone_rounds(engine, work)
    assert accepted_lookups(reference) > 0
    assert batched_rounds(engine, 2, work) == reference


def cuda_tree_engine(target, draft, k: int = 4, width: int = 2, nodes: int = 6, dtype: str = "bfloat16",
                     speculation: dict | None = None, **sampling) -> Engine:
    """speculation: more of the profile's fields (draft_sampling) beside the tree's shape."""
    profile = make_profile(target, draft, k=k, backend="cuda",
                           speculation=dict(tree_width=width, tree_nodes=nodes) | (speculation or {}),
                           **({"max_tokens": 32} | sampling))
    profile = replace(profile, target=replace(profile.target, dtype=dtype), draft=replace(profile.draft, dtype=dtype))
    engine = Engine(profile)
    assert engine.backend.name == "cuda"
    return engine


TREE_DRAFTERS = pytest.mark.parametrize("drafter", ["draft", "head", "lookup"])


def float32_tree_engine(request, drafter: str, **sampling) -> Engine:
    """float32 trees (k 4, width 2, 6 nodes) on the owned kernels, drafted by the draft model,
    (drafter "head") an EAGLE-3 head on the head's kernels or (drafter "lookup") prompt lookup
    over a bigram target's text (core/round/batch_lookup_tree.py)."""
    pair = request.getfixturevalue("pair")
    if drafter == "head":
        return cuda_head_tree_engine(pair[0], request.getfixturevalue("head"), **sampling)
    if drafter == "lookup":
        return cuda_lookup_tree_engine(request.getfixturevalue("bigram"), **sampling)
    return cuda_tree_engine(*pair, dtype="float32", **sampling)


def cuda_lookup_tree_engine(target, k: int = 4, width: int = 2, nodes: int = 6, dtype: str = "float32",
                            **sampling) -> Engine:
    profile = make_profile(target, None, k=k, backend="cuda", proposer=ProposerSpec(kind="ngram"),
                           speculation=dict(tree_width=width, tree_nodes=nodes), **({"max_tokens": 32} | sampling))
    engine = Engine(replace(profile, target=replace(profile.target, dtype=dtype)))
    assert engine.backend.name == "cuda"
    return engine


def tree_jobs(engine: Engine, drafter: str, count: int, seed: int) -> list:
    """jobs(), or for prompt lookup prompts whose lookups branch (batch_helpers.branch_prompts)."""
    if drafter != "lookup":
        return jobs(engine.profile, count, seed=seed)
    return [(ids, replace(engine.profile.sampling, max_tokens=4 + 3 * (i % 5), seed=100 + i))
            for i, ids in enumerate(branch_prompts(engine, count, seed=seed))]


@on_cuda
@TREE_SAMPLINGS
@TREE_DRAFTERS
@pytest.mark.parametrize("batch", [1, 7])
def test_tree_rows_equal_each_prompt_alone_on_cuda(request, drafter, sampling, batch):
    """24 prompts of their own lengths and max_tokens, float32 trees from the draft model or a
    head or prompt lookup, each prompt's seed: every row's tokens at B = 1 and 7 are the
    prompt's alone (the captured tree round)."""
    engine = float32_tree_engine(request, drafter, **sampling)
    work = tree_jobs(engine, drafter, 24, seed=batch)
    reference = alone(engine, work)
    got = batched(engine, batch, work)
    assert_rows_equal(got, reference, "the prompt alone")


@on_cuda
@TREE_SAMPLINGS
@TREE_DRAFTERS
def test_captured_batch_tree_round_equals_the_round_run_eagerly(request, drafter, sampling):
    """The batch tree round (the draft model's, a head's or prompt lookup's) replayed as CUDA
    graphs (re-captured when the long max_tokens below grows the caches, a head's among them,
    behind a round in flight) or run as it is: the same tokens and fates."""
    engine = float32_tree_engine(request, drafter, **sampling)
    captured, eager = captured_against_eager(engine, tree_jobs(engine, drafter, 20, seed=3))
    assert captured == eager


@on_cuda
@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_argmax_tree_rows_equal_each_prompt_alone_on_cuda(request, coupling):
    """draft_sampling = argmax: every row's top-w children, sampled rows walked as siblings
    (rejection) or following the target's race (Gumbel); float32 rows at B = 7 equal each prompt
    alone, and the captured round equals it run eagerly."""
    engine = float32_tree_engine(request, "draft", temperature=0.8, top_k=20, coupling=coupling,
                                 speculation=dict(draft_sampling="argmax"))
    work = tree_jobs(engine, "draft", 16, seed=5)
    assert_rows_equal(batched(engine, 7, work), alone(engine, work), "the prompt alone")
    captured, eager = captured_against_eager(engine, tree_jobs(engine, "draft", 20, seed=3))
    assert captured == eager


# -- an EAGLE-3 head's token trees at batch (core/round/batch_head_tree.py) ---------------------------


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
def test_batch_head_tree_rows_on_the_kernel_tables_equal_each_prompt_alone(pair, head):
    """Each row's head tree on the kernels a GPU captures: the head's batch table over [B, k + 1]
    extend rows and [B, w] tree rows (attention over each row's tails in its own cache row), the
    target's [B, n + 1] tree step, the tree kernels over every row at once: each row's tokens and
    every round's pool of candidates (every level's children, its drafts among them) are the head
    tree round's on the same kernels."""
    from batch_helpers import alone_probes, batched_probes

    tables = kernels(attention=True, linear=True, rope=True, warp=True, norm=True, step_io=True, head=True)
    profile = make_profile(pair[0], None, k=3, proposer=ProposerSpec(kind="eagle", head=str(head)),
                           speculation=dict(tree_width=2, tree_nodes=5))
    engine = Engine(profile, backend=HeadTables(tables))
    assert engine.describe()["heads"] == {"eagle": "kernels"}
    work = jobs(engine.profile, 3, seed=1)
    pools = alone_probes(engine, work, lambda rnd: rnd.tree.tokens.tolist())
    assert batched_probes(engine, 2, work, lambda rnd, b: rnd.trees.trees[b].tokens.tolist()) == pools


def cuda_head_tree_engine(target, head, k: int = 4, width: int = 2, nodes: int = 6, dtype: str = "float32",
                          **sampling) -> Engine:
    return cuda_eagle_engine(target, head, k, dtype, speculation=dict(tree_width=width, tree_nodes=nodes), **sampling)


@on_cuda
@pytest.mark.parametrize("batch", [7, 16])
def test_bf16_greedy_head_tree_rows_equal_batch_one_on_cuda(pair, head, batch):
    """bfloat16 head trees (k 4, width 3, 8 nodes): every row's tokens and fates at B = 7 and 16
    are batch 1's."""
    engine = cuda_head_tree_engine(pair[0], head, width=3, nodes=8, dtype="bfloat16")
    work = jobs(engine.profile, 32, seed=batch)
    one = fated(engine, 1, work)
    got = fated(engine, batch, work)
    assert_rows_equal(got, one, "batch 1")
