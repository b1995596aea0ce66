"""A merged token tree: the hybrid proposer's round where prompt lookup finds continuations
(speculation.tree_width > 1). The round's one tree holds the lookup's trie (core/drafters/ngram.py
lookup_tree, staged by the host as core/round/host_tree.py's StagedLookup) AND the model's tree
(the draft model's TreeDraft, or an EAGLE-3 head's HeadTreeDraft), in the round's one envelope
(k, w, n), verified in one target step. A round whose lookup finds nothing is the model's tree
alone (Mode.MODEL); one that finds continuations is this merged tree (Mode.MERGED) or the lookup's
trie alone (Mode.HOST, the model following: core/round/host_tree.py's ModelFollower), as
core/drafters/merge_rule.py chooses ([speculation] hybrid_merge): one captured program each.

Layout (tree rows): row 0 the root; rows 1 .. m the lookup's m nodes as the host packed them; rows
m + 1 .. m + c the model's c = min(n − m, eligible) best nodes; the rest padding (a child of the
root with token 0 that no children table names, as a lookup tree's). At the root, the lookup's a
children take lanes 0 .. a − 1 and the model's first w − a children (by rank: its top-w order, or
its draw order) lanes a .. w − 1; a model node is eligible where its ancestor below the root is one
of those. The eligible ones rank as the model's own selection ranks them (core/round/tree.py pick:
its chain first, with drawn children every stepped node first, then by cumulative log q; ties to
the lower pool index), so the c kept are ancestor-closed and, for drawn children, a node's place
depends on no draw at it or below it (which a recursive walk needs). The host asks the lookup for
at most w − 1 children at the root and n − 1 nodes (core/engine.py), so the model's best guess
(its chain's first node) is in every merged tree; a trie that takes more (a lookup passed in by a
caller) leaves the model fewer lanes, or none.

Verification (core/sampling/tree_walk.py): greedy and Gumbel coupling follow the target's token
(the first child that holds it: a lookup child before a model child). Rejection coupling: with the
model's top-w children every child is a point mass, the sibling walk as for a lookup tree; with
drawn children the recursive walk with `point` [n + 1, w]: the lookup's lanes (the root's first a,
every lane of a lookup row) are point masses, tried first by the sibling rule, then the model's
draws by the recursive rule against what is left (docs/sampling.md, "Token trees").

The merge runs through the round's ops (tree_merge): this module's `merge` on the references'
table, one Triton launch on the CUDA backend's (gpu/kernels/tree_merge.py), bitwise the same.

Caches: the target's as every tree round's (the commit's compaction). The draft model stepped its
pending pair and its frontier in draft(); whichever part the accepted path went through, its
commit steps once more over the round's first k tokens past the pending pair
(TreeDraft.merged_commit), which leaves the cache a chain's after the same tokens: one k-row draft
step a merged round. The other way, selecting on the device between the model round's compaction
(where a model node won: a copy of m − 2 rows) and that step (where a lookup node won), would
still run the step in every capture (a graph does not branch), so it costs as much and more ops.
An EAGLE-3 head keeps no K/V of the round's nodes: its commit gathers the target's states of the
accepted path (HeadTreeDraft.commit), whoever drafted the path.
"""

from __future__ import annotations

import torch

from specgen.core.round.host_tree import StagedLookup
from specgen.core.round.tree import Tree
from specgen.core.step.rows import tree as tree_rows


class MergedTree(StagedLookup):
    """The lookup's staged trie (StagedLookup: the host's set_drafts) and `model`, the round's
    model tree drafter (TreeDraft, HeadTreeDraft), which builds its tree first; merge() then
    rewrites the round's Tree as the merged one."""

    one_hot = False  # the model's children may be drawn: the walk reads `point`

    def __init__(self, rnd, tree: Tree, model):
        super().__init__(rnd, tree)
        self.model = model
        self.runners = model.runners
        self.point = torch.zeros(tree.n + 1, tree.w, dtype=torch.bool, device=rnd.device)  # [n+1, w]

    def prefill(self, ids: list[int]) -> None:
        self.model.prefill(ids)

    def draft(self) -> None:
        rnd = self.rnd
        self.model.draft()
        rnd.ops.tree_merge(self.tree, self, rnd.target.position.view(1), self.point)
        # the walk's limit: the deeper part's (each is capped at the round's budget)
        torch.maximum(rnd.num_drafts, self.budget.to(rnd.num_drafts.dtype), out=rnd.num_drafts)

    def commit(self, out: torch.Tensor, bookkeep) -> None:
        self.model.merged_commit(out, bookkeep)

    def state(self) -> list[torch.Tensor]:
        return self.model.state()


def merge(tree: Tree, lookup: StagedLookup, start: torch.Tensor, point: torch.Tensor) -> None:
    """Rewrite `tree` (the model's, as its selection left it) as the merged tree of the module's
    text, its target rows past `start` ([1] int64), and point [n + 1, w] (the lookup's lanes).
    Torch ops on the device, no host sync: m and a stay tensors. The reference of the round ops'
    tree_merge (core/round/ops.py), which the Triton table does in one launch
    (gpu/kernels/tree_merge.py: some 120 launches here at k = 3, a few microseconds each in a graph)."""
    n, w, k = tree.n, tree.w, tree.k
    device = tree.ids.device
    rows = torch.arange(n + 1, device=device)
    lanes = torch.arange(w, device=device)
    looked = lookup.children  # [n+1, w] the lookup's rows' children by rank
    m = (looked >= 0).sum()  # its nodes: every one is some row's child
    a = (looked[0] >= 0).sum()  # its children of the root
    keep, count = _model_rows(tree, rows, lanes, n - m, w - a)
    new = m + count  # the kept rows' merged rows: m + 1 on
    dest = torch.where(keep, new, n + 1)  # where each model row goes (n + 1: nowhere)
    mapped = torch.where(keep, new, -1)  # [n+1] model row -> merged row, -1: left out

    def place(base: torch.Tensor, model: torch.Tensor) -> torch.Tensor:
        """base (the lookup's rows, [n + 1, ...]) with the kept model rows written at their rows."""
        out = torch.cat([base, base[:1]])  # a last row for the rows left out
        out.index_copy_(0, dest, model)
        return out[: n + 1]

    root_id = tree.ids[0, :1]
    look_ids = torch.cat([root_id, lookup.ids])  # [n+1] the lookup's rows (padding: 0)
    kids = tree.children
    kid_rows = torch.where(kids >= 0, mapped[kids.clamp(min=0)], -1)  # [n+1, w] model children, merged rows
    ups = tree.parents
    up_rows = torch.where(ups > 0, mapped[ups.clamp(min=0)], 0)
    look_kid_ids = torch.where(looked >= 0, look_ids[looked.clamp(min=0)], -1)
    shift = (lanes - a).clamp(min=0)
    ids = place(look_ids, tree.ids[0])
    parents = place(lookup.parents, up_rows)
    children = place(looked, kid_rows)
    children[0] = torch.where(lanes < a, looked[0], kid_rows[0][shift])
    offset = place(torch.full_like(tree.offset, -1), tree.offset)
    drawn = place(look_kid_ids, tree.drawn)
    drawn[0] = torch.where(lanes < a, look_kid_ids[0], tree.drawn[0][shift])
    row_of = torch.where(tree.row_of > 0, mapped[tree.row_of].clamp(min=0), 0)  # pool -> merged row
    target = tree_rows(ids[None], parents[None], start, levels=k + 1)
    for buffer, value in ((tree.ids[0], ids), (tree.parents, parents), (tree.children, children),
                          (tree.offset, offset), (tree.drawn, drawn), (tree.row_of, row_of), (point, looked >= 0),
                          (tree.positions, target.positions), (tree.slots, target.slots), (tree.path, target.tail),
                          (tree.depth, target.depth)):
        buffer.view(value.shape).copy_(value)


def _model_rows(tree: Tree, rows: torch.Tensor, lanes: torch.Tensor, room: torch.Tensor,
                root_lanes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep [n+1] bool, count [n+1]: the kept rows up to each) of the model's rows: the best
    `room` of those under its first `root_lanes` children of the root, ranked as its selection
    ranks them, kept in row order (parents first)."""
    n, w, k = tree.n, tree.w, tree.k
    size = tree.tokens.shape[0]
    pool = torch.zeros(n + 1, dtype=torch.long, device=rows.device)
    pool.scatter_(0, tree.row_of, torch.arange(size, device=rows.device))  # row -> pool index (row 0: junk)
    first = tree.spine
    if k > 1:  # drawn children: every stepped node first (core/round/tree.py pick)
        first = first | (tree.draws & (tree.pool_offset >= 0))
    key = torch.where(first, float("inf"), tree.scores)[pool]
    below = rows  # each row's ancestor below the root
    for _ in range(k - 1):
        up = tree.parents[below]
        below = torch.where(up > 0, up, below)
    lane = torch.full((n + 2,), w, dtype=torch.long, device=rows.device)
    lane.scatter_(0, torch.where(tree.children[0] >= 0, tree.children[0], n + 1), lanes)
    eligible = (rows > 0) & (lane[below] < root_lanes)
    order = key.sort(descending=True, stable=True).indices  # ties: the lower row (pool order)
    order = order[(~eligible[order]).int().sort(stable=True).indices]  # the eligible first
    rank = torch.empty_like(order).scatter_(0, order, rows)
    keep = eligible & (rank < room)
    return keep, keep.long().cumsum(0)
