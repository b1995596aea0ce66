"""A round's token tree, built on the device in a static envelope (EAGLE-2's construction).

The envelope: depth k, width w, node budget n. Candidates live in a pool of N = w + (k - 1) w²
slots, level by level: level 1 holds the root's w children, each later level the w children of
the frontier before it (w nodes), parent-major. A candidate's score is its path's cumulative draft
log-probability; each level keeps its w best candidates (by score, ties to the lower pool index)
as the frontier the draft expands next. The tree is the n best candidates by score (same ties):
a child's score is its parent's plus a log-probability <= 0 and its pool index is larger, so a
selected node's parent is always selected (the tree is ancestor-closed).

The chain first: the root's first child, its first child and so on down to depth k (the chain a
chain round drafts) rank above every other candidate, in each level's frontier and in the tree, so
a tree always holds its chain and never carries fewer tokens than the chain of its depth (greedy:
the walk follows the chain's nodes as far as a chain round accepts). Why: ranked by cumulative
draft probability alone, a draft whose top probabilities are lower than its acceptance (on the
bench pair, α ≈ 0.87 greedy) spent the budget on shallow siblings, and w = 4 trees of 16 nodes
carried fewer tokens a round than the chain (docs/benchmarks.md, "Token trees on the bench pair (H200)").
Chain membership is a place in the pool (the first of each level's candidates), not a draw's value,
so drawn children keep the condition below.

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

The buffers carry a batch dimension (TreeStack: B trees of one envelope, as a batch's rows hold
them), and the ops build every row of a stack in one call; a Tree is one row, and a tree alone is
a stack of one, so the batch and the single round run one algorithm, each row on its own inputs.
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


def spine(size: int, w: int) -> torch.Tensor:
    """[size] bool: the pool's chain nodes, at 0 (the root's first child) and at the start of each
    level's w x w candidates (the first child of that level's frontier 0, which is the chain's)."""
    i = torch.arange(size)
    return (i == 0) | ((i >= w) & ((i - w) % (w * w) == 0))


class TreeStack:
    """B token trees of one envelope (k, w, n), every buffer stacked [B, ...] (row b: tree b's).
    The ops' tree_expand and tree_select build every row in one call (on a GPU one launch each, a
    program per row): a batch's B trees cost one launch per level, not B. A Tree is one row's view
    (alone: of a stack of one), and its ops are the same call with B = 1, so a row is built as it
    would be alone."""

    def __init__(self, batch: int, k: int, width: int, nodes: int, device: torch.device):
        self.batch, self.k, self.w, self.n = batch, k, width, nodes
        size, z = envelope(k, width), dict(device=device)
        b, w, levels = batch, width, max(k - 1, 1)

        def rows(value: torch.Tensor) -> torch.Tensor:  # static contents, each row its own copy
            return value.expand(b, *value.shape).contiguous()

        self.tokens = torch.zeros(b, size, dtype=torch.long, **z)  # [B, N]
        self.scores = torch.zeros(b, size, dtype=torch.float32, **z)  # [B, N] cumulative log q
        self.parent = torch.full((b, size), -1, dtype=torch.long, **z)  # [B, N] pool index, -1: the root
        self.rank = rows((torch.arange(size, **z) - w).remainder(w))  # [B, N] place among its siblings (static)
        # [B, N] the chain's nodes (static): the root's first child and each one's first child, the
        # first candidate of each level's pool (the module's text, "The chain first")
        self.spine = rows(spine(size, w).to(device))
        self.pool_offset = torch.full((b, size), -1, dtype=torch.long, **z)  # [B, N] draft slot past start
        self.frontier = rows(torch.arange(w, **z).repeat(levels, 1))  # [B, k-1, w] pool indices per level
        tail = torch.zeros(levels, w, levels, dtype=torch.long, **z)
        tail[0, :, 0] = torch.arange(w, **z)
        self.tail = rows(tail)  # [B, k-1, w, k-1] draft offsets
        self.own = rows(torch.arange(w, **z))  # [B, w] frontier indices
        # each frontier's draft rows (level_rows): written as the frontier is chosen
        self.level_ids = torch.zeros(b, levels, 1, w, dtype=torch.long, **z)  # [B, k-1, 1, w]
        self.level_positions = torch.zeros(b, levels, 1, w, dtype=torch.long, **z)
        self.level_slots = torch.zeros(b, levels, 1, w, dtype=torch.long, **z)
        self.level_tail = torch.zeros(b, levels, 1, w, levels, dtype=torch.long, **z)  # [B, k-1, 1, w, k-1]
        self.level_depth = rows(torch.arange(1, levels + 1, **z)[:, None, None].repeat(1, 1, w))  # (static)
        # the selected tree: rows [n + 1] (row 0 the root)
        self.ids = torch.zeros(b, 1, nodes + 1, dtype=torch.long, **z)  # [B, 1, n+1]
        self.parents = torch.full((b, nodes + 1), -1, dtype=torch.long, **z)
        self.children = torch.full((b, nodes + 1, w), -1, dtype=torch.long, **z)  # tree rows, by rank
        self.offset = torch.full((b, nodes + 1), -1, dtype=torch.long, **z)
        self.row_of = torch.zeros(b, size, dtype=torch.long, **z)  # [B, N] pool index -> tree row (0: unselected)
        self.rows_n = rows(torch.arange(1, nodes + 1, **z))
        self.drawn = torch.full((b, nodes + 1, w), -1, dtype=torch.long, **z)  # tree rows' children, drawn
        self.first_child = rows(torch.arange(w, **z))
        self.is_root = rows(torch.arange(nodes + 1, **z) == 0)
        # [B] a row's children are drawn (its Tree's `sampled`): on the device, so that the selection
        # keeps each row's stepped nodes first and writes its `drawn` per row in one launch
        self.draws = torch.zeros(b, dtype=torch.bool, **z)
        # the target's rows over the tree (target_rows): written as the tree is selected
        self.positions = torch.zeros(b, 1, nodes + 1, dtype=torch.long, **z)  # [B, 1, n+1]
        self.slots = torch.zeros(b, 1, nodes + 1, dtype=torch.long, **z)
        self.path = torch.zeros(b, 1, nodes + 1, k + 1, dtype=torch.long, **z)  # [B, 1, n+1, k+1] the tail
        self.depth = torch.zeros(b, 1, nodes + 1, dtype=torch.long, **z)

    def buffers(self) -> dict[str, torch.Tensor]:
        return {name: value for name, value in vars(self).items() if isinstance(value, torch.Tensor)}

    def row(self, b: int) -> TreeStack:
        """Row b as a stack of one: views [1, ...] of this stack's buffers (contiguous: a kernel
        reads a row's slice as a stack of its own)."""
        one = object.__new__(TreeStack)
        one.batch, one.k, one.w, one.n = 1, self.k, self.w, self.n
        for name, value in self.buffers().items():
            setattr(one, name, value[b : b + 1])
        return one


class Tree:
    """One token tree: each buffer its stack's row without the batch dimension. `stack` is that row
    as a stack of one (a TreeStack of its own, or `TreeStack.row` of a batch's), which the ops take:
    a tree alone is built by the batch's op with B = 1."""

    def __init__(self, k: int, width: int, nodes: int, device: torch.device, drawn: bool = False,
                 stack: TreeStack | None = None):
        self.k, self.w, self.n = k, width, nodes
        self.stack = TreeStack(1, k, width, nodes, device) if stack is None else stack
        assert self.stack.batch == 1 and (self.stack.k, self.stack.w, self.stack.n) == (k, width, nodes)
        for name, value in self.stack.buffers().items():
            setattr(self, name, value[0])
        self.sampled = drawn

    @property
    def sampled(self) -> bool:
        """Whether the tree's children are drawn (with noise) rather than its top-w."""
        return self._sampled

    @sampled.setter
    def sampled(self, drawn: bool) -> None:
        self._sampled = bool(drawn)
        self.draws.fill_(self._sampled)  # the device's copy, which the selection reads

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
        ops.tree_expand(self.stack, 0, tokens, logq_tokens, start, root_id)

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
        ops.tree_expand(self.stack, level, tokens, logq_tokens, start)

    def select(self, start: torch.Tensor, ops) -> None:
        """The n best candidates (ties to the lower index), in pool order, as tree rows; with drawn
        children every stepped node first (see the module's text); and the target's rows over them
        past its committed `start` ([1] int64 on the device)."""
        ops.tree_select(self.stack, start)

    def target_rows(self, start: torch.Tensor) -> Rows:
        """The target's rows: the root and the selected nodes after its `start` ([1] int64, the
        tensor select() was given) cached tokens."""
        return Rows(self.ids, self.positions, self.slots, start, self.path, self.depth)


def grow(trees: TreeStack, level: int, tokens: torch.Tensor, logq_tokens: torch.Tensor, start: torch.Tensor,
         root_id: torch.Tensor | None = None) -> None:
    """The reference of the ops' tree_expand, every row of the stack at once: each row's children
    (tokens, log q [B w, w], row b's frontier nodes b w .. b w + w - 1; level 0: the roots', [B, w],
    with root_id [B]) of frontier `level`'s nodes into its pool, its next frontier with its draft
    paths, and its draft rows past its start [B]. Each row's values depend on its own inputs only
    (elementwise ops, per-row gathers and stable sorts): a row is what it is in a stack of one."""
    b, w = trees.batch, trees.w
    tokens, logq_tokens = tokens.reshape(b, -1), logq_tokens.reshape(b, -1)
    if level == 0:
        trees.ids[:, 0, 0].copy_(root_id)
        trees.tokens[:, :w].copy_(tokens)
        trees.scores[:, :w].copy_(logq_tokens)
        trees.pool_offset.fill_(-1)
        trees.pool_offset[:, :w].copy_(trees.own)
        _level_rows(trees, 0, start)
        return
    f = trees.frontier[:, level - 1]  # [B, w]
    base = w + (level - 1) * w * w
    part = slice(base, base + w * w)
    trees.tokens[:, part].copy_(tokens)
    trees.scores[:, part].copy_((trees.scores.gather(1, f)[:, :, None] + logq_tokens.view(b, w, w)).view(b, -1))
    trees.parent[:, part].copy_(f.repeat_interleave(w, dim=1))
    if level + 1 >= trees.k:
        return
    keys = trees.scores[:, part].clone()
    keys[:, 0] = float("inf")  # the chain's node (its parent is frontier 0: the chain's) goes first
    best = keys.sort(dim=-1, descending=True, stable=True).indices[:, :w]  # [B, w] local indices
    trees.frontier[:, level].copy_(base + best)
    trees.pool_offset.scatter_(1, base + best, level * w + trees.own)
    up = best.div(w, rounding_mode="floor")  # each one's parent, as a frontier index
    above = trees.tail[:, level - 1].gather(1, up[:, :, None].expand(-1, -1, trees.tail.shape[-1]))
    trees.tail[:, level, :, :level].copy_(above[:, :, :level])
    trees.tail[:, level, :, level].copy_(level * w + trees.own)
    _level_rows(trees, level, start)


def _level_rows(trees: TreeStack, i: int, start: torch.Tensor) -> None:
    """Frontier i + 1's draft rows: its tokens at position start + i, their slots, their paths."""
    w = trees.w
    trees.level_ids[:, i, 0].copy_(trees.tokens.gather(1, trees.frontier[:, i]))
    trees.level_positions[:, i, 0].copy_((start + i)[:, None].expand(-1, w))
    trees.level_slots[:, i, 0].copy_(start[:, None] + i * w + trees.own)
    trees.level_tail[:, i, 0].copy_(start[:, None, None] + trees.tail[:, i])  # entries past level i + 1: padding


def pick(trees: TreeStack, start: torch.Tensor) -> None:
    """The reference of the ops' tree_select, every row of the stack at once: each row's selected
    rows, their children (and, where the row draws them, drawn children), and the target's rows
    past its start [B] (core/step/rows.tree over the parents)."""
    b, n = trees.batch, trees.n
    keys = torch.where(trees.spine, float("inf"), trees.scores)  # the chain's nodes first
    if trees.k > 1:  # a row of drawn children keeps its stepped nodes first (the module's text)
        keys = torch.where(trees.draws[:, None] & (trees.pool_offset >= 0), float("inf"), keys)
    order = keys.sort(dim=-1, descending=True, stable=True).indices[:, :n]
    chosen = order.sort(dim=-1).values  # [B, n] pool indices, parents first
    trees.row_of.zero_()
    trees.row_of.scatter_(1, chosen, trees.rows_n)
    trees.ids[:, 0, 1:].copy_(trees.tokens.gather(1, chosen))
    up = trees.parent.gather(1, chosen)
    parent_rows = torch.where(up >= 0, trees.row_of.gather(1, up.clamp(min=0)), 0)  # [B, n]
    trees.parents[:, 1:].copy_(parent_rows)
    trees.offset[:, 1:].copy_(trees.pool_offset.gather(1, chosen))
    trees.children.fill_(-1)
    trees.children.view(b, -1).scatter_(1, parent_rows * trees.w + trees.rank.gather(1, chosen), trees.rows_n)
    _drawn(trees)
    rows = tree_rows(trees.ids.view(b, -1), trees.parents, start, levels=trees.k + 1)
    for buffer, value in ((trees.positions, rows.positions), (trees.slots, rows.slots), (trees.path, rows.tail),
                          (trees.depth, rows.depth)):
        buffer.view(value.shape).copy_(value)


def _drawn(trees: TreeStack) -> None:
    """Each expanded row's children in draw order: the pool's w slots from w (1 + its offset)
    (the root's offset is -1: the first w); rows whose children are not drawn keep theirs."""
    b, size = trees.batch, trees.tokens.shape[1]
    first = trees.w * (1 + trees.offset)  # [B, n+1]
    slots = (first[:, :, None] + trees.first_child[:, None, :]).clamp(max=size - 1)  # [B, n+1, w]
    expanded = trees.is_root | (trees.offset >= 0) if trees.k > 1 else trees.is_root
    kids = torch.where(expanded[:, :, None], trees.tokens.gather(1, slots.view(b, -1)).view(slots.shape), -1)
    trees.drawn.copy_(torch.where(trees.draws[:, None, None], kids, trees.drawn))
