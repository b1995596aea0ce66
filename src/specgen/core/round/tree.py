"""A round's token tree, built on the device in a static envelope (EAGLE-2's construction).

The envelope: depth k, width w, node budget n. Candidates live in a pool of N = w + (k - 1) w²
slots, level by level: level 1 holds the root's w children, each later level the w children of
the frontier before it (w nodes), parent-major. A candidate's score is its path's cumulative draft
log-probability; each level keeps its w best candidates (by score, ties to the lower pool index)
as the frontier the draft expands next. The tree is the n best candidates by score (same ties):
a child's score is its parent's plus a log-probability <= 0 and its pool index is larger, so a
selected node's parent is always selected (the tree is ancestor-closed).

Children are the top-w of the draft's warped q at their parent, a function of the committed
sequence alone: no draw decides them, which is what lets rejection verification walk siblings
(core/sampling/tree_walk.py). Every buffer is allocated here, once; a round only writes them.

Tree rows: row 0 is the root (the round's `last`), row 1 + i the i-th selected candidate in pool
order (parents before children). Nodes the draft stepped (the frontiers of levels 1 .. k - 1) keep
their K/V in the draft's cache at `start + (level - 1) w + f` (f: the frontier index); `offset`
holds that offset per tree row (-1: never stepped), which the commit's compaction reads.
"""

from __future__ import annotations

import torch

from specgen.core.settings import tree_envelope as envelope
from specgen.core.step.rows import Rows, tree as tree_rows


class Tree:
    def __init__(self, k: int, width: int, nodes: int, device: torch.device):
        self.k, self.w, self.n = k, width, nodes
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
        # the selected tree: rows [n + 1] (row 0 the root)
        self.ids = torch.zeros(1, nodes + 1, dtype=torch.long, **z)  # [1, n+1]
        self.parents = torch.full((nodes + 1,), -1, dtype=torch.long, **z)
        self.children = torch.full((nodes + 1, w), -1, dtype=torch.long, **z)  # tree rows, by rank
        self.offset = torch.full((nodes + 1,), -1, dtype=torch.long, **z)
        self.row_of = torch.zeros(size, dtype=torch.long, **z)  # [N] pool index -> tree row (0: unselected)
        self.rows_n = torch.arange(1, nodes + 1, **z)

    def root(self, root_id: torch.Tensor, logq: torch.Tensor) -> None:
        """Level 1 from the draft's log q [1, V] after the root (root_id [1], the round's `last`)."""
        w = self.w
        self.ids[0, :1].copy_(root_id)
        top = logq[0].topk(w)
        self.tokens[:w].copy_(top.indices)
        self.scores[:w].copy_(top.values)
        self.pool_offset.fill_(-1)
        self.pool_offset[:w].copy_(self.own)

    def level_rows(self, level: int, start: torch.Tensor) -> Rows:
        """The draft's rows for stepping frontier `level` (1 .. k - 1) past its committed `start` ([1]
        int64 on the device): each node after its ancestors, at position start + level - 1."""
        w, f = self.w, self.frontier[level - 1]
        positions = (start + (level - 1)).expand(1, w)
        slots = (start + (level - 1) * w + self.own)[None]  # [1, w]
        tail = (start + self.tail[level - 1])[None]  # [1, w, k-1]: entries past `level` are padding
        depth = torch.full((1, w), level, dtype=torch.long, device=start.device)
        return Rows(self.tokens[f][None], positions, slots, start, tail, depth)

    def expand(self, level: int, logq: torch.Tensor) -> None:
        """Level + 1's candidates from the draft's log q [w, V] at frontier `level`'s nodes, and the
        next frontier (its w best, ties to the lower index) with its nodes' draft paths."""
        w, f = self.w, self.frontier[level - 1]
        base = w + (level - 1) * w * w
        top = logq.topk(w, dim=-1)  # [w, w] each frontier node's children, best first
        part = slice(base, base + w * w)
        self.tokens[part].copy_(top.indices.reshape(-1))
        self.scores[part].copy_((self.scores[f][:, None] + top.values).reshape(-1))
        self.parent[part].copy_(f.repeat_interleave(w))
        if level + 1 >= self.k:
            return
        best = self.scores[part].sort(descending=True, stable=True).indices[:w]  # [w] local indices
        self.frontier[level].copy_(base + best)
        self.pool_offset[base + best] = level * w + self.own
        up = best.div(w, rounding_mode="floor")  # each one's parent, as a frontier index
        self.tail[level, :, :level].copy_(self.tail[level - 1, up, :level])
        self.tail[level, :, level].copy_(level * w + self.own)

    def select(self) -> None:
        """The n best candidates (ties to the lower index), in pool order, as tree rows."""
        order = self.scores.sort(descending=True, stable=True).indices[: self.n]
        chosen = order.sort().values  # [n] pool indices, parents first
        self.row_of.zero_()
        self.row_of[chosen] = self.rows_n
        self.ids[0, 1:].copy_(self.tokens[chosen])
        up = self.parent[chosen]
        parent_rows = torch.where(up >= 0, self.row_of[up.clamp(min=0)], 0)  # [n]
        self.parents[1:].copy_(parent_rows)
        self.offset[1:].copy_(self.pool_offset[chosen])
        self.children.fill_(-1)
        self.children.view(-1).index_put_((parent_rows * self.w + self.rank[chosen],), self.rows_n)

    def target_rows(self, start: torch.Tensor) -> Rows:
        """The target's rows: the root and the selected nodes after its `start` ([1] int64) cached tokens."""
        return tree_rows(self.ids, self.parents, start, levels=self.k + 1)
