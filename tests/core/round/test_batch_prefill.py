"""core/round/batch_prefill.py: the prompts of rows started before one flush, prefilled together.

On tiny float32 models (the torch backend, the reference step): after one flush, each row's first
n slots of each model's batch cache are the runner's own alone prefill of that prefix (the draft
model's pair and target-only; prompts of 1 token, where the draft's prefix is empty, to more than a
chunk and past LONGEST, which keeps the alone path); more rows than a group split into groups; a
cache growth between a start and the flush; a row started alone is prefilled by the next flush,
and a flush with nothing pending steps nothing; rows whose prompts span chunks decode each
prompt's tokens alone.

The reference step is not row invariant on a CPU: torch's float32 matrix products of a 2-row
prefix and of a 512-row group differ in the last bits (layer 0's keys of a 3-token prompt, up to
6e-6 of values near 5), and so does SDPA over a chunk's 64 queries, so the slots here are compared
within float32 rounding and the tokens exactly. Bit for bit: tests/gpu/test_batch_prefill_gpu.py,
on the kernel tables a GPU captures (the Triton interpreter here) and on CUDA.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from decode_helpers import finish, make_profile
from specgen.core.engine import Engine
from specgen.core.round import batch_prefill
from specgen.core.round.batch_prefill import CHUNK, GROUP, LONGEST
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair

LENGTHS = [1, 2, 7, CHUNK, CHUNK + 1, 2 * CHUNK + 5, 3]  # one token: the draft model's prefix is empty


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("prefill"))  # an unrelated draft: two models' caches


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(200) for _ in range(n)] for n in lengths]


def engine_for(pair, k: int = 3) -> Engine:
    profile = make_profile(*pair, k=k, max_tokens=6)
    if not k:
        profile = replace(profile, proposer=ProposerSpec(kind="none"))
    return Engine(profile)


def prefixes(rnd, ids: list[int]) -> list[list[int]]:
    """What each model of the round holds of a prompt: the target all but the last id, the draft
    model all but the last two."""
    return [ids[:-1], ids[:-2]][:len(rnd.runners)]


def alone(rnd, which: int, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Model `which`'s runner's own prefill of ids: its first n slots' keys and values [2, L, g, n, d]."""
    runner = rnd.runners[which]
    runner.reset()
    with torch.inference_mode():
        runner.forward(torch.tensor(ids, dtype=torch.long), want_logits=False)
    (planes,) = runner.cache.planes.values()
    (positions,) = runner.cache.copies.values()
    return planes[:, :, 0, :, :len(ids)].clone(), positions[0, :len(ids)].clone()


def assert_rows_alone(rnd, rows: dict[int, list[int]]) -> None:
    """Each started row's slots, in each model's batch cache, its runner's alone prefill (within
    float32 rounding: the module's docstring), and its position the prefix's length."""
    for b, ids in rows.items():
        for which, prefix in enumerate(prefixes(rnd, ids)):
            (planes,) = rnd.caches[which].planes.values()
            want, _ = alone(rnd, which, prefix)
            got = planes[:, :, b, :, :len(prefix)]
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"row {b} ({len(ids)} ids), model {which}")
            assert rnd.positions[which, b].item() == len(prefix)


def start(rnd, rows: dict[int, list[int]], engine: Engine) -> None:
    for b, ids in rows.items():
        rnd.start(b, ids, engine.profile.sampling, seed=b)


@pytest.mark.parametrize("k", [3, 0], ids=["draft-model", "target-only"])
def test_rows_started_before_one_flush_hold_their_alone_prefill(pair, k):
    engine = engine_for(pair, k)
    rnd = engine.batch_decoder(len(LENGTHS)).round
    assert len(rnd.runners) == (2 if k else 1)
    rows = dict(enumerate(prompts(LENGTHS)))
    start(rnd, rows, engine)
    assert rnd.prefill.pending and rnd.prefill.steps == 0  # nothing stepped before the flush
    rnd.flush()
    assert not rnd.prefill.pending
    # each model: one group of 7 rows, as many steps as its longest prefix's chunks
    assert rnd.prefill.steps == sum(-(-max(len(p) for p in prefix) // CHUNK)
                                    for prefix in zip(*(prefixes(rnd, ids) for ids in rows.values())))
    assert_rows_alone(rnd, rows)


def test_more_rows_than_a_group_split_into_groups(pair, monkeypatch):
    engine = engine_for(pair)
    rnd = engine.batch_decoder(GROUP + 3).round
    sizes = []
    graph = rnd.backend.graph
    # every graph asked for: the group steps' (and the start record's apply)
    monkeypatch.setattr(rnd.backend, "graph", lambda fn, what: sizes.append(what) or graph(fn, what))
    rows = dict(enumerate(prompts([5 + 9 * i for i in range(GROUP + 3)], seed=1)))  # up to 104 ids: 2 chunks
    start(rnd, rows, engine)
    rnd.flush()
    # per model a group of GROUP rows and one of 3 (the torch backend pads neither), 2 chunks each
    assert rnd.prefill.steps == 2 * 2 * 2
    wanted = [f"a {n}-row prefill of the {m}" for n in (GROUP, 3) for m in ("target", "draft model")]
    assert sorted(what for what in sizes if "prefill" in what) == sorted(wanted)
    assert_rows_alone(rnd, rows)


def test_a_cache_growth_between_start_and_flush(pair):
    """The pending rows go into the grown caches (with their new kernel tables), the rows
    prefilled before the growth keep theirs, and the scratch is made anew for the new caches."""
    engine = engine_for(pair)
    rnd = engine.batch_decoder(3).round
    first, second, third = prompts([9, 12, CHUNK + 40], seed=2)
    start(rnd, {0: first}, engine)
    rnd.flush()
    generation, scratch = rnd.generation, rnd.prefill.scratch
    start(rnd, {1: second}, engine)
    rnd.start(2, third, replace(engine.profile.sampling, max_tokens=4 * rnd.capacity), seed=2)
    assert rnd.generation > generation  # the caches grew while row 1's prefill was pending
    rnd.flush()
    assert rnd.prefill.scratch is not scratch and rnd.prefill.generation == rnd.generation
    assert_rows_alone(rnd, {0: first, 1: second, 2: third})


def test_one_row_then_nothing(pair, monkeypatch):
    """A row started alone is prefilled by the next flush; a flush with nothing pending steps
    nothing (no model step at all)."""
    engine = engine_for(pair)
    rnd = engine.batch_decoder(2).round
    (ids,) = prompts([CHUNK + 3], seed=3)
    start(rnd, {1: ids}, engine)
    rnd.flush()
    assert rnd.prefill.steps == 2 + 2  # each model: 2 chunks, one row
    assert_rows_alone(rnd, {1: ids})
    calls = []
    for model in rnd.models:
        step = model.step
        monkeypatch.setattr(model, "step", lambda *a, _step=step, **kw: calls.append(1) or _step(*a, **kw))
    rnd.flush()
    assert rnd.prefill.steps == 4 and not calls


def test_a_prompt_past_longest_keeps_its_runners_prefill(pair, monkeypatch):
    """Past LONGEST tokens a prompt is its runner's alone (its forward's steps); the shorter rows
    beside it still take a group."""
    engine = engine_for(pair)
    rnd = engine.batch_decoder(2).round
    long, short = prompts([LONGEST + 10, 20], seed=4)
    ran = []
    monkeypatch.setattr(batch_prefill.BatchPrefill, "_alone",
                        lambda self, which, b, ids, _alone=batch_prefill.BatchPrefill._alone:
                        ran.append((which, b, len(ids))) or _alone(self, which, b, ids))
    rnd.start(0, long, replace(engine.profile.sampling, max_tokens=4), seed=0)
    start(rnd, {1: short}, engine)
    rnd.flush()
    assert ran == [(0, 0, LONGEST + 9), (1, 0, LONGEST + 8)]
    assert rnd.prefill.steps == 2  # the short row: one chunk a model
    assert_rows_alone(rnd, {0: long, 1: short})


@pytest.mark.parametrize("k", [3, 0], ids=["draft-model", "target-only"])
def test_rows_with_long_prompts_decode_each_prompt_alone(pair, k):
    engine = engine_for(pair, k)
    lengths = [CHUNK + 9, 1, 2 * CHUNK + 1, 30, 5]
    work = [(ids, replace(engine.profile.sampling, max_tokens=5 + 3 * i)) for i, ids in enumerate(prompts(lengths, 5))]
    reference = [finish(engine.decoder(replace(engine.profile, sampling=spec)), ids).token_ids for ids, spec in work]
    got = [finished.token_ids for _, finished in engine.batch_decoder(3).run(work)]
    assert got == reference
