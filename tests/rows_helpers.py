"""Token trees and batches shared by the rows tests (tests/core/step/test_step.py,
tests/gpu/kernels/test_attention.py and test_exact.py, tests/gpu/test_gpu_ops.py): trees as parent lists (-1: a child of the prefix's last token,
parents before children, as core/step/rows.py's `tree` takes them) and the path each node sees."""

from __future__ import annotations

import random

TREES = {  # name: parents
    "chain": [-1, 0, 1],  # width 1: a chain spelled as a tree
    "siblings": [-1, -1, -1, -1],  # width 4, depth 1
    "binary": [-1, 0, 0, 1, 1, 2, 2],  # width 2, depth 3
    "lopsided": [-1, -1, 0, 2, 2, 3, 5, 6],  # a deep branch (depth 6) beside a leaf
}


def path(parents: list[int], node: int) -> list[int]:
    """The nodes from depth 0 down to `node`."""
    nodes = []
    while node >= 0:
        nodes.append(node)
        node = parents[node]
    return nodes[::-1]


def leaves(parents: list[int]) -> list[int]:
    return [i for i in range(len(parents)) if i not in parents]


def random_tree(nodes: int, width: int, depth: int, seed: int) -> list[int]:
    """A tree of `nodes` nodes, at most `width` children a node and `depth` levels, parents first."""
    rng = random.Random(seed)
    parents, levels = [], []
    for _ in range(nodes):
        open_ = [p for p in range(-1, len(parents)) if (p < 0 or levels[p] < depth)
                 and sum(q == p for q in parents) < width]
        p = rng.choice(open_)
        parents.append(p)
        levels.append(1 if p < 0 else levels[p] + 1)
    return parents
