"""The hybrid proposer at batch on the kernels (core/round/batch_hybrid.py: the draft model or a
head drafting every row, lookup's drafts where it matches): on the interpreter's kernel tables
rejection-coupled rows (the draft's follow step, one-hot q rows) equal each prompt alone; on a GPU
float32 rows at B = 1, 7 equal each prompt alone (greedy, Gumbel, rejection), and the captured
round equals the round run eagerly; hybrid's trees at B = 7 likewise (core/round/batch_hybrid_tree.py).
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)

from dataclasses import replace

import pytest
import torch

from batch_helpers import alone_rounds, batched_rounds
from batch_kernel_helpers import (TREE_SAMPLINGS, KernelTables, accepted_lookups, assert_rows_equal, captured_against_eager,
                                  fated, lookup_jobs)
from decode_helpers import finish, make_profile, on_cuda
from gpu_helpers import kernels
from specgen.core.engine import Engine
from specgen.core.settings import ProposerSpec


# -- the hybrid proposer drafting every row (core/round/batch_hybrid.py), on a GPU -------------------


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
def test_hybrid_batch_rows_on_the_kernel_tables_equal_each_prompt_alone(pair, bigram):
    """Hybrid with the draft model on the step and round kernels: the draft's batch steps, its
    follow step over [B, k + 2] (the host rows from the round's start, the others at the cache's
    scratch end), verification with one-hot q rows for the host rows: each row's tokens, fates and
    drafts are hybrid's alone on the same kernels."""
    tables = kernels(attention=True, linear=True, rope=True, warp=True, norm=True, step_io=True)
    profile = make_profile(bigram, pair[1], k=3, proposer=ProposerSpec(kind="hybrid"), temperature=0.9,
                           coupling="rejection")
    engine = Engine(profile, backend=KernelTables(tables))
    work = lookup_jobs(engine, 3, seed=1)
    reference = alone_rounds(engine, work)
    assert accepted_lookups(reference) > 0
    assert batched_rounds(engine, 2, work) == reference


def cuda_hybrid_engine(request, model: str, dtype: str = "float32", speculation: dict | None = None,
                       **sampling) -> Engine:
    """Hybrid chains (k 4) over the bigram target, with the noisy draft model or (model "eagle") an
    EAGLE-3 head where the lookup finds nothing; speculation: the profile's fields (trees)."""
    bigram, draft = request.getfixturevalue("bigram"), request.getfixturevalue("pair")[1]
    head = str(request.getfixturevalue("head")) if model == "eagle" else ""
    profile = make_profile(bigram, draft if model == "draft" else None, k=4, backend="cuda",
                           proposer=ProposerSpec(kind="hybrid", hybrid_with=model, head=head),
                           speculation=speculation, **({"max_tokens": 32} | sampling))
    profile = replace(profile, target=replace(profile.target, dtype=dtype))
    if profile.draft is not None:
        profile = replace(profile, draft=replace(profile.draft, dtype=dtype))
    engine = Engine(profile)
    assert engine.backend.name == "cuda"
    return engine


HYBRID_MODELS = pytest.mark.parametrize("model", ["draft", "eagle"])


@on_cuda
@TREE_SAMPLINGS
@HYBRID_MODELS
@pytest.mark.parametrize("batch", [1, 7])
def test_hybrid_rows_equal_each_prompt_alone_on_cuda(request, model, sampling, batch):
    """24 prompts that hold the bigram target's text (lookup's turns, then the model's), float32,
    each prompt's seed: every row's tokens and fates at B = 1 and 7 are the prompt's alone with
    hybrid (the captured chain round's host and model programs)."""
    engine = cuda_hybrid_engine(request, model, **sampling)
    work = lookup_jobs(engine, 24, seed=batch)
    reference = [(f.token_ids, f.fates) for f in (finish(engine.decoder(replace(engine.profile, sampling=spec)), ids)
                                                  for ids, spec in work)]
    assert accepted_lookups(reference) > 0
    got = fated(engine, batch, work)
    assert_rows_equal(got, reference, "the prompt alone")


@on_cuda
@TREE_SAMPLINGS
@HYBRID_MODELS
def test_captured_hybrid_batch_round_equals_the_round_run_eagerly(request, model, sampling):
    """The batch round with hybrid, replayed as CUDA graphs (the staged lookups a static buffer the
    graph reads, the model's follow step at the scratch end of the cache; re-captured when the long
    max_tokens below grows the caches) or run as it is: the same tokens and fates."""
    engine = cuda_hybrid_engine(request, model, **sampling)
    captured, eager = captured_against_eager(engine, lookup_jobs(engine, 20, seed=3), pipelined=False)
    assert captured == eager


@on_cuda
@TREE_SAMPLINGS
@HYBRID_MODELS
def test_hybrid_tree_rows_equal_each_prompt_alone_on_cuda(request, model, sampling):
    """Hybrid's trees (core/round/batch_hybrid_tree.py, w = 2, n = 6): each row the lookup's trie or
    the model's tree; float32 rows at B = 7 equal each prompt alone (tokens and fates), and the
    captured round equals it run eagerly."""
    engine = cuda_hybrid_engine(request, model, speculation=dict(tree_width=2, tree_nodes=6), **sampling)
    work = lookup_jobs(engine, 16, seed=7)
    reference = [(f.token_ids, f.fates) for f in (finish(engine.decoder(replace(engine.profile, sampling=spec)), ids)
                                                  for ids, spec in work)]
    assert fated(engine, 7, work) == reference
    captured, eager = captured_against_eager(engine, work, pipelined=False)
    assert captured == eager
