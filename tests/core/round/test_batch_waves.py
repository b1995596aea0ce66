"""core/round/batch_round.py's waves: rows started in one wave take their prompts' prefills
together (BatchRound.wave, _prefill_together), in steps over all of them at once, on a kernel table
whose rows keep their bits in calls of any shape (the Triton tables, here in the interpreter), and
their caches hold bitwise the keys and values each prompt's runner writes alone, whatever the
grouping and the step's rows. On the reference (TorchOps: not row-invariant on a CPU) a wave takes
each row's runner. Decoding in waves: tests/core/round/test_batch_round.py (the torch backend) and
tests/gpu/test_batch_gpu.py (the kernel tables, and CUDA)."""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
import pytest

from dataclasses import replace

import random

import torch

from decode_helpers import make_profile, random_prompts
from gpu_helpers import KernelRunners, kernels
from specgen.core.engine import Engine
from specgen.core.round import batch_round
from tiny_models import build_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("waves"), noisy=0.1)


def started(engine: Engine, prompts: list[list[int]], wave: bool):
    """A batch round of len(prompts) + 1 rows (the last never started) with each prompt started in
    row i, all in one wave or one after another; the engine's round is dropped after (it keeps one
    per shape): (each model's cache planes, positions), copies."""
    engine.forget_batches()
    rnd = engine.batch_decoder(len(prompts) + 1).round
    spec = replace(engine.profile.sampling, max_tokens=8)
    if wave:
        with rnd.wave():
            for b, ids in enumerate(prompts):
                rnd.start(b, ids, spec, seed=b)
    else:
        for b, ids in enumerate(prompts):
            rnd.start(b, ids, spec, seed=b)
    caches = [[planes.clone() for planes in cache.planes.values()] for cache in rnd.caches]
    return caches, rnd.positions.clone()


def assert_same_caches(waved, one_by_one, prompts) -> None:
    (caches, positions), (their_caches, their_positions) = waved, one_by_one
    assert torch.equal(positions, their_positions)
    for which, offset in ((0, 1), (1, 2)):  # the target holds all but the last id, the draft but the last two
        for b, ids in enumerate(prompts):
            n = max(len(ids) - offset, 0)
            for planes, theirs in zip(caches[which], their_caches[which]):
                assert torch.equal(planes[:, :, b, :, :n], theirs[:, :, b, :, :n]), (which, b, n)
                assert planes[:, :, b, :, :n].abs().sum() > 0 or n == 0  # written, not two empty caches


def kernel_engine(pair) -> Engine:
    tables = kernels(attention=True, linear=True, rope=True, norm=True, step_io=True)
    return Engine(make_profile(*pair, k=3), backend=KernelRunners(tables))


@pytest.mark.slow
@pytest.mark.parametrize("tokens, rows", [(batch_round.WAVE_TOKENS, batch_round.WAVE_ROWS), (128, 8)],
                         ids=["one-group", "groups-and-chunks"])
def test_a_wave_prefills_each_row_as_alone(pair, monkeypatch, tokens, rows):
    """Prompts of 1 to 40 ids (padding: shorter rows run past their end in the others' steps); with
    few tokens a refill cache and few rows a step, the wave goes in groups of rows and steps of a
    few positions each."""
    monkeypatch.setattr(batch_round, "WAVE_TOKENS", tokens)
    monkeypatch.setattr(batch_round, "WAVE_ROWS", rows)
    calls = []
    together = batch_round.BatchRound._prefill_together
    monkeypatch.setattr(batch_round.BatchRound, "_prefill_together",
                        lambda self, which, items: calls.append(which) or together(self, which, items))
    engine = kernel_engine(pair)
    rng = random.Random(3)
    prompts = [[rng.randrange(200) for _ in range(length)] for length in (1, 14, 27, 40, 9)]
    assert_same_caches(started(engine, prompts, wave=True), started(engine, prompts, wave=False), prompts)
    assert calls == [0, 1]  # the target's prefills together, then the draft's


def test_the_reference_prefills_each_row_with_its_runner(pair, monkeypatch):
    """On the torch reference a wave takes each row's runner: its sums follow a call's shape."""
    calls = []
    monkeypatch.setattr(batch_round.BatchRound, "_prefill_together", lambda *args: calls.append(args))
    engine = Engine(make_profile(*pair, k=3))
    prompts = random_prompts(200, 4, seed=5)
    assert_same_caches(started(engine, prompts, wave=True), started(engine, prompts, wave=False), prompts)
    assert calls == []


def test_a_wave_of_one_row_is_its_runners_prefill(pair, monkeypatch):
    """One row in a wave takes its runner's own prefill, as a refill outside a wave does."""
    engine = kernel_engine(pair)
    calls = []
    together = batch_round.BatchRound._prefill_together
    monkeypatch.setattr(batch_round.BatchRound, "_prefill_together",
                        lambda self, which, items: calls.append(which) or together(self, which, items))
    prompts = random_prompts(200, 1, seed=4)
    assert_same_caches(started(engine, prompts, wave=True), started(engine, prompts, wave=False), prompts)
    assert calls == []
