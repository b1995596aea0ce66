"""core/round/tree.py: the tree built from the draft's log q, in its static envelope.

Each test builds a tree from random (or tied) log-probabilities level by level, as the tree
drafter feeds them, and checks it against a plain-Python rebuild: the frontier of each level is
its w best candidates, the selected nodes are the n best of the pool, each node's parent is
selected before it, and the children table and draft offsets say the same.
"""

from __future__ import annotations

import pytest
import torch

from specgen.core.round.tree import Tree, envelope

VOCAB = 40


def grown(k: int, w: int, n: int, seed: int, tied: bool = False) -> tuple[Tree, list[torch.Tensor]]:
    """A tree after a round's construction; the log q it was fed (root's, then each level's)."""
    gen = torch.Generator().manual_seed(seed)
    tree = Tree(k, w, n, torch.device("cpu"))
    fed = []

    def logq(rows: int) -> torch.Tensor:
        raw = torch.zeros(rows, VOCAB) if tied else torch.randn(rows, VOCAB, generator=gen) * 2
        fed.append(torch.log_softmax(raw, -1))
        return fed[-1]

    tree.root(torch.tensor([7]), logq(1))
    start = torch.tensor([30])
    for level in range(1, k):
        rows = tree.level_rows(level, start)
        assert rows.ids.shape == (1, w) and rows.tail.shape == (1, w, max(k - 1, 1))
        tree.expand(level, logq(w))
    tree.select()
    return tree, fed


def python_pool(tree: Tree, fed: list[torch.Tensor]) -> list[tuple[float, int, int]]:
    """(score, parent pool index, token) per pool slot, rebuilt from the fed log q and the tree's
    frontiers (checked against their definition in test_each_frontier_is_its_levels_best)."""
    w, pool = tree.w, []
    top = fed[0][0].topk(w)
    pool += [(float(v), -1, int(t)) for v, t in zip(top.values, top.indices)]
    for level in range(1, tree.k):
        top = fed[level].topk(w, dim=-1)
        for f, parent in enumerate(tree.frontier[level - 1].tolist()):
            pool += [(pool[parent][0] + float(v), parent, int(t)) for v, t in zip(top.values[f], top.indices[f])]
    return pool


@pytest.mark.parametrize("k, w, n", [(3, 2, 5), (4, 3, 20), (1, 4, 3), (5, 2, 18), (3, 3, 21)])
def test_selected_nodes_are_the_best_and_ancestor_closed(k, w, n):
    tree, fed = grown(k, w, n, seed=k * 10 + w)
    pool = python_pool(tree, fed)
    assert len(pool) == envelope(k, w) and tree.tokens.tolist() == [t for _, _, t in pool]
    ranked = sorted(range(len(pool)), key=lambda i: (-tree.scores[i].item(), i))[:n]  # the float32 scores
    chosen = sorted(ranked)
    assert torch.allclose(tree.scores, torch.tensor([s for s, _, _ in pool]), atol=1e-5)
    assert tree.ids[0].tolist() == [7] + [pool[i][2] for i in chosen]
    row = {p: r + 1 for r, p in enumerate(chosen)}
    parents = tree.parents.tolist()
    for r, p in enumerate(chosen, start=1):
        up = pool[p][1]
        assert up < 0 or up in row  # the parent is selected ...
        assert parents[r] == (0 if up < 0 else row[up]) and parents[r] < r  # ... and comes first
        assert tree.children[parents[r]].tolist().count(r) == 1


@pytest.mark.parametrize("k, w", [(4, 2), (3, 3)])
def test_each_frontier_is_its_levels_best_with_their_draft_paths(k, w):
    tree, _ = grown(k, w, w, seed=3)
    for level in range(1, k - 1):
        base = w + (level - 1) * w * w
        scores = tree.scores[base : base + w * w].tolist()
        best = sorted(range(w * w), key=lambda i: (-scores[i], i))[:w]
        assert tree.frontier[level].tolist() == [base + i for i in best]
        for f, node in enumerate(tree.frontier[level].tolist()):  # its draft path: its ancestors' offsets
            up = tree.parent[node].item()
            parent_f = tree.frontier[level - 1].tolist().index(up)
            assert tree.tail[level, f, : level + 1].tolist() == [*tree.tail[level - 1, parent_f, :level].tolist(),
                                                                 level * w + f]
            assert tree.pool_offset[node].item() == level * w + f


def test_ties_go_to_the_lower_index_so_parents_come_first():
    """Every log q equal: every candidate of a level ties, and the tree is the pool's first n."""
    k, w, n = 3, 2, 7
    tree, _ = grown(k, w, n, seed=0, tied=True)
    assert tree.frontier[1].tolist() == [w, w + 1]  # the first two children of level 2
    assert tree.parents.tolist()[: n + 1] == [-1, 0, 0, 1, 1, 2, 2, 3]
    assert tree.children[:3].tolist() == [[1, 2], [3, 4], [5, 6]]


def test_children_are_ranked_by_the_drafts_log_q():
    tree, fed = grown(2, 3, 12, seed=5)
    root_kids = tree.children[0].tolist()
    assert [tree.ids[0, r].item() for r in root_kids] == fed[0][0].topk(3).indices.tolist()
    offsets = tree.offset.tolist()
    assert offsets[0] == -1 and sorted(offsets[r] for r in root_kids) == [0, 1, 2]  # level 1: stepped
    assert all(o == -1 for o in offsets[4:])  # the last level is never stepped
