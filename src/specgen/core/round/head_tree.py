"""A token tree drafted by a head on the target's hidden states (an EAGLE-3 head, or a
checkpoint's MTP layer): the drafter part of a TreeRound whose proposer is `eagle` or `mtp`
(core/round/tree_round.py), over the head's drafter (core/drafters/heads.py: EagleDrafter's
static cache indexed by slot, or MtpDrafter's growing one, whose entries the slots name).

Per round, as the chain's head drafter (core/round/head.py) and the draft model's tree (TreeDraft):

    extend   the head over the previous round's k + 1 target rows: its output row (the accepted
             path's tokens, then the new token, as the round staged it) and the target's aux
             states of the path's rows, gathered from the tree step's n + 1 rows at the commit
             (the round's `path_rows`), so the rows are a chain's again; row e - 1 gives the
             root's log q and hidden state (level 0)
    levels   for levels 1 .. k - 1, one head call over the frontier's w nodes as tree rows
             (core/round/tree.py level_rows: node f of level l at slot start + (l - 1) w + f,
             position start + l - 1, seeing the committed prefix and its ancestors), each node
             embedding its own token on its parent's output hidden state (`hidden`, by draft
             offset: the Tree's `tail` names each node's parent)
    select   the n best candidates as the target's tree rows

start is the target's position: the head's committed prefix holds a row per position below it
(row t: the id at t + 1 on the target's states at t), as after a chain round's extend.

The commit keeps no head K/V: the next extend rewrites the rows at the accepted positions from the
target's states, as it rewrites a chain round's drafted rows, so the head's cache then holds what
it would after a chain of the same tokens, and the tree's nodes (slots past start) are never seen
again. Nothing rolls back: every position is derived from the target's. Every buffer is allocated
here; a round allocates nothing the next one reads and makes no host sync (a CUDA graph captures it).
An MTP layer's round runs eagerly instead: its cache grows, and each level's step_rows reads the
level's first slot on the host to roll back to it.
"""

from __future__ import annotations

import torch

from specgen.core.round.tree import Tree
from specgen.core.sampling.warp import WarpParams


class HeadTreeDraft:
    """chain: the round's HeadDrafts (its prefill and extend) over an EagleDrafter or an
    MtpDrafter (core/drafters/heads.py: step_rows, hidden_rows); params, bad: the draft's warp and padding mask;
    coupling: the tree coupling (noise for drawn children, q kept where it verifies with it)."""

    one_hot = False
    point = None  # no point-mass lanes: drawn children, or the top-w

    def __init__(self, rnd, chain, tree: Tree, params: WarpParams, bad, coupling):
        self.rnd, self.chain, self.tree, self.params, self.bad = rnd, chain, tree, params, bad
        self.coupling, self.head = coupling, chain.head
        self.runners = chain.runners
        k, device = rnd.k, rnd.device
        # the last round's output row, where the round stages it (its commit's first k + 1 ids, which
        # nothing else writes): no copy of its own
        self.out = rnd.stage_ids[: k + 1]
        taps = self.head.features(1)
        self.features = taps.new_zeros(k + 1, taps.shape[1])  # [k+1, F] its path's target rows, in order
        self.hidden = self.head.hidden_rows(max(k - 1, 1) * tree.w)  # [(k-1) w, H] by draft offset
        self.parents = self.head.hidden_rows(tree.w)  # [w, H] the frontier's parents' hidden states
        self.confident = torch.ones(k, dtype=torch.bool, device=device)

    def prefill(self, ids: list[int]) -> None:
        """The chain's prefill; the first round extends over the prompt's last target row."""
        self.chain.prefill(ids)
        self.out.copy_(self.rnd.out[0])
        self.features[:1].copy_(self.head.features(1))

    def logq(self, logits: torch.Tensor, level: int) -> torch.Tensor:
        """The head's warped log q at the nodes of `level` (0: the root), as TreeDraft's."""
        logq = self.rnd.ops.tree_logq(logits, self.params.slice(0, logits.shape[0]), self.bad)
        self.coupling.keep_q(level, logq)
        return logq

    def draft(self) -> None:
        rnd, tree, w = self.rnd, self.tree, self.tree.w
        noise, ops = self.coupling.children_noise, rnd.ops
        start = rnd.target.position.view(1)  # the head's rows below it are the committed sequence's
        logits, hidden = self.chain.extend_over(self.out, self.features)
        tree.root(rnd.feed[0, :1], self.logq(logits, 0), noise(0), start, ops)
        self.parents.copy_(hidden.expand(w, -1))  # level 1: the root's children
        for level in range(1, rnd.k):
            if level > 1:  # frontier node f's parent: its path's entry before its own
                torch.index_select(self.hidden, 0, tree.tail[level - 1, :, level - 2], out=self.parents)
            logits, hidden = self.head.step_rows(tree.level_rows(level, start), self.parents)
            self.hidden[(level - 1) * w : level * w].copy_(hidden)
            tree.expand(level, self.logq(logits, level), noise(level), start, ops)
        tree.select(start, ops)
        ops.count_drafts(self.confident, rnd.budget, rnd.limit, rnd.generated, rnd.num_drafts)

    def commit(self, out: torch.Tensor, bookkeep) -> None:
        """What the next extend reads: the output row (the round's bookkeeping stages it in `out`),
        and the target's states of the root and the accepted nodes (the round's path_rows, which
        the bookkeeping writes) out of the tap's n + 1 rows, in path order. No head K/V moves."""
        bookkeep()
        torch.index_select(self.head.features(self.tree.n + 1), 0, self.rnd.path_rows, out=self.features)

    def follow(self) -> None:
        """A hybrid round over the lookup's trie alone (core/round/host_tree.py's ModelFollower):
        the head extends over the round before's rows, as draft() starts, so that its cache keeps
        every position; lookup_commit gathers this round's path."""
        self.chain.extend_over(self.out, self.features)

    def lookup_commit(self, out: torch.Tensor, bookkeep) -> None:
        self.commit(out, bookkeep)

    def merged_commit(self, out: torch.Tensor, bookkeep) -> None:
        """A merged tree's round (core/round/merged_tree.py): the target stepped over the merged
        tree, whose rows the tap holds as a model tree's: commit's gather, whichever part of the
        tree the path went through."""
        self.commit(out, bookkeep)

    def state(self) -> list[torch.Tensor]:
        return [self.out, self.features, self.rnd.emitted]
