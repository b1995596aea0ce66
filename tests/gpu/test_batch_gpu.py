"""Batches on the kernels: core/round/batch_round.py over the Triton step and round kernels.

On the CPU (the Triton interpreter, uncaptured): the kernel tables a GPU captures, greedy and
Gumbel, each prompt's tokens at B = 2 equal to the chain round's alone on the same kernels. On a
GPU (skipped without CUDA): greedy bfloat16 through the CUDA backend, every prompt's tokens at
B = 1, 7 and 16 equal to decoding it alone; Gumbel sampling likewise; and the captured batch round
equal to the same round run eagerly. The same with an EAGLE-3 head drafting every row
(core/round/batch_head.py): bfloat16 greedy rows at B = 7, 16 equal to batch 1 and to each prompt
alone, and the captured round equal to the round run eagerly. And with prompt lookup drafting
every row (core/round/batch_lookup.py, a bigram target whose text the prompts hold): on the
interpreter's kernel tables greedy and rejection-coupled rows (one-hot q through the verification
kernel) equal each prompt alone; on a GPU bfloat16 greedy rows at B = 7, 16 equal batch 1 and each
prompt alone, and the captured round equals the round run eagerly. And rows with their own
penalties and min_tokens (core/round/batch_rows.py): on the interpreter's kernel tables (the warp
kernel over every row's counts and masks) Gumbel and greedy rows equal each prompt alone; on a GPU
float32 rows at B = 1, 7 equal each prompt alone (greedy, Gumbel, rejection), and the captured
round equals the round run eagerly. Rows drafting their argmax, each cut at draft_p_min, on a GPU
float32 at B = 7 equal each prompt alone, captured equal to eager. Token trees at batch: test_batch_tree_gpu.py; the hybrid
proposer: test_batch_hybrid_gpu.py.
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)

from dataclasses import replace

import pytest
import torch

from batch_helpers import alone_rounds, batched_rounds
from batch_kernel_helpers import (TREE_SAMPLINGS, HeadTables, KernelTables, accepted_lookups, alone, assert_rows_equal,
                                  batched, captured_against_eager, cuda_eagle_engine, fated, jobs, lookup_jobs)
from decode_helpers import cuda_engine, finish, make_profile, on_cuda
from gpu_helpers import kernels
from specgen.core.backend import EagerBatch
from specgen.core.engine import Engine
from specgen.core.settings import ProposerSpec


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.9, top_k=40, coupling="gumbel")],
                         ids=["greedy", "gumbel"])
def test_batch_rows_on_the_kernel_tables_equal_each_prompt_alone(pair, sampling):
    """The step kernels (linear, attention with rope, norms, inputs) over a batch's caches, the
    round's kernels over its rows (warp, verification with k draft rows per row, the rows' commit
    and noise): each row's tokens are the chain round's on the same kernels."""
    tables = kernels(attention=True, linear=True, rope=True, warp=True, norm=True, step_io=True)
    engine = Engine(make_profile(*pair, k=3, **sampling), backend=KernelTables(tables))
    assert engine.target_runner.ops.kernels.linear
    work = jobs(engine.profile, 2, seed=1)
    reference = alone(engine, work)
    assert batched(engine, 2, work) == reference


def logprob_runs(engine: Engine, work: list, batch: int | None = None, eager: bool = False) -> list[tuple]:
    """Each prompt's (tokens, logprob entries): alone (batch None) or through `batch` rows."""
    if batch is None:
        return [(f.token_ids, f.logprobs) for f in (finish(engine.decoder(replace(engine.profile, sampling=spec)), ids)
                                                   for ids, spec in work)]
    decoder = engine.batch_decoder(batch)
    if eager:
        decoder.program = EagerBatch(decoder.round)
    return [(f.token_ids, f.logprobs) for _, f in decoder.run(work)]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.9, top_k=40, coupling="gumbel")],
                         ids=["greedy", "gumbel"])
def test_batch_logprobs_on_the_kernel_tables_equal_each_prompt_alone(pair, sampling):
    """On the kernels a GPU captures, a row's target logits are its own alone bit for bit: so are
    its logprobs (core/round/batch_logprobs.py), value for value, top-3 alternatives and all."""
    tables = kernels(attention=True, linear=True, rope=True, warp=True, norm=True, step_io=True)
    engine = Engine(make_profile(*pair, k=3, logprobs=3, **sampling), backend=KernelTables(tables))
    work = jobs(engine.profile, 2, seed=1)
    reference = logprob_runs(engine, work)
    assert all(len(logprobs) == len(ids) for ids, logprobs in reference)
    assert logprob_runs(engine, work, 2) == reference


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
def test_eagle_batch_rows_on_the_kernel_tables_equal_each_prompt_alone(pair, head):
    """An EAGLE-3 head drafting every row through the kernel table (its batch attention over B
    cache rows, its linears over B x (k + 1) rows): each row's tokens, fates and every round's
    drafts are the chain round's on the same kernels."""
    tables = kernels(attention=True, linear=True, rope=True, warp=True, norm=True, step_io=True, head=True)
    profile = make_profile(pair[0], None, k=3, proposer=ProposerSpec(kind="eagle", head=str(head)))
    engine = Engine(profile, backend=HeadTables(tables))
    assert engine.describe()["heads"] == {"eagle": "kernels"}
    work = jobs(engine.profile, 3, seed=1)
    assert batched_rounds(engine, 2, work) == alone_rounds(engine, work)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.9, coupling="rejection")], ids=["greedy", "rejection"])
def test_lookup_batch_rows_on_the_kernel_tables_equal_each_prompt_alone(bigram, sampling):
    """Prompt lookup drafting every row, on the step and round kernels: the verification kernel
    with one-hot q rows (zero past each row's count) gives each row's tokens, fates and drafts as
    the chain round's kernel gives them with q one-hot (no q)."""
    tables = kernels(attention=True, linear=True, rope=True, warp=True, norm=True, step_io=True)
    profile = make_profile(bigram, None, k=3, proposer=ProposerSpec(kind="ngram"), **sampling)
    engine = Engine(profile, backend=KernelTables(tables))
    work = lookup_jobs(engine, 3, seed=1)
    reference = alone_rounds(engine, work)
    assert accepted_lookups(reference) > 0
    assert batched_rounds(engine, 2, work) == reference


# -- on a GPU ------------------------------------------------------------------------------------


@on_cuda
@pytest.mark.parametrize("batch", [1, 7, 16])
def test_bf16_greedy_rows_equal_each_prompt_alone_on_cuda(pair, batch):
    """64 prompts of their own lengths and max_tokens, bfloat16 on the owned kernels: every row's
    tokens at B = 1, 7 and 16 are the prompt's alone (the captured chain round)."""
    engine = cuda_engine(*pair)
    work = jobs(engine.profile, 64, seed=batch)
    reference = alone(engine, work)
    got = batched(engine, batch, work)
    assert_rows_equal(got, reference, "the prompt alone")


@on_cuda
@pytest.mark.parametrize("batch", [7, 16])
def test_bf16_gumbel_rows_equal_each_prompt_alone_on_cuda(pair, batch):
    """Gumbel coupling with each prompt's seed (every prompt the same warp settings, so the batch's
    warp runs the filters each row runs alone): the same sampled tokens at any batch size."""
    engine = cuda_engine(*pair, temperature=0.8, top_p=0.95, coupling="gumbel")
    work = jobs(engine.profile, 32, seed=batch)
    assert batched(engine, batch, work) == alone(engine, work)


@on_cuda
@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_argmax_and_p_min_rows_equal_each_prompt_alone_on_cuda(pair, coupling):
    """draft_sampling = argmax with draft_p_min (core/round/batch_round.py's BatchDraftPick): each
    row's tokens as alone at B = 7, and the captured round equal to the round run eagerly."""
    engine = cuda_engine(*pair, dtype="float32", temperature=0.8, top_k=20, coupling=coupling,
                         proposer=ProposerSpec(draft_p_min=0.3), speculation=dict(draft_sampling="argmax"))
    work = jobs(engine.profile, 16, seed=5)
    assert batched(engine, 7, work) == alone(engine, work)
    captured, eager = captured_against_eager(engine, work, fates=False, pipelined=True)
    assert captured == eager


@on_cuda
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.8, top_k=20, coupling="gumbel"),
                                      dict(temperature=0.8, top_p=0.9, coupling="rejection")],
                         ids=["greedy", "gumbel", "rejection"])
def test_captured_batch_round_equals_the_batch_round_run_eagerly(pair, sampling):
    """The same BatchRound, buffers, kernels and draws: replayed as CUDA graphs (one per warp
    flags, re-captured when the caches grow: the long max_tokens below grows them, a refill doing so
    while a round is in flight) or run as it is."""
    engine = cuda_engine(*pair, dtype="float32", **sampling)
    # two rounds in flight: the caches grow and rounds re-capture behind one
    captured, eager = captured_against_eager(engine, jobs(engine.profile, 20, seed=3), fates=False, pipelined=True)
    assert captured == eager


@on_cuda
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.8, top_k=20, coupling="gumbel"),
                                      dict(temperature=0.8, top_p=0.9, coupling="rejection", logprobs_mode="raw")],
                         ids=["greedy", "gumbel", "rejection-raw"])
def test_bf16_rows_logprobs_equal_each_prompt_alone_on_cuda(pair, sampling):
    """--logprobs 5 at batch: every row's tokens and logprob entries (values, alternatives) at B = 7
    are the prompt's alone, exactly, captured (two rounds in flight: each round's host buffer) and
    eager; rows without logprobs share the batch."""
    engine = cuda_engine(*pair, logprobs=5, **sampling)
    work = jobs(engine.profile, 24, seed=5)
    work[3] = (work[3][0], replace(work[3][1], logprobs=None))
    reference = logprob_runs(engine, work)
    assert engine.batch_decoder(7).pipelined
    assert logprob_runs(engine, work, 7) == reference
    assert logprob_runs(engine, work, 7, eager=True) == reference


# -- an EAGLE-3 head drafting every row, on a GPU ----------------------------------------------------


@on_cuda
@pytest.mark.parametrize("batch", [7, 16])
def test_bf16_greedy_eagle_rows_equal_batch_one_on_cuda(pair, head, batch):
    """32 prompts of their own lengths and max_tokens (refills prefill their rows of the head's
    cache), bfloat16 on the owned kernels and the head's: every row's tokens and fates at B = 7 and
    16 are batch 1's, and batch 1's the prompt's alone (the captured chain round with the head)."""
    engine = cuda_eagle_engine(pair[0], head)
    work = jobs(engine.profile, 32, seed=batch)
    one = fated(engine, 1, work)
    got = fated(engine, batch, work)
    assert_rows_equal(got, one, "batch 1")
    assert [ids for ids, _ in one] == alone(engine, work)


@on_cuda
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.8, top_k=20, coupling="gumbel"),
                                      dict(temperature=0.8, top_p=0.9, coupling="rejection")],
                         ids=["greedy", "gumbel", "rejection"])
def test_captured_eagle_batch_round_equals_the_round_run_eagerly(pair, head, sampling):
    """The batch round with the head, replayed as CUDA graphs (re-captured when the caches grow:
    the long max_tokens below grows them while a round is in flight) or run as it is: the same
    tokens and fates."""
    engine = cuda_eagle_engine(pair[0], head, dtype="float32", **sampling)
    captured, eager = captured_against_eager(engine, jobs(engine.profile, 20, seed=3), pipelined=True)
    assert captured == eager


# -- prompt lookup drafting every row, on a GPU ----------------------------------------------------


def cuda_lookup_engine(target, k: int = 4, dtype: str = "bfloat16", **sampling) -> Engine:
    profile = make_profile(target, None, k=k, backend="cuda", proposer=ProposerSpec(kind="ngram"),
                           **({"max_tokens": 32} | sampling))
    engine = Engine(replace(profile, target=replace(profile.target, dtype=dtype)))
    assert engine.backend.name == "cuda"
    return engine


@on_cuda
@pytest.mark.parametrize("batch", [7, 16])
def test_bf16_greedy_lookup_rows_equal_batch_one_on_cuda(bigram, batch):
    """32 prompts that hold the bigram target's text, of their own lengths and max_tokens (refills
    restart their rows' proposers), bfloat16 on the owned kernels: every row's tokens, fates and
    drafts at B = 7 and 16 are batch 1's, and batch 1's tokens the prompt's alone (the captured
    chain round with host drafts)."""
    engine = cuda_lookup_engine(bigram)
    work = lookup_jobs(engine, 32, seed=batch)
    one = batched_rounds(engine, 1, work)
    assert accepted_lookups(one) > 0
    got = batched_rounds(engine, batch, work)
    assert_rows_equal(got, one, "batch 1")
    assert [ids for ids, _, _ in one] == alone(engine, work)


@on_cuda
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.8, top_k=20, coupling="gumbel"),
                                      dict(temperature=0.8, top_p=0.9, coupling="rejection")],
                         ids=["greedy", "gumbel", "rejection"])
def test_captured_lookup_batch_round_equals_the_round_run_eagerly(bigram, sampling):
    """The batch round with prompt lookup, replayed as CUDA graphs (the staged drafts a static
    buffer the graph reads; re-captured when the long max_tokens below grows the caches) or run as
    it is: the same tokens and fates. One round in flight: the drafts come from the round before."""
    engine = cuda_lookup_engine(bigram, dtype="float32", **sampling)
    captured, eager = captured_against_eager(engine, lookup_jobs(engine, 20, seed=3), pipelined=False)
    assert accepted_lookups(captured) > 0
    assert captured == eager


# -- penalties and min_tokens per row (core/round/batch_rows.py) -------------------------------------

# each prompt's own penalties, min_tokens and stop ids (rows without any among them), cycled
PENALISED = [dict(repetition_penalty=1.3), dict(), dict(presence_penalty=1.0, frequency_penalty=0.5, min_tokens=3),
             dict(repetition_penalty=0.5, frequency_penalty=-1.0), dict(min_tokens=4, temperature=0.0)]


def penalised_jobs(profile, count: int, seed: int) -> list:
    """jobs() with PENALISED's settings, and a stop id of its prompt's (which min_tokens masks)."""
    return [(ids, replace(spec, stop_token_ids=(ids[0],), ignore_eos=False, **PENALISED[i % len(PENALISED)]))
            for i, (ids, spec) in enumerate(jobs(profile, count, seed=seed))]


def penalised_engine(pair, backend=None, dtype: str = "float32", **sampling) -> Engine:
    """A batch built with both parts (the profile's penalties and min_tokens), which its rows share."""
    if backend is not None:
        return Engine(make_profile(*pair, k=3, repetition_penalty=1.2, min_tokens=1, **sampling), backend=backend)
    return cuda_engine(*pair, dtype=dtype, repetition_penalty=1.2, min_tokens=1, **sampling)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
def test_penalised_batch_rows_on_the_kernel_tables_equal_each_prompt_alone(pair):
    """The warp kernel over every row's penalty counts and min_tokens mask ([B (k + 1), V] and a
    draft step's [B, V]), Gumbel-sampled and greedy rows: each row's tokens are the chain round's
    on the same kernels."""
    tables = kernels(attention=True, linear=True, rope=True, warp=True, norm=True, step_io=True)
    engine = penalised_engine(pair, KernelTables(tables), temperature=0.9, coupling="gumbel")
    work = penalised_jobs(engine.profile, 3, seed=2)
    assert batched(engine, 2, work) == alone(engine, work)


@on_cuda
@TREE_SAMPLINGS
@pytest.mark.parametrize("batch", [1, 7])
def test_penalised_rows_equal_each_prompt_alone_on_cuda(pair, sampling, batch):
    """24 prompts, float32, each its own penalties, min_tokens and stop id (and rows with none):
    every row's tokens at B = 1 and 7 are the prompt's alone (the captured chain round)."""
    engine = penalised_engine(pair, dtype="float32", **sampling)
    work = penalised_jobs(engine.profile, 24, seed=batch)
    reference = alone(engine, work)
    got = batched(engine, batch, work)
    same = sum(a == b for a, b in zip(got, reference))
    assert same == len(work), f"{len(work) - same} of {len(work)} rows differ from the prompt alone"


@on_cuda
@TREE_SAMPLINGS
def test_captured_penalised_batch_round_equals_the_round_run_eagerly(pair, sampling):
    """The batch round with both parts replayed as CUDA graphs (the counts committed on the device
    and each refill's prompt ids and stop ids staged, re-captured when the long max_tokens below
    grows the caches) or run as it is: the same tokens."""
    engine = penalised_engine(pair, dtype="float32", **sampling)
    captured, eager = captured_against_eager(engine, penalised_jobs(engine.profile, 20, seed=3), fates=False)
    assert captured == eager
