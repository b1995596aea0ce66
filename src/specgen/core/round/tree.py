"""A round's token tree, built on the device in a static envelope (EAGLE-2's construction).

The envelope: depth k, width w, node budget n. Candidates live in a pool of N = w + (k - 1) w²
slots, level by level: level 1 holds the root's w children, each later level the w children of
the frontier before it (w nodes), parent-major. A candidate's score is its path's cumulative draft
log-probability; each level keeps its w best candidates (by score, ties to the lower pool index)
as the frontier the draft expands next. The tree is the n best candidates by score (same ties):
a child's score is its parent's plus a log-probability <= 0 and its pool index is larger, so a
selected node's parent is always selected (the tree is ancestor-closed).

Children are the top-w of the draft's warped q at their parent, a function of the committed
sequence alone (rejection verification then walks siblings, core/sampling/tree_walk.py), or, where
a round passes noise, w draws from q without replacement: the top-w of log q − log E (E Exp(1),
the Gumbel-top-w trick), in draw order; larger keys first, equal keys to the lower token id (the
round's ops table's `tree_children`: draw_children below is the reference, gpu/kernels/topw.py
the kernels). Scores stay the cumulative log q of the chosen tokens.

Drawn children are verified by recursive rejection, which is exact only if a node's place in the
tree does not depend on the draws at it or below it. The frontiers satisfy this (a level's
frontier is chosen from scores drawn at the levels above), the n best overall do not (a deeper
candidate's existence depends on which nodes the draws below a node pushed out of a frontier). So
a tree of drawn children keeps every stepped node first (level by level, then by pool index) and
fills the rest of its budget with the best other candidates, which have no draws below them.
Every buffer is allocated here, once; a round only writes them.

Tree rows: row 0 is the root (the round's `last`), row 1 + i the i-th selected candidate in pool
order (parents before children). Nodes the draft stepped (the frontiers of levels 1 .. k - 1) keep
their K/V in the draft's cache at `start + (level - 1) w + f` (f: the frontier index); `offset`
holds that offset per tree row (-1: never stepped), which the commit's compaction reads.
`drawn` [n + 1, w] holds each expanded row's (the root's, each stepped node's) w children's tokens
in draw order, selected or not (-1 for the other rows): recursive rejection tries them all.

Both steps' rows are written with the tree, into buffers of their own: a level's frontier rows for
the draft (`level_rows`) when the level before it is expanded, the target's rows (`target_rows`)
when the tree is selected. The writing is the round's ops table's (core/round/ops.py): `grow` and
`pick` below are the references, gpu/kernels/tree_build.py does each in one launch.
"""

from __future__ import annotations

import torch

from specgen.core.settings import tree_envelope as envelope
from specgen.core.step.rows import Rows, tree as tree_rows


def draw_children(logq: torch.Tensor, noise: torch.Tensor | None, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [R, w], their log q [R, w]) of each row of log q [R, V]: its top-w, or with Exp(1)
    noise [R or 1, V] the top-w of log q − log E, w draws from q without replacement in draw order.
    The reference of the ops' tree_children (gpu/kernels/topw.py does it in two launches).

    Order: the larger key first, equal keys by the lower token id (the first w of a stable
    descending sort), so that the children are one function of (log q, E) on every backend:
    torch.topk promises no order among equal keys, and a draft's log q ties (a row's masked ids are
    all -inf). Drawn children are unaffected in law: continuous noise ties with probability 0.
    Keys are never NaN (the warp rejects NaN logits, E > 0 is finite) and w <= V."""
    key = logq if noise is None else logq - noise.log()
    tokens = first_w(key, w)
    return tokens, logq.gather(-1, tokens)


def first_w(key: torch.Tensor, w: int) -> torch.Tensor:
    """The ids [R, w] of each row's w largest keys [R, V], larger first, ties to the lower id.
    Not a full sort (some 50 times topk's time over a 128k vocabulary on a CPU): t, the w-th
    largest key, is the same whatever topk's tie order; every id above t is in (fewer than w of
    them), the lowest ids equal to t fill the rest; then the w are ordered."""
    t = key.topk(w, dim=-1).values[:, -1:]  # [R, 1]
    above, tied = key > t, key == t
    room = w - above.sum(-1, keepdim=True)
    chosen = above | (tied & (tied.cumsum(-1) <= room))  # exactly w per row
    vocab = key.shape[-1]
    rank = vocab - torch.arange(vocab, device=key.device)  # distinct, larger for lower ids
    ids = (chosen * rank).topk(w, dim=-1).indices  # the chosen, by ascending id (distinct keys)
    order = key.gather(-1, ids).sort(dim=-1, descending=True, stable=True).indices
    return ids.gather(-1, order)


class Tree:
    def __init__(self, k: int, width: int, nodes: int, device: torch.device, drawn: bool = False):
        self.k, self.w, self.n, self.sampled = k, width, nodes, drawn
        size, z = envelope(k, width), dict(device=device)
        w, levels = width, max(k - 1, 1)
        self.tokens = torch.zeros(size, dtype=torch.long, **z)  # [N]
        self.scores = torch.zeros(size, dtype=torch.float32, **z)  # [N] cumulative log q
        self.parent = torch.full((size,), -1, dtype=torch.long, **z)  # [N] pool index, -1: the root
        self.rank = (torch.arange(size, **z) - w).remainder(w)  # [N] place among its siblings (static)
        self.pool_offset = torch.full((size,), -1, dtype=torch.long, **z)  # [N] draft slot past start
        self.frontier = torch.arange(w, **z).repeat(levels, 1)  # [k-1, w] pool indices per level
        self.tail = torch.zeros(levels, w, levels, dtype=torch.long, **z)  # [k-1, w, k-1] draft offsets
        self.tail[0, :, 0] = torch.arange(w, **z)
        self.own = torch.arange(w, **z)  # [w] frontier indices
        # each frontier's draft rows (level_rows): written as the frontier is chosen
        self.level_ids = torch.zeros(levels, 1, w, dtype=torch.long, **z)  # [k-1, 1, w]
        self.level_positions = torch.zeros(levels, 1, w, dtype=torch.long, **z)
        self.level_slots = torch.zeros(levels, 1, w, dtype=torch.long, **z)
        self.level_tail = torch.zeros(levels, 1, w, levels, dtype=torch.long, **z)  # [k-1, 1, w, k-1]
        self.level_depth = torch.arange(1, levels + 1, **z)[:, None, None].repeat(1, 1, w)  # (static)
        # the selected tree: rows [n + 1] (row 0 the root)
        self.ids = torch.zeros(1, nodes + 1, dtype=torch.long, **z)  # [1, n+1]
        self.parents = torch.full((nodes + 1,), -1, dtype=torch.long, **z)
        self.children = torch.full((nodes + 1, w), -1, dtype=torch.long, **z)  # tree rows, by rank
        self.offset = torch.full((nodes + 1,), -1, dtype=torch.long, **z)
        self.row_of = torch.zeros(size, dtype=torch.long, **z)  # [N] pool index -> tree row (0: unselected)
        self.rows_n = torch.arange(1, nodes + 1, **z)
        self.drawn = torch.full((nodes + 1, w), -1, dtype=torch.long, **z)  # tree rows' children, drawn
        self.first_child = torch.arange(w, **z)
        self.is_root = torch.arange(nodes + 1, **z) == 0
        # the target's rows over the tree (target_rows): written as the tree is selected
        self.positions = torch.zeros(1, nodes + 1, dtype=torch.long, **z)  # [1, n+1]
        self.slots = torch.zeros(1, nodes + 1, dtype=torch.long, **z)
        self.path = torch.zeros(1, nodes + 1, k + 1, dtype=torch.long, **z)  # [1, n+1, k+1] the tail
        self.depth = torch.zeros(1, nodes + 1, dtype=torch.long, **z)

    def _children(self, logq: torch.Tensor, noise: torch.Tensor | None, ops) -> tuple[torch.Tensor, torch.Tensor]:
        if noise is None and self.sampled:
            raise ValueError("a tree of drawn children needs noise to draw them")
        return ops.tree_children(logq, noise, self.w)

    def root(self, root_id: torch.Tensor, logq: torch.Tensor, noise: torch.Tensor | None, start: torch.Tensor,
             ops) -> None:
        """Level 1 from the draft's log q [1, V] after the root (root_id [1], the round's `last`);
        noise [1, V]: the Exp(1) row its children are drawn with (None: its top-w). start ([1]
        int64 on the device): the draft's committed prefix, the root included; ops: the round's."""
        tokens, logq_tokens = self._children(logq, noise, ops)
        ops.tree_expand(self, 0, tokens, logq_tokens, start, root_id)

    def level_rows(self, level: int, start: torch.Tensor) -> Rows:
        """The draft's rows for stepping frontier `level` (1 .. k - 1) past its committed `start` ([1]
        int64 on the device, as root() and expand() were given): each node after its ancestors, at
        position start + level - 1. Views of buffers the tree's construction wrote."""
        i = level - 1
        return Rows(self.level_ids[i], self.level_positions[i], self.level_slots[i], start, self.level_tail[i],
                    self.level_depth[i])

    def expand(self, level: int, logq: torch.Tensor, noise: torch.Tensor | None, start: torch.Tensor,
               ops) -> None:
        """Level + 1's candidates from the draft's log q [w, V] at frontier `level`'s nodes (noise
        [w or 1, V]: the Exp(1) rows they are drawn with), and the next frontier (its w best, ties
        to the lower index) with its nodes' draft paths and rows past `start`."""
        tokens, logq_tokens = self._children(logq, noise, ops)  # [w, w] each frontier node's children
        ops.tree_expand(self, level, tokens, logq_tokens, start)

    def select(self, start: torch.Tensor, ops) -> None:
        """The n best candidates (ties to the lower index), in pool order, as tree rows; with drawn
        children every stepped node first (see the module's text); and the target's rows over them
        past its committed `start` ([1] int64 on the device)."""
        ops.tree_select(self, start)

    def target_rows(self, start: torch.Tensor) -> Rows:
        """The target's rows: the root and the selected nodes after its `start` ([1] int64, the
        tensor select() was given) cached tokens."""
        return Rows(self.ids, self.positions, self.slots, start, self.path, self.depth)


def grow(tree: Tree, level: int, tokens: torch.Tensor, logq_tokens: torch.Tensor, start: torch.Tensor,
         root_id: torch.Tensor | None = None) -> None:
    """The reference of the ops' tree_expand: the children (tokens, log q [w, w]; level 0: the
    root's, [1, w], with root_id [1]) of frontier `level`'s nodes into the pool, the next
    frontier with its draft paths, and its draft rows past `start`."""
    w = tree.w
    if level == 0:
        tree.ids[0, :1].copy_(root_id)
        tree.tokens[:w].copy_(tokens[0])
        tree.scores[:w].copy_(logq_tokens[0])
        tree.pool_offset.fill_(-1)
        tree.pool_offset[:w].copy_(tree.own)
        _level_rows(tree, 0, start)
        return
    f = tree.frontier[level - 1]
    base = w + (level - 1) * w * w
    part = slice(base, base + w * w)
    tree.tokens[part].copy_(tokens.reshape(-1))
    tree.scores[part].copy_((tree.scores[f][:, None] + logq_tokens).reshape(-1))
    tree.parent[part].copy_(f.repeat_interleave(w))
    if level + 1 >= tree.k:
        return
    best = tree.scores[part].sort(descending=True, stable=True).indices[:w]  # [w] local indices
    tree.frontier[level].copy_(base + best)
    tree.pool_offset[base + best] = level * w + tree.own
    up = best.div(w, rounding_mode="floor")  # each one's parent, as a frontier index
    tree.tail[level, :, :level].copy_(tree.tail[level - 1, up, :level])
    tree.tail[level, :, level].copy_(level * w + tree.own)
    _level_rows(tree, level, start)


def _level_rows(tree: Tree, i: int, start: torch.Tensor) -> None:
    """Frontier i + 1's draft rows: its tokens at position start + i, their slots, their paths."""
    w = tree.w
    tree.level_ids[i, 0].copy_(tree.tokens[tree.frontier[i]])
    tree.level_positions[i].copy_((start + i).expand(1, w))
    tree.level_slots[i, 0].copy_(start + i * w + tree.own)
    tree.level_tail[i, 0].copy_(start + tree.tail[i])  # entries past level i + 1: padding


def pick(tree: Tree, start: torch.Tensor) -> None:
    """The reference of the ops' tree_select: the selected rows, their children (and drawn
    children), and the target's rows past `start` (core/step/rows.tree over the parents)."""
    keys = tree.scores
    if tree.sampled and tree.k > 1:
        keys = torch.where(tree.pool_offset >= 0, float("inf"), tree.scores)
    order = keys.sort(descending=True, stable=True).indices[: tree.n]
    chosen = order.sort().values  # [n] pool indices, parents first
    tree.row_of.zero_()
    tree.row_of[chosen] = tree.rows_n
    tree.ids[0, 1:].copy_(tree.tokens[chosen])
    up = tree.parent[chosen]
    parent_rows = torch.where(up >= 0, tree.row_of[up.clamp(min=0)], 0)  # [n]
    tree.parents[1:].copy_(parent_rows)
    tree.offset[1:].copy_(tree.pool_offset[chosen])
    tree.children.fill_(-1)
    tree.children.view(-1).index_put_((parent_rows * tree.w + tree.rank[chosen],), tree.rows_n)
    if tree.sampled:
        _drawn(tree)
    rows = tree_rows(tree.ids, tree.parents, start, levels=tree.k + 1)
    for buffer, value in ((tree.positions, rows.positions), (tree.slots, rows.slots), (tree.path, rows.tail),
                          (tree.depth, rows.depth)):
        buffer.copy_(value)


def _drawn(tree: Tree) -> None:
    """Each expanded row's children in draw order: the pool's w slots from w (1 + its offset)
    (the root's offset is -1: the first w)."""
    first = tree.w * (1 + tree.offset)  # [n+1]
    slots = (first[:, None] + tree.first_child).clamp(max=tree.tokens.shape[0] - 1)
    expanded = tree.is_root | (tree.offset >= 0) if tree.k > 1 else tree.is_root
    tree.drawn.copy_(torch.where(expanded[:, None], tree.tokens[slots], -1))
