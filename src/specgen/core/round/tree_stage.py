"""What a tree round tells the host of its tree, besides its ids: which branch won, and with insight
the whole tree (core/insight.py reads both).

    ranks        every tree round: the sibling index of each accepted node (0: its parent's first
                 child, the draft's top-1 or its first draw; -1 past the accepted nodes), staged
                 with the ids by the round's commit (core/sampling/bookkeeping.py's tree_commit).
                 The chain inside the tree is the path of first children, so these say what the
                 tree bought over that chain each round.
    source       hybrid runs: which drafter's nodes the accepted path took (path_source), read by
                 the host from the ranks: in a merged round (core/round/merged_tree.py) the root's
                 lanes 0 .. a - 1 are the lookup's a children and a row's children are all of its
                 own part, so the path is the lookup's iff its first node's lane is below a, which
                 the host knows from the trie it staged: nothing more to stage or sync.
    TreeInsight  with insight: the tree as rows (token, parent row, depth, sibling index, the
                 target's p and the draft's q of the row's token at its parent, the entropy of p
                 at the row), the accepted path's rows, and p and q of a draw the walk took outside
                 the tree, in one float32 buffer: token ids and rows are exact in float32 below
                 2^24, and the decode loop copies one float buffer per round with its ids.

TreeInsight is a few gathers over [n + 1, w] tables, with no host sync, into buffers allocated
once: captured with the round on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.core.round.stage import NoStage
from specgen.core.sampling.warp import logprobs_from_logits

EXACT = 1 << 24  # integers float32 holds exactly: token ids and tree rows below it


@dataclass(frozen=True)
class TreeView:
    """One round's tree as the host read it. Rows: 0 the root, then the selected nodes, parents
    first (rows that are no node of the tree, a lookup tree's padding, left out and the others
    renumbered). Each row's token, parent (-1: the root), depth below the root, sibling index
    (0: the first child; -1: the root), the target's p and the draft's q of its token at its
    parent (q is 1 for the host's drafts), and the target's entropy at the row (nats); `path`:
    the accepted nodes' rows. A draw the walk took outside the tree is no row: `taken` holds its
    (token, p, q, sibling index)."""

    tokens: list[int]
    parents: list[int]
    depth: list[int]
    ranks: list[int]
    p: list[float]
    q: list[float]
    entropy: list[float]
    path: list[int]
    taken: list | None = None

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def first_child(self, row: int) -> int | None:
        return next((r for r in range(row + 1, len(self.tokens))
                     if self.parents[r] == row and self.ranks[r] == 0), None)

    def shown(self, k: int) -> list[int]:
        """The rows the walk reports as drafted (core/sampling/tree_walk.py's `shown`, k of
        them): the accepted nodes, then from where it stopped the first child below, the last
        repeated where a branch ends."""
        rows, follow = [], 0
        for depth in range(k):
            if depth < len(self.path):
                follow = self.path[depth]
            else:
                below = self.first_child(follow)
                follow = follow if below is None else below
            rows.append(follow)
        return rows


def path_source(ranks: list[int], accepted: int, lookup) -> tuple[str, int]:
    """(whose nodes a hybrid round's accepted path took: "lookup", "model" or "none" where it
    accepted nothing, the lookup's node count m: its rows 1 .. m of the tree) from the accepted
    nodes' sibling indices `ranks` and the LookupTree the host staged (a model round's: empty).
    The walks try the lookup's lanes first (a target's token that both parts drafted is the
    lookup's node, and a rejected point mass leaves its token no mass for a model sibling), and
    the commit's rank names the first lane holding the token; a draw taken outside the tree is
    the model's (the lookup's nodes are point masses: none is drawn), so an accepted path whose
    ranks are fewer than its tokens, or whose first lane is a or more, is the model's."""
    if accepted == 0:
        return "none", len(lookup)
    a = sum(1 for up in lookup.parents if up < 0)  # the lookup's children of the root: lanes 0 .. a - 1
    return ("lookup" if ranks and ranks[0] < a else "model"), len(lookup)


class NoTreeStage(NoStage):
    """A tree round without insight: the ids (and their ranks) only."""

    def stage(self, *parts) -> None:
        pass

    def view(self, floats: list[float]) -> None:
        return None


class TreeInsight(NoTreeStage):
    """stage_f = [token | parent | depth | rank | p | q | H] (n + 1 each) | path rows (k) | a
    draw taken outside the tree: token (-1: none), p, q, sibling index. read() gives the chain
    insight's (p, q, entropy) per drafted id, view() the TreeView."""

    staged = True

    def __init__(self, rnd, env, out: torch.Tensor | None = None):
        """env: the round's envelope (core/round/tree_round.py: its tree, the target's rows of
        logits over it and their warp's parameters). out: a larger float32 buffer whose first
        floats this stage writes (an empty round's, in its full tree's: the host copies one
        buffer, whichever program ran); None: its own."""
        if rnd.width > EXACT:
            raise ValueError(f"tree insight stages token ids as float32, exact below {EXACT}, not {rnd.width}")
        self.rnd, self.env, self.tree = rnd, env, env.tree
        n, k = self.tree.n, rnd.k
        self.sizes = [n + 1] * 7 + [k, 4]
        size = sum(self.sizes)
        self.out = torch.zeros(size, dtype=torch.float32, device=rnd.device) if out is None else out[:size]
        self.rows = torch.arange(n + 1, device=rnd.device)

    def stage(self, out: torch.Tensor, path: torch.Tensor, taken: torch.Tensor, ranks: torch.Tensor,
              penalties, bad, one_hot: bool, point: torch.Tensor | None = None) -> None:
        """After the walk and the commit (out, path, taken, and the ranks [k] it staged), from the
        tree's buffers and the target's rows over it (penalties, bad: the warp's, as verified).
        one_hot: the host drafted the tree (q is 1; the draft's scores are another round's).
        point [n + 1, w]: a merged tree's lookup lanes, whose rows have q = 1 (None: none)."""
        rnd, tree = self.rnd, self.tree
        ids, parents = tree.ids[0], tree.parents
        up = parents.clamp(min=0)
        kids = tree.children.index_select(0, up)  # [n+1, w]: each row's parent's children, by rank
        mine = (kids == self.rows[:, None]) & (parents >= 0)[:, None]
        rank = torch.where(mine.any(1), mine.int().argmax(1), -1)
        logits, params = self.env.logits, self.env.params
        _, probs = rnd.ops.warp(logits, params, penalties, bad)
        if probs is None:  # greedy: the softmax of the penalised logits, as the chain's insight
            probs = logprobs_from_logits(logits, params, penalties, bad).exp()
        p = probs[up, ids]
        q = torch.ones_like(p) if one_hot else self._q(up)
        if point is not None:  # a row the lookup drafted: one-hot
            q = torch.where((mine & point.index_select(0, up)).any(1), 1.0, q)
        entropy = torch.special.entr(probs).sum(-1)
        emitted = (out >= 0).sum()
        token = out.index_select(0, (emitted - 1).view(1))  # [1]: the draw taken, where one was
        under = torch.cat([path[:1] * 0, path]).index_select(0, (emitted - 1).view(1))  # its parent row
        drawn = [torch.where(taken > 0, token, -1), probs[under, token], self._q_drawn(under, token),
                 ranks.index_select(0, (emitted - 1).clamp(max=rnd.k - 1).view(1))]
        parts = [ids, parents, tree.depth[0] - 1, rank, p, q, entropy, path, *drawn]
        torch.cat([part.float().view(-1) for part in parts], out=self.out)

    def _q(self, up: torch.Tensor) -> torch.Tensor:
        """q of each row's token at its parent: the ratio of the cumulative draft scores of the
        row and its parent (the pool's scores, by row through row_of; the root's is log 1)."""
        tree = self.tree
        pool = (tree.row_of[None, :] == self.rows[1:, None]).int().argmax(1)  # [n] each row's pool index
        score = torch.cat([tree.scores[:1] * 0, tree.scores.index_select(0, pool)])  # [n+1]
        return torch.where(self.rows > 0, (score - score[up]).exp(), 1.0)

    def _q_drawn(self, under: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """[1] q of a draw outside the tree at its parent row (drawn children: the coupling keeps
        q per expanded node; other trees take no draw outside them)."""
        q = getattr(self.rnd.coupling, "q", None)
        if q is None:
            return torch.zeros(1, device=self.out.device)
        at = (1 + self.tree.offset[under]).clamp(max=q.shape[0] - 1)
        return q[at, token]

    def read(self, floats: list[float], one_hot: bool) -> tuple:
        """(p, q, entropy) of the k drafted ids (the walk's `shown`) as a chain's insight gives
        them: p and q of each at its parent, the target's entropy there."""
        view = self.view(floats)
        rows = view.shown(self.rnd.k)
        p = [view.p[r] for r in rows]
        q = [view.q[r] for r in rows]
        entropy = [view.entropy[max(view.parents[r], 0)] for r in rows]
        if view.taken is not None:  # the last token out is that draw, shown at its depth
            at = len(view.path)
            under = view.path[-1] if view.path else 0
            p[at], q[at], entropy[at] = view.taken[1], view.taken[2], view.entropy[under]
        return p, q, entropy

    def view(self, floats: list[float]) -> TreeView:
        n = self.tree.n
        cols, at = [], 0
        for size in self.sizes:
            cols.append(floats[at:at + size])
            at += size
        tokens, parents, depth, ranks, p, q, entropy, path, drawn = cols
        keep = [r for r in range(n + 1) if r == 0 or ranks[r] >= 0]  # padding rows are no node
        new = {old: i for i, old in enumerate(keep)}
        rows = [new[int(r)] for r in path if int(r) > 0]  # the walk's path: rows of the tree
        taken = [int(drawn[0]), drawn[1], drawn[2], int(drawn[3])] if drawn[0] >= 0 else None
        return TreeView([int(tokens[r]) for r in keep], [-1] + [new[int(parents[r])] for r in keep[1:]],
                        [int(depth[r]) for r in keep], [int(ranks[r]) for r in keep], [p[r] for r in keep],
                        [q[r] for r in keep], [entropy[r] for r in keep], rows, taken)
