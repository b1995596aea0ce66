"""host_tree.pack_tree: the staged buffer a lookup's trie becomes, built with lists on the host,
against the depths, positions and tails that core/step/rows.tree gives the same tree."""

import random

import pytest
import torch

from specgen.core.drafters.ngram import LookupTree
from specgen.core.round.host_tree import pack_tree, packed_sizes
from specgen.core.step.rows import tree as tree_rows


def reference(drafted, k: int, w: int, n: int) -> torch.Tensor:
    """The packed buffer from rows.tree's torch ops (the builder the target's tree rows use)."""
    tokens, parents = (drafted.tokens, drafted.parents) if drafted else ([], [])
    m = len(tokens)
    rows = [-1] + [p + 1 for p in parents] + [0] * (n - m)
    children, ranks, depth = [-1] * ((n + 1) * w), [0] * (n + 1), [0] * (m + 1)
    for row in range(1, m + 1):
        up = rows[row]
        children[up * w + ranks[up]] = row
        ranks[up] += 1
        depth[row] = depth[up] + 1
    ids = [0] + list(tokens) + [0] * (n - m)
    at = tree_rows(torch.tensor([ids]), torch.tensor(rows), 0, levels=k + 1)
    return torch.cat([torch.tensor(ids[1:] + rows + children), at.depth[0], at.positions[0],
                      at.tail[0].reshape(-1), torch.tensor([max(depth)])])


def random_trie(rng: random.Random, k: int, w: int, nodes: int) -> LookupTree:
    tokens, parents, depth, kids = [], [], {-1: 0}, {-1: 0}
    for i in range(nodes):
        room = [p for p in [-1] + list(range(i)) if kids[p] < w and depth[p] < k]
        if not room:
            break
        up = rng.choice(room)
        tokens.append(rng.randrange(1000))
        parents.append(up)
        kids[up] += 1
        kids[i], depth[i] = 0, depth[up] + 1
    return LookupTree(tokens, parents)


@pytest.mark.parametrize("k,w,n", [(1, 1, 1), (3, 2, 6), (4, 2, 8), (4, 4, 16), (6, 3, 12)])
def test_packed_tree_is_what_the_rows_builder_gives(k, w, n):
    rng = random.Random(k * 100 + w * 10 + n)
    for _ in range(40):
        drafted = random_trie(rng, k, w, rng.randint(0, n))
        packed = pack_tree(drafted, k, w, n)
        assert packed.dtype == torch.int64 and packed.numel() == sum(packed_sizes(k, w, n))
        assert torch.equal(packed, reference(drafted, k, w, n)), drafted
    assert torch.equal(pack_tree([], k, w, n), reference([], k, w, n))


@pytest.mark.parametrize("drafted,message", [
    (LookupTree([1, 2, 3], [-1, -1, -1]), "room for a child"),  # three root children in width 2
    (LookupTree([1, 2], [-1, 1]), "earlier node"),  # a parent after its child
    (LookupTree([1, 2, 3, 4], [-1, 0, 1, 2]), "depth 4"),  # deeper than k = 3
    (LookupTree([1] * 7, [-1, 0, 0, 1, 1, 2, 2]), "envelope of 6"),  # more nodes than n
])
def test_a_tree_outside_its_envelope_is_refused(drafted, message):
    with pytest.raises(ValueError, match=message):
        pack_tree(drafted, 3, 2, 6)
