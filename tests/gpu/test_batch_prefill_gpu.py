"""core/round/batch_prefill.py on the kernels: a group's prefill is each prompt's alone, bit for bit.

On the CPU (the Triton interpreter, uncaptured): the kernel tables a GPU captures, a group of
prompts (one token, a few, more than a chunk) stepped together leaves each row's slots of both
models' batch caches equal to its runner's own prefill chunk by chunk (what a GPU runner replays).
On a GPU (skipped without CUDA): bfloat16 through the CUDA backend, the group steps captured, each
row's slots equal to the runner's alone prefill (its captured 64-token step replayed), a prompt
past LONGEST through the runner itself; and rows with long prompts decode each prompt's tokens
alone.
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)

import random
from dataclasses import replace

import pytest
import torch

from decode_helpers import cuda_engine, finish, make_profile, on_cuda
from gpu_helpers import KernelRunners, kernels
from specgen.core.engine import Engine
from specgen.core.round.batch_prefill import CHUNK, GROUP, LONGEST
from tiny_models import build_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    # an unrelated draft: two models' caches; 1,024 positions: prompts past LONGEST fit with their tokens
    return build_pair(tmp_path_factory.mktemp("prefill-kernels"), context=1024)


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(200) for _ in range(n)] for n in lengths]


def chunked(runner, ids: list[int]) -> torch.Tensor:
    """The runner's own prefill of ids, a CHUNK at a time (a GPU runner's replays; here its eager
    steps, the kernel table's too): its first n slots [2, L, g, n, d]."""
    runner.reset()
    with torch.inference_mode():
        for at in range(0, len(ids), CHUNK):
            runner.forward(torch.tensor(ids[at: at + CHUNK], dtype=torch.long, device=runner.device),
                           want_logits=False)
    (planes,) = runner.cache.planes.values()
    return planes[:, :, 0, :, :len(ids)].clone()


def assert_rows_bitwise(rnd, rows: dict[int, list[int]], alone) -> None:
    """Each row's slots of each model's batch cache bitwise `alone(runner, prefix)`."""
    for b, ids in rows.items():
        for which, prefix in enumerate([ids[:-1], ids[:-2]][:len(rnd.runners)]):
            if not prefix:
                continue
            (planes,) = rnd.caches[which].planes.values()
            got = planes[:, :, b, :, :len(prefix)]
            want = alone(rnd.runners[which], prefix)
            assert torch.equal(got, want), \
                f"row {b} ({len(ids)} ids), model {which}: {(got != want).sum().item()} values differ"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
def test_group_prefill_on_the_kernel_tables_is_each_prompt_alone(pair):
    """The step kernels (linear, attention with rope, norms, inputs) over a group's [G, CHUNK] rows
    give each row the bits of its runner's own chunk steps."""
    tables = kernels(attention=True, linear=True, rope=True, norm=True, step_io=True)
    engine = Engine(make_profile(*pair, k=3, max_tokens=4), backend=KernelRunners(tables))
    rnd = engine.batch_decoder(3).round
    rows = dict(enumerate(prompts([1, 3, CHUNK + 6])))
    for b, ids in rows.items():
        rnd.start(b, ids, engine.profile.sampling, seed=b)
    rnd.flush()
    assert rnd.prefill.steps == 2 + 2  # each model: one group, two chunks
    assert_rows_bitwise(rnd, rows, chunked)


# -- on a GPU ------------------------------------------------------------------------------------


def alone(runner, ids: list[int]) -> torch.Tensor:
    """The runner's prefill of ids as a request alone gets it (its forward: the captured 64-token
    step replayed chunk by chunk, or past MAX_CHUNKS chunks one eager step)."""
    runner.reset()
    with torch.inference_mode():
        runner.forward(torch.tensor(ids, dtype=torch.long, device=runner.device), want_logits=False)
    (planes,) = runner.cache.planes.values()
    return planes[:, :, 0, :, :len(ids)].clone()


@on_cuda
def test_group_prefill_on_cuda_is_each_prompt_alone(pair):
    """GROUP + 3 rows of 1 to 300 ids and one past LONGEST, started before one flush (the target's
    9 prefixes that take a group: groups of 8 and 1; the draft model's 8: one group): the group
    steps captured (no warning), each row's slots bitwise its runner's alone prefill."""
    engine = cuda_engine(*pair, k=3, max_tokens=16)
    lengths = [1, 2, 5, CHUNK - 1, CHUNK, CHUNK + 1, CHUNK + 2, 2 * CHUNK + 7, 300, 17, LONGEST + 20]
    assert len(lengths) == GROUP + 3
    rnd = engine.batch_decoder(len(lengths)).round
    rows = dict(enumerate(prompts(lengths, seed=1)))
    for b, ids in rows.items():
        rnd.start(b, ids, engine.profile.sampling, seed=b)
    rnd.flush()
    torch.cuda.synchronize()
    assert not [note for note in engine.backend.notes if "prefill" in note]
    # every group size's step, both models, made at the first prefill (the long one: alone)
    assert sorted(rnd.prefill.programs) == [(m, 1 << i, CHUNK) for m in (0, 1) for i in range(GROUP.bit_length())]
    assert all(type(program).__name__ == "method" for program in rnd.prefill.programs.values())  # replays
    assert_rows_bitwise(rnd, rows, alone)


@on_cuda
@pytest.mark.parametrize("batch", [4, 11])
def test_bf16_rows_with_long_prompts_equal_each_prompt_alone_on_cuda(pair, batch):
    """Prompts of 1 to 600 ids (groups of every size, rows refilled between rounds, one past
    LONGEST): every row's tokens are the prompt's alone."""
    engine = cuda_engine(*pair, k=3, max_tokens=16)
    lengths = [70, 1, 130, 9, 256, 64, 65, LONGEST + 30, 3, 200, 40, 129, 2, 511, 33, 100]
    work = [(ids, replace(engine.profile.sampling, max_tokens=6 + 5 * (i % 4)))
            for i, ids in enumerate(prompts(lengths, seed=batch))]
    reference = [finish(engine.decoder(replace(engine.profile, sampling=spec)), ids).token_ids for ids, spec in work]
    got = [finished.token_ids for _, finished in engine.batch_decoder(batch).run(work)]
    assert got == reference
