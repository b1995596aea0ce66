"""Shared by the batch tests on the kernels (tests/gpu/test_batch_gpu.py, test_batch_tree_gpu.py,
test_batch_hybrid_gpu.py): prompts with their own settings, decoding them alone and in batches, and
the interpreter's kernel tables (every kernel a GPU's round captures, run as the body calls it).
Their fixtures (the pair, an EAGLE-3 head, a bigram target) are tests/gpu/conftest.py's."""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
from triton_cpu import DEVICE

import dataclasses
from dataclasses import replace

import pytest

from batch_helpers import chain_prompts
from decode_helpers import finish, make_profile, random_prompts
from gpu_helpers import KernelRunners
from specgen.core.backend import EagerBatch
from specgen.core.engine import Engine
from specgen.core.events import Fate
from specgen.core.settings import ProposerSpec


def lookup_jobs(engine: Engine, count: int, seed: int = 0) -> list:
    """(ids, settings) of `count` prompts that hold the bigram target's text (chain_prompts), each
    with its own max_tokens and seed."""
    return [(ids, replace(engine.profile.sampling, max_tokens=4 + 3 * (i % 5), seed=100 + i))
            for i, ids in enumerate(chain_prompts(engine, count, seed=seed))]


def assert_rows_equal(got: list, reference: list, what: str) -> None:
    """Every row as its reference; else how many of them differ from `what`."""
    same = sum(a == b for a, b in zip(got, reference))
    assert len(got) == len(reference) and same == len(reference), \
        f"{len(reference) - same} of {len(reference)} rows differ from {what}"


def accepted_lookups(results: list[tuple]) -> int:
    return sum(fates.count(Fate.ACCEPTED) for _, fates, *_ in results)


def jobs(profile, count: int, seed: int = 0, **sampling) -> list:
    """(ids, settings) of `count` prompts of 1 to 12 ids, each with its own max_tokens and seed."""
    prompts = random_prompts(200, count, seed=seed)
    return [(ids, replace(profile.sampling, max_tokens=4 + 3 * (i % 5), seed=100 + i, **sampling))
            for i, ids in enumerate(prompts)]


def alone(engine: Engine, work: list) -> list[list[int]]:
    return [finish(engine.decoder(replace(engine.profile, sampling=spec)), ids).token_ids for ids, spec in work]


def batched(engine: Engine, batch: int, work: list, eager: bool = False) -> list[list[int]]:
    decoder = engine.batch_decoder(batch)
    if eager:
        decoder.program = EagerBatch(decoder.round)
    results = list(decoder.run(work))
    assert [index for index, _ in results] == list(range(len(work)))
    return [finished.token_ids for _, finished in results]


class KernelTables(KernelRunners):
    """KernelRunners with the round's Triton table too: every kernel a GPU's round captures, run
    in the interpreter as the body calls it."""

    def __init__(self, kernel_set):
        super().__init__(kernel_set)
        from specgen.gpu.round_ops import TritonRoundOps
        from specgen.gpu.workspace import Workspace

        self.workspace = Workspace(DEVICE)
        self.ops = TritonRoundOps(self.workspace)

    def check(self, first_id: int) -> None:
        from specgen.gpu.kernels.verify import check_output

        check_output(first_id, self.workspace)


class HeadTables(KernelTables):
    """KernelTables whose heads compute through the kernel table too (the CUDA backend's head_ops)."""

    def head_ops(self, head, batch: bool = False):
        from specgen.gpu.kernels.linear import BATCH_ROWS
        from specgen.gpu.ops import TritonOps

        head.layers[0].self_attn.fuse()
        return TritonOps(dataclasses.replace(self.kernels, split_k=False), **({"rows": BATCH_ROWS} if batch else {}))



def fated(engine: Engine, batch: int, work: list, eager: bool = False) -> list[tuple]:
    """Each prompt's (tokens, fates) through `batch` rows: the fates say what the head's drafts did."""
    decoder = engine.batch_decoder(batch)
    if eager:
        decoder.program = EagerBatch(decoder.round)
    return [(f.token_ids, f.fates) for _, f in decoder.run(work)]


def captured_against_eager(engine: Engine, work: list, fates: bool = True,
                           pipelined: bool | None = None) -> tuple[list, list]:
    """`work` through 8 rows replayed as CUDA graphs, its sixth prompt's max_tokens raised to 200 so
    that the caches grow and the rounds re-capture mid-run: (each finished row's tokens, with its
    fates where `fates`; the same work through the round run eagerly). pipelined: the decoder keeps
    two rounds in flight (True) or one (False); None: not checked."""
    work = list(work)
    work[5] = (work[5][0], replace(work[5][1], max_tokens=200))
    decoder = engine.batch_decoder(8)
    assert type(decoder.program).__name__ == "BatchGraphs"
    if pipelined is not None:
        assert decoder.pipelined is pipelined
    captured = [(f.token_ids, f.fates) if fates else f.token_ids for _, f in decoder.run(work)]
    assert decoder.program.eager is None and decoder.program.graphs
    return captured, (fated if fates else batched)(engine, 8, work, eager=True)


def cuda_eagle_engine(target, head, k: int = 4, dtype: str = "bfloat16", speculation: dict | None = None,
                      **sampling) -> Engine:
    """A target with an EAGLE-3 head on the CUDA backend, the head's calls on the kernels; speculation:
    [speculation] keys (a tree's width and nodes)."""
    profile = make_profile(target, None, k=k, backend="cuda", proposer=ProposerSpec(kind="eagle", head=str(head)),
                           speculation=speculation, **({"max_tokens": 32} | sampling))
    engine = Engine(replace(profile, target=replace(profile.target, dtype=dtype)))
    assert engine.backend.name == "cuda" and engine.describe()["heads"] == {"eagle": "kernels"}
    return engine


TREE_SAMPLINGS = pytest.mark.parametrize(
    "sampling", [dict(), dict(temperature=0.8, top_k=20, coupling="gumbel"),
                 dict(temperature=0.8, top_p=0.9, coupling="rejection")], ids=["greedy", "gumbel", "rejection"])
