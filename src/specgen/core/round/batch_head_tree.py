"""An EAGLE-3 head drafting every row's token tree (core/round/batch_tree.py's drafter part where
the proposer is `eagle` at batch_size > 1).

The head tree of one request (core/round/head_tree.py's HeadTreeDraft) with a batch dimension, on
a batch head's cache rows and tap (core/round/batch_head.py's BatchHead):

    root     each row extends the head over its previous round's accepted path: its output row
             (the path's tokens, then the new token; stale ids past them) and the target's states
             of the root and the accepted nodes, gathered from the tap's B x (n + 1) rows at the
             commit in path order, at its own positions P_b - e_b .. P_b - e_b + k in its own head
             cache row; its row e_b - 1 gives the root's logits and hidden state (level 1's parents)
    levels   for levels 1 .. k - 1, one head call over every row's w frontier nodes ([B, w] tree
             rows, BatchTrees.level_rows: each row past its own target position P_b, seeing its
             committed prefix and its ancestors), each node embedding its own token on its
             parent's output hidden state (`hidden`, by draft offset: each row's Tree's `tail`)
    commit   each row's output row, and its path's target rows from the tap

The round builds each row's tree from these logits with the draft model's ops (its children per
row from its own log q, tree_expand and tree_select over every row's tree at once, each row on its
own buffers), so each row computes what it computes alone: every head call is the one-request
call over more rows, each row reading its own cache row and its own buffers only. The head keeps
no K/V at the commit, as alone: the next extend rewrites the rows at the accepted positions from
the target's states.

Buffers are allocated once; the body reads no host value (a backend captures the round whole).
"""

from __future__ import annotations

import torch

from specgen.core.round.batch_head import BatchHead


class BatchHeadTree(BatchHead):
    """drafter: the engine's EagleDrafter (as BatchHead's). The tap holds the tree step's
    B x (n + 1) rows (rnd.target_rows_per)."""

    host_rows = None  # every row's tree is the head's

    def __init__(self, rnd, drafter):
        super().__init__(rnd, drafter)
        k, w, batch, z = rnd.k, rnd.tree_width, rnd.batch, dict(device=rnd.device)
        width = self.tap.out.shape[1]
        self.features = self.tap.out.new_zeros(batch, k + 1, width)  # [B, k+1, F] each row's path's target rows
        self.path_rows = torch.zeros(batch, k + 1, dtype=torch.long, **z)  # [B, k+1] tree rows, column 0 the root
        weight, hidden = self.head.fc.weight, self.head.config.hidden_size  # the head's states, as hidden_rows'
        self.hidden = weight.new_zeros(batch, max(k - 1, 1) * w, hidden)  # [B, (k-1) w, H] by draft offset
        self.parents = weight.new_zeros(batch, w, hidden)  # [B, w, H] each row's frontier's parents' states

    def _first_features(self, b: int) -> None:
        """Row b's first round extends over the prompt's last target row (HeadTreeDraft.prefill)."""
        self.features[b, :1].copy_(self.drafter.features(1))

    def draft(self) -> None:
        self.rnd.grow_trees()

    def root(self) -> torch.Tensor:
        """Every row's extend: the head's logits after its root into the round's draft_logits
        [B, width], its hidden state as level 1's parents; the start [B] its frontiers' rows sit
        past (the target's position: the head's rows below it are the committed sequence's)."""
        rnd, w = self.rnd, self.rnd.tree_width
        logits, hidden = self._extend(self.features)
        self._widen(rnd.draft_logits, logits)
        self.parents.copy_(hidden.expand(-1, w, -1))
        return rnd.positions[0]

    def level(self, level: int, start: torch.Tensor) -> None:
        """One head call over every row's frontier `level` on its parents' hidden states: the
        logits into the round's level_logits [B, w, width], the states kept by draft offset."""
        rnd, w = self.rnd, self.rnd.tree_width
        if level > 1:  # frontier node f's parent: its path's entry before its own
            parent = rnd.trees["tail"][:, level - 1, :, level - 2]  # [B, w] draft offsets
            torch.gather(self.hidden, 1, parent[:, :, None].expand(-1, -1, self.hidden.shape[2]), out=self.parents)
        logits, hidden = self._forward(self.parents, rnd.trees.level_rows(level, start))
        self.hidden[:, (level - 1) * w : level * w].copy_(hidden)
        self._widen(rnd.level_logits, logits)

    def commit(self, out: torch.Tensor, path: torch.Tensor, emitted: torch.Tensor,
               hosted: torch.Tensor | None = None) -> None:
        """What each row's next extend reads (HeadTreeDraft.commit): its output row, and the
        target's states of its root and accepted nodes (tree rows path [B, k], 0 past them) out of
        its n + 1 rows of the tap, in path order. hosted: the hybrid proposer's rows whose tree was
        the lookup's, committed alike (HeadTreeDraft.lookup_commit is its commit)."""
        rnd = self.rnd
        rnd.out.copy_(out)
        self.path_rows[:, 1:].copy_(path)
        rows = self.tap.out[: rnd.batch * self.rows].view(rnd.batch, self.rows, -1)
        torch.gather(rows, 1, self.path_rows[:, :, None].expand(-1, -1, rows.shape[2]), out=self.features)

    def state(self) -> list[torch.Tensor]:
        """The output row and the path's features outlive the round only for the next extend."""
        return [self.rnd.out, self.features]
