"""A token tree the host drafted: prompt lookup's trie (core/drafters/ngram.py lookup_tree), the
drafter part of a TreeRound whose proposer is `ngram` (no draft model, no head), and of the
hybrid proposer's rounds that verify the lookup's trie alone, its model following (ModelFollower).
The hybrid proposer's other rounds where the lookup finds continuations take the same staged trie
(StagedLookup) as the first part of a merged tree, whose other part is the model's tree
(core/round/merged_tree.py); core/drafters/merge_rule.py chooses between the two.

Before each round the host packs the tree into one int64 buffer and copies it to the device in one
copy: the nodes' tokens and parents as tree rows (row 0 the root, the round's `last`; row 1 + i
node i), each row's children by rank, and the target's rows relative to its committed prefix
(core/step/rows.tree over the parents, computed on the host: the tree's shape is known there). The
body copies the tree into the round's Tree buffers and adds the target's position to the rows,
so a round reads nothing the host wrote into the Tree itself (a capture's warm-up may replay the
body: it is idempotent).

The envelope is static: a lookup's m <= n nodes fill rows 1 .. m; rows m + 1 .. n are padding, a
child of the root with token 0 that no children table names, so no walk ever follows one. A
padding row costs its row in the target's step and nothing else (its key and value land past the
accepted path, which the commit's compaction overwrites or leaves behind the position). A lookup
that found nothing would be n padding rows: the ngram proposer's round runs its empty program
then (Mode.EMPTY, core/round/tree_round.py), a HostTree of its own over a tree of the root alone,
packed once, so the target steps over one row as target-only's does (the hybrid proposer's round
is its model's tree alone then).

The children are a deterministic function of the committed sequence, so q is one-hot: greedy and
Gumbel coupling follow the target's token, rejection coupling walks the siblings
(core/sampling/tree_walk.py), all lossless. `num_drafts` is the tree's depth (the walk's limit:
the host capped the lookup at the round's budget, max_tokens included).
"""

from __future__ import annotations

import torch

from specgen.core.drafters.ngram import LookupTree
from specgen.core.round.staging import host_tensor
from specgen.core.round.tree import Tree


class StagedLookup:
    """A lookup's tree staged on the device, as the host packed it (one copy a round): the
    staging HostTree drafts from, and the lookup's part of a merged tree (core/round/merged_tree.py)."""

    def __init__(self, rnd, tree: Tree):
        self.rnd, self.tree = rnd, tree
        k, w, n = tree.k, tree.w, tree.n
        self.sizes = packed_sizes(k, w, n)
        self.staged = torch.zeros(sum(self.sizes), dtype=torch.long, device=rnd.device)
        ids, parents, children, depth, positions, path, budget = self.staged.split(self.sizes)
        self.ids, self.parents, self.depth, self.positions, self.budget = ids, parents, depth, positions, budget
        self.children = children.view(n + 1, w)
        self.path = path.view(n + 1, k + 1)
        # an empty tree until the host sets one: a capture's warm-ups run the body before any
        # set_drafts, and zeros are no tree (depth 0 indexes the Gumbel noise row -1)
        self.staged.copy_(self.pack([]))

    def pack(self, drafted: LookupTree | list) -> torch.Tensor:
        """The staged buffer's contents on the host for a lookup's tree (an empty one: [] too)."""
        return pack_tree(drafted, self.tree.k, self.tree.w, self.tree.n)

    def set_drafts(self, drafted: LookupTree | list) -> None:
        """The next round's tree (one host-to-device copy)."""
        self.staged.copy_(self.pack(drafted), non_blocking=True)


class HostTree(StagedLookup):
    """Drafts the host wrote as a tree. `follower`: the ngram proposer's NoDraft, which prefills
    the target (`follow()` before the target's step and `follow_commit` at the round's commit
    are its parts of the round: nothing to follow without a model)."""

    one_hot = True
    point = None  # every child is a point mass: the sibling walk (core/sampling/tree_walk.py)

    def __init__(self, rnd, tree: Tree, follower):
        super().__init__(rnd, tree)
        self.follower = follower
        self.runners = follower.runners
        self.slots = torch.arange(tree.n + 1, device=rnd.device)  # row r's slot past the prefix (static)

    def prefill(self, ids: list[int]) -> None:
        self.follower.prefill(ids)

    def draft(self) -> None:
        self.follower.follow()
        rnd, tree = self.rnd, self.tree
        start = rnd.target.position
        tree.ids[0, :1].copy_(rnd.feed[0, :1])
        tree.ids[0, 1:].copy_(self.ids)
        tree.parents.copy_(self.parents)
        tree.children.copy_(self.children)
        tree.depth[0].copy_(self.depth)
        torch.add(self.positions, start, out=tree.positions[0])
        torch.add(self.slots, start, out=tree.slots[0])
        torch.add(self.path, start, out=tree.path[0])
        rnd.num_drafts.copy_(self.budget)

    def commit(self, out: torch.Tensor, bookkeep) -> None:
        """The follower's part around the round's bookkeeping (TreeRound.commit)."""
        self.follower.follow_commit(out, bookkeep)

    def state(self) -> list[torch.Tensor]:
        return self.follower.state()


class ModelFollower:
    """The model's part of a hybrid round over the lookup's trie alone (Mode.HOST where the hybrid
    proposer drafts trees: core/drafters/merge_rule.py chooses it over the merged tree): the model
    (TreeDraft, HeadTreeDraft) drafts nothing, `follow()` before the target's step and
    `lookup_commit` at the commit keep its cache a chain's after the round's tokens."""

    def __init__(self, model):
        self.model = model
        self.runners = model.runners

    def prefill(self, ids: list[int]) -> None:
        self.model.prefill(ids)

    def follow(self) -> None:
        self.model.follow()

    def follow_commit(self, out: torch.Tensor, bookkeep) -> None:
        self.model.lookup_commit(out, bookkeep)

    def state(self) -> list[torch.Tensor]:
        return self.model.state()


def packed_sizes(k: int, w: int, n: int) -> list[int]:
    """The parts of pack_tree's tensor: the nodes' ids [n]; the tree rows' parents [n + 1], children
    by rank [(n + 1) w], depths [n + 1], positions [n + 1] and tails [(n + 1)(k + 1)] relative to the
    committed prefix; the tree's depth [1] (the walk's limit)."""
    return [n, n + 1, (n + 1) * w, n + 1, n + 1, (n + 1) * (k + 1), 1]


def pack_tree(drafted: LookupTree | list, k: int, w: int, n: int) -> torch.Tensor:
    """A lookup's tree (an empty one: [] too) in an envelope of depth k, width w and n nodes, as
    one int64 host tensor of packed_sizes' parts: what HostTree stages."""
    return host_tensor(pack_lists(drafted, k, w, n))


def pack_lists(drafted: LookupTree | list, k: int, w: int, n: int) -> list[int]:
    """pack_tree's values as a list: a batch's rows (core/round/batch_lookup_tree.py) join theirs
    into one host tensor. Lists, then one tensor: the host runs this between a round's sync and the
    next launch, where the target waits on it, and core/step/rows.tree's torch ops cost 0.3-0.4 ms
    a round on an H200 machine's host (142 us on a 2-core VM) for what these loops do in 25 us (its
    depths and tails are what rows.tree gives this tree at start 0: tests/core/round/test_host_tree.py)."""
    tokens, parents = (drafted.tokens, drafted.parents) if drafted else ([], [])
    m = len(tokens)
    if m > n or len(parents) != m:
        raise ValueError(f"a host tree of {m} nodes ({len(parents)} parents) in an envelope of {n}")
    rows = [-1] + [p + 1 for p in parents] + [0] * (n - m)  # parents as tree rows; padding: the root's
    children = [-1] * ((n + 1) * w)
    ranks = [0] * (n + 1)
    paths = [[0]]  # each row's tail: its ancestors from the root down to itself
    for row in range(1, n + 1):
        up = rows[row]
        if row <= m:
            if not 0 <= up < row or ranks[up] >= w:
                raise ValueError(f"node {row - 1}: parent {up - 1} is not an earlier node with room for a child")
            children[up * w + ranks[up]] = row
            ranks[up] += 1
        paths.append(paths[up] + [row])
    deepest = max(len(path) for path in paths[: m + 1]) - 1  # below the root
    if deepest > k:
        raise ValueError(f"a host tree of depth {deepest} in an envelope of depth {k}")
    depth = [len(path) for path in paths]  # rows each row sees: the root's 1
    tails = [slot for path in paths for slot in path + path[-1:] * (k + 1 - len(path))]  # padded with itself
    ids = list(tokens) + [0] * (n - m)
    positions = [d - 1 for d in depth]
    return ids + rows + children + depth + positions + tails + [deepest]
