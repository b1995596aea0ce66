"""benchmarks/bench_kernels.py: the walk subcommand's tree is a full tree of the shape asked for,
its children's tokens are the draws, and on it the walk kernel (the Triton interpreter here)
equals the reference while the draft's noise rejects children, as the timed call would."""

from __future__ import annotations

import triton_cpu  # noqa: F401,I001  (first: the Triton interpreter on a CPU)
import torch

from repo_paths import REPO, script
from specgen.core.sampling import tree_walk as reference
from specgen.gpu.kernels import tree_walk
from specgen.gpu.workspace import Workspace


def test_the_walk_bench_tree_is_full_and_its_walk_rejects_as_the_reference():
    bench = script(REPO / "benchmarks" / "bench_kernels.py")
    k, width, nodes, vocab = 3, 3, 8, 300
    rejected = 0
    for seed in range(4):
        children, drawn, tokens, p, q, uniforms, expo = bench.walk_inputs(vocab, k, width, nodes, 3.0, seed,
                                                                           device="cpu")
        kids = children[0]
        rows = [int(r) for r in kids.flatten() if r >= 0]
        assert sorted(rows) == list(range(1, nodes + 1))  # every node once, each a row's child
        assert (kids[0] >= 0).sum() == width and all((kids[r] >= 0).sum() <= width - 1 for r in range(1, nodes + 1))
        for row, lane in (kids >= 0).nonzero().tolist():
            assert tokens[0, kids[row, lane]] == drawn[0, row, lane]
        limit = torch.tensor([k], dtype=torch.int32)
        want = reference.recursive_walk(children, drawn, tokens, p, q, uniforms, expo, limit, k)
        got = tree_walk.recursive_walk(children, drawn, tokens, p, q, uniforms, expo, limit, k, Workspace("cpu"))
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        rejected += int((want[0] >= 0).sum()) < k + 1  # the walk stopped before the bonus (a rejection, mostly)
    assert rejected >= 2
