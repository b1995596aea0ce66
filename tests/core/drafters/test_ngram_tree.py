"""core/drafters/ngram.py lookup_tree: every distinct continuation of the matching suffix as one trie,
under the width, node and depth caps; and the host's packing of it for a round (HostTree.pack)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from specgen.core.drafters.ngram import LookupTree, NgramProposer, TreeLookup
from specgen.core.round.host_tree import HostTree
from specgen.core.round.tree import Tree
from specgen.core.step import rows as rowsets


def tree(context: list[int], k: int, width: int = 8, nodes: int = 63, ngram_min: int = 1,
         ngram_max: int = 4) -> LookupTree:
    proposer = NgramProposer(ngram_min, ngram_max, every=True)
    proposer.start(context)
    return proposer.lookup_tree(k, width, nodes)


def paths(drafted: LookupTree) -> list[list[int]]:
    """Each node's tokens from the root down to it, in node order."""
    out = []
    for token, parent in zip(drafted.tokens, drafted.parents):
        out.append((out[parent] if parent >= 0 else []) + [token])
    return out


CONTEXT = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 6, 1, 2]  # (1, 2) followed by 3 4, 3 5, then 6 (latest)


def test_distinct_continuations_merge_into_a_trie():
    got = tree(CONTEXT, k=3, ngram_min=2, ngram_max=2)
    # latest first: 6 1 2, then 3 5 1, then 3 4 1 (sharing the node 3)
    assert got.tokens == [6, 1, 2, 3, 5, 1, 4, 1]
    assert got.parents == [-1, 0, 1, -1, 3, 4, 3, 6]


def test_width_nodes_and_depth_caps():
    assert tree(CONTEXT, k=3, width=1, ngram_min=2, ngram_max=2).tokens == [6, 1, 2]  # the chain
    capped = tree(CONTEXT, k=3, nodes=5, ngram_min=2, ngram_max=2)
    assert (capped.tokens, capped.parents) == ([6, 1, 2, 3, 5], [-1, 0, 1, -1, 3])
    shallow = tree(CONTEXT, k=1, ngram_min=2, ngram_max=2)
    assert (shallow.tokens, shallow.parents) == ([6, 3], [-1, -1])


def test_a_root_width_caps_the_roots_children_alone():
    """The hybrid proposer's lookup leaves the model a lane at the root (root_width = w - 1): the
    root keeps its first children, deeper nodes the whole width."""
    context = [1, 2, 1, 3, 1, 4, 9, 2, 1, 5, 1]  # 1 followed by 5, 4, 3, 2 (latest first)
    proposer = NgramProposer(1, 1, every=True)
    proposer.start(context)
    full = proposer.lookup_tree(2, 3, 16)
    capped = proposer.lookup_tree(2, 3, 16, root_width=1)
    assert [t for t, p in zip(full.tokens, full.parents) if p < 0] == [5, 4, 3]
    assert (capped.tokens, capped.parents) == ([5, 1], [-1, 0])
    lookup = TreeLookup(1, 1, 3, 16, root_width=1)
    lookup.start(context)
    assert lookup.lookup(2) == capped


def test_nothing_matches_gives_an_empty_tree():
    assert not tree([1, 2, 3, 4], k=4)
    assert not tree([7], k=4)
    assert not tree(CONTEXT, k=0)
    assert not tree(CONTEXT, k=3, nodes=0)


def test_shorter_ngrams_add_branches_after_the_longest():
    # (2, 3) matches once (followed by 9); 3 alone also after 4 -> 3 7
    context = [2, 3, 9, 4, 3, 7, 2, 3]
    got = tree(context, k=2, ngram_min=1, ngram_max=2)
    assert paths(got) == [[9], [9, 4], [7], [7, 2]]
    assert tree(context, k=2, ngram_min=2, ngram_max=2).tokens == [9, 4]


def test_lookup_tree_needs_the_chains():
    proposer = NgramProposer(1, 2)
    proposer.start(CONTEXT)
    with pytest.raises(ValueError, match="every=True"):
        proposer.lookup_tree(3, 2, 4)


def continuations(context: list[int], k: int, ngram_min: int, ngram_max: int) -> set[tuple[int, ...]]:
    """Every prefix of every continuation of every earlier occurrence of a matching suffix."""
    length, found = len(context), set()
    for n in range(ngram_min, ngram_max + 1):
        if n > length:
            continue
        suffix = context[length - n:]
        for end in range(n, length):
            if context[end - n:end] == suffix:
                follow = context[end:end + k]
                found.update(tuple(follow[:i]) for i in range(1, len(follow) + 1))
    return found


@pytest.mark.parametrize("alphabet,ngram_min,ngram_max", [(2, 1, 3), (3, 1, 2), (4, 2, 3), (5, 1, 1)])
def test_uncapped_trees_hold_every_continuation_once(alphabet, ngram_min, ngram_max):
    """Against a brute force, with width and nodes too large to bind: the trie's paths are exactly
    the continuations' prefixes, each once; its first branch is lookup(k)'s chain; parents come
    first; the index grown round by round gives the tree a fresh start on the context gives."""
    rng = random.Random(alphabet * 10 + ngram_max)
    for _ in range(15):
        context = [rng.randrange(alphabet) for _ in range(rng.randint(1, 16))]
        grown = NgramProposer(ngram_min, ngram_max, every=True)
        grown.start(context)
        for _ in range(10):
            k = rng.randint(1, 4)
            got = grown.lookup_tree(k, 8, 63)
            fresh = tree(context, k, 8, 63, ngram_min, ngram_max)
            assert (got.tokens, got.parents) == (fresh.tokens, fresh.parents)
            want = continuations(context, k, ngram_min, ngram_max)
            assert len(want) <= 63  # alphabets of at most 5 ids, k <= 4: no cap binds
            found = paths(got)
            assert sorted(map(tuple, found)) == sorted(want)
            assert all(p < i for i, p in enumerate(got.parents))
            chain = grown.lookup(k)
            assert found[len(chain) - 1] == chain if chain else not found
            committed = [rng.randrange(alphabet) for _ in range(rng.randint(1, 3))]
            grown.follow(committed)
            context = context + committed


def test_caps_hold_on_random_contexts():
    rng = random.Random(3)
    for _ in range(200):
        context = [rng.randrange(3) for _ in range(rng.randint(1, 40))]
        k, width, nodes = rng.randint(1, 6), rng.randint(1, 4), rng.randint(1, 12)
        got = tree(context, k, width, nodes, 1, 3)
        assert len(got) <= nodes
        assert all(len(p) <= k for p in paths(got))
        for node in range(-1, len(got)):
            kids = [t for t, p in zip(got.tokens, got.parents) if p == node]
            assert len(kids) <= width and len(set(kids)) == len(kids)
        again = tree(context, k, width, nodes, 1, 3)
        assert (got.tokens, got.parents) == (again.tokens, again.parents)
        chain = NgramProposer(1, 3)
        chain.start(context)
        first = chain.lookup(k)[:nodes]  # the chain is the first branch, as far as the budget goes
        assert paths(got)[len(first) - 1] == first if first else not got


def test_tree_lookup_follows_the_committed_sequence():
    lookup = TreeLookup(2, 2, width=2, nodes=6)
    lookup.start(CONTEXT[:-1])
    assert not lookup.lookup(3)  # ... 6 1: (6, 1) never occurred before
    lookup.follow([2])
    assert lookup.tokens == CONTEXT
    assert lookup.lookup(2).tokens == [6, 1, 3, 5, 4]


# ------------------------------------------------------------------ the host's packing for a round


def host_tree(k: int, width: int, nodes: int) -> HostTree:
    rnd = SimpleNamespace(device=torch.device("cpu"))
    return HostTree(rnd, Tree(k, width, nodes, rnd.device), SimpleNamespace(runners=[]))


def test_pack_writes_the_tree_rows_and_pads_the_rest():
    """Node i is tree row i + 1; padding rows are children of the root that no children table names;
    the target's rows are core/step/rows.tree's over the parents (relative to the prefix)."""
    part = host_tree(3, 2, 10)
    drafted = tree(CONTEXT, k=3, width=2, nodes=10, ngram_min=2, ngram_max=2)  # 8 nodes
    part.staged.copy_(part.pack(drafted))
    assert part.ids.tolist() == drafted.tokens + [0, 0]
    parents = [-1] + [p + 1 for p in drafted.parents] + [0, 0]
    assert part.parents.tolist() == parents
    children = part.children.tolist()
    assert children[0] == [1, 4] and children[4] == [5, 7] and children[8] == [-1, -1]
    assert all(9 not in row and 10 not in row for row in children)  # padding is never a child
    want = rowsets.tree(torch.tensor([[0] + drafted.tokens + [0, 0]]), torch.tensor(parents), 0, levels=4)
    assert torch.equal(part.depth, want.depth[0]) and torch.equal(part.positions, want.positions[0])
    assert torch.equal(part.path, want.tail[0])
    assert part.budget.tolist() == [3]  # the tree's depth: the walk's limit


def test_pack_of_an_empty_lookup_and_bad_trees():
    part = host_tree(2, 2, 4)
    part.staged.copy_(part.pack([]))
    assert part.budget.tolist() == [0] and (part.children == -1).all()
    with pytest.raises(ValueError):
        part.pack(LookupTree([1, 2, 3, 4, 5], [-1, 0, 1, 2, 3]))  # more nodes than the envelope
    with pytest.raises(ValueError):
        part.pack(LookupTree([1, 2, 3], [-1, -1, -1]))  # wider than 2
    with pytest.raises(ValueError):
        part.pack(LookupTree([1, 2, 3], [-1, 0, 1]))  # deeper than k
