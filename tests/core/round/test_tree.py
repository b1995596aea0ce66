"""core/round/tree.py: the tree built from the draft's log q, in its static envelope.

Each test builds a tree from random (or tied) log-probabilities level by level, as the tree
drafter feeds them, and checks it against a plain-Python rebuild: the frontier of each level is
its w best candidates, the selected nodes are the n best of the pool, each node's parent is
selected before it, and the children table and draft offsets say the same.
"""

from __future__ import annotations

import pytest
import torch

from specgen.core.round.ops import TorchRoundOps
from specgen.core.round.tree import Tree, draw_children, envelope, spine
from specgen.core.sampling.warp import exponentials
from specgen.core.step import rows as rowsets

VOCAB = 40


def grown(k: int, w: int, n: int, seed: int, tied: bool = False, drawn: bool = False) -> tuple[Tree, list]:
    """A tree after a round's construction; the log q it was fed (root's, then each level's), and
    with drawn children the Exp(1) rows they were drawn with, after each."""
    gen = torch.Generator().manual_seed(seed)
    tree = Tree(k, w, n, torch.device("cpu"), drawn=drawn)
    fed = []

    def noise(rows: int) -> torch.Tensor | None:
        if not drawn:
            return None
        fed.append(exponentials((rows, VOCAB), gen, "cpu"))
        return fed[-1]

    def logq(rows: int) -> torch.Tensor:
        raw = torch.zeros(rows, VOCAB) if tied else torch.randn(rows, VOCAB, generator=gen) * 2
        fed.append(torch.log_softmax(raw, -1))
        return fed[-1]

    start, ops = torch.tensor([30]), TorchRoundOps()
    tree.root(torch.tensor([7]), logq(1), noise(1), start, ops)
    for level in range(1, k):
        rows = tree.level_rows(level, start)
        assert rows.ids.shape == (1, w) and rows.tail.shape == (1, w, max(k - 1, 1))
        tree.expand(level, logq(w), noise(w), start, ops)
    tree.select(torch.tensor([50]), ops)
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
    chain = spine(len(pool), w).tolist()  # the chain's nodes first, then by the float32 scores
    ranked = sorted(range(len(pool)), key=lambda i: (not chain[i], -tree.scores[i].item(), i))[:n]
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
        best = sorted(range(w * w), key=lambda i: (i != 0, -scores[i], i))[:w]  # the chain's node first
        assert tree.frontier[level].tolist() == [base + i for i in best]
        for f, node in enumerate(tree.frontier[level].tolist()):  # its draft path: its ancestors' offsets
            up = tree.parent[node].item()
            parent_f = tree.frontier[level - 1].tolist().index(up)
            assert tree.tail[level, f, : level + 1].tolist() == [*tree.tail[level - 1, parent_f, :level].tolist(),
                                                                 level * w + f]
            assert tree.pool_offset[node].item() == level * w + f


def test_a_tree_holds_its_chain_where_siblings_score_higher():
    """Log q of 0.45 / 0.40 / ... at every node: the chain's depth-4 node (0.45^4 = 0.041) scores
    below every depth-1 sibling (0.40), and ranked by score alone the 8-node tree would stop the
    chain at depth 2. It holds the whole chain (each level's first candidate), and every frontier
    starts with the chain's node."""
    k, w, n = 4, 3, 8
    probs = torch.tensor([0.45, 0.40, 0.10] + [0.05 / (VOCAB - 3)] * (VOCAB - 3))
    logq = lambda rows: probs.log().expand(rows, -1)  # noqa: E731
    tree, start, ops = Tree(k, w, n, torch.device("cpu")), torch.tensor([30]), TorchRoundOps()
    tree.root(torch.tensor([7]), logq(1), None, start, ops)
    for level in range(1, k):
        tree.expand(level, logq(w), None, start, ops)
        assert tree.frontier[level - 1][0].item() == (0 if level == 1 else w + (level - 2) * w * w)
    tree.select(torch.tensor([50]), ops)
    chain = [0] + [w + d * w * w for d in range(k - 1)]  # pool indices, depth 1 .. k
    rows = [tree.row_of[i].item() for i in chain]
    assert all(r > 0 for r in rows)  # selected
    assert [tree.parents[r].item() for r in rows] == [0] + rows[:-1]  # a path from the root
    assert tree.ids[0, rows].tolist() == [0] * k  # each the argmax of its parent's q
    assert tree.scores[chain[-1]] < tree.scores[1] and tree.scores[chain[2]] < tree.scores[1]  # siblings outscore them


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


@pytest.mark.parametrize("w", [1, 3, 8])
def test_children_tie_to_the_lower_id(w):
    """The children are the first w of a stable descending sort of the keys (log q, or log q − log E)
    whatever the ties: log q on a grid of three values with -inf tails, a row of fewer finite ids
    than w, a row all -inf (its first w ids); values are log q at the chosen ids."""
    gen = torch.Generator().manual_seed(w)
    logq = -0.5 * torch.randint(0, 3, (6, VOCAB), generator=gen).float()
    logq = torch.where(torch.rand(6, VOCAB, generator=gen) < 0.4, logq, float("-inf"))
    logq[0] = float("-inf")
    logq[1, :] = float("-inf")
    logq[1, [9, 30]] = -1.0
    for noise in (None, exponentials((6, VOCAB), gen, "cpu"), exponentials((1, VOCAB), gen, "cpu")):
        key = logq if noise is None else logq - noise.log()
        tokens, values = draw_children(logq, noise, w)
        assert torch.equal(tokens, key.sort(dim=-1, descending=True, stable=True).indices[:, :w])
        assert torch.equal(values, logq.gather(-1, tokens))
    assert draw_children(logq, None, w)[0][0].tolist() == list(range(w))
    assert draw_children(logq, None, w)[0][1].tolist() == ([9, 30] + list(range(w - 2)))[:w]


@pytest.mark.parametrize("k, w, n", [(3, 2, 7), (4, 3, 12), (3, 3, 4), (1, 3, 2), (4, 2, 14)])
def test_drawn_children_keep_every_stepped_node_first(k, w, n):
    """Drawn children: each node's are the top-w of log q − log E in that order, scored by their
    log q; the tree holds the stepped nodes and the chain's (in pool order), then the best others,
    ancestor-closed; `drawn` lists each expanded row's children, selected or not, in draw order."""
    tree, fed = grown(k, w, n, seed=k * 7 + n, drawn=True)
    logq, noise = fed[0::2], fed[1::2]
    keys = [q - e.log() for q, e in zip(logq, noise)]
    assert tree.tokens[:w].tolist() == keys[0][0].topk(w).indices.tolist()
    assert torch.equal(tree.scores[:w], logq[0][0, tree.tokens[:w]])
    stepped = (tree.pool_offset >= 0).nonzero().flatten().tolist() if k > 1 else []
    chain = spine(envelope(k, w), w).tolist()  # the chain's nodes (the deepest is never stepped) rank with them
    first = sorted(set(stepped) | {i for i, c in enumerate(chain) if c})
    others = sorted(set(range(envelope(k, w))) - set(first), key=lambda i: (-tree.scores[i].item(), i))
    chosen = sorted((first + others)[:n])
    ids = tree.ids[0].tolist()
    assert ids == [7] + tree.tokens[chosen].tolist()
    parents = tree.parents.tolist()
    for r, p in enumerate(chosen, start=1):
        up = tree.parent[p].item()
        assert parents[r] == (0 if up < 0 else chosen.index(up) + 1)
    for row in range(n + 1):
        expanded = row == 0 or (k > 1 and tree.offset[row] >= 0)
        kids = tree.drawn[row].tolist()
        if not expanded:
            assert kids == [-1] * w
            continue
        level = 0 if row == 0 else tree.offset[row].item() // w + 1
        f = 0 if row == 0 else tree.offset[row].item() % w
        assert kids == keys[level][f].topk(w).indices.tolist()
        for rank, child in enumerate(tree.children[row].tolist()):
            assert child < 0 or ids[child] == kids[rank]


@pytest.mark.parametrize("k, w, n", [(4, 2, 9), (3, 3, 12), (1, 3, 2)])
def test_the_steps_rows_are_written_with_the_tree(k, w, n):
    """A frontier's draft rows (its tokens at position start + level - 1, its slots, its nodes'
    draft paths) and the target's rows (core/step/rows.tree over the selected parents) are there
    once the tree's construction wrote them (grown: draft start 30, target start 50)."""
    tree, _ = grown(k, w, n, seed=2)
    start = torch.tensor([30])
    for level in range(1, k):
        rows = tree.level_rows(level, start)
        assert rows.ids[0].tolist() == tree.tokens[tree.frontier[level - 1]].tolist()
        assert rows.positions.tolist() == [[30 + level - 1] * w] and rows.depth.tolist() == [[level] * w]
        assert rows.slots[0].tolist() == [30 + (level - 1) * w + f for f in range(w)]
        assert torch.equal(rows.tail[0, :, :level], 30 + tree.tail[level - 1, :, :level])
    want = rowsets.tree(tree.ids, tree.parents, torch.tensor([50]), levels=k + 1)
    got = tree.target_rows(torch.tensor([50]))
    for field in ("ids", "positions", "slots", "tail", "depth"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
