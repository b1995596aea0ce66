"""A head on the target's hidden states as the round's drafter (EAGLE-3, MTP: core/drafters/heads.py holds
the models and their caches; this part drives them).

A model round extends the head over the previous round's k + 1 target rows (the round's output
row: accepted drafts then the new token, stale ids past them), whose row e - 1 (e: the tokens that
round emitted) predicts the first draft; then k - 1 steps on the head's own hidden states. A host
round extends only, so the head's cache keeps following. Nothing rolls back: every call writes at
positions derived from the target's.
"""

from __future__ import annotations

import torch

from specgen.core.drafters.heads import prefill_head


class HeadDrafts:
    """head: a HeadDrafter (core/drafters/heads.py); pick: the round's DraftPick."""

    one_hot = False

    def __init__(self, rnd, head, pick):
        self.rnd, self.head, self.pick = rnd, head, pick
        self.runners = [head]

    def prefill(self, ids: list[int]) -> None:
        """The target's prefill, feeding the head as it goes; the first round then extends over the
        prompt's last target row as if the previous round had emitted `last`."""
        rnd = self.rnd
        prefill_head(self.head, rnd.target, ids, rnd.device)
        rnd.out.fill_(-1)
        rnd.out[0, 0].fill_(ids[-1])
        rnd.emitted.fill_(1)

    def extend(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over the previous round's k + 1 target rows: the logits and hidden state of its
        last emitted row, which predict the token after `last`."""
        return self.extend_over(self.rnd.out[0], self.head.features(self.rnd.k + 1))

    def extend_over(self, out: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """extend, given the previous round's output row out [k+1] (accepted drafts, then the new
        token; -1 past them) and its target rows' features [k+1, F] in the same order (a tree
        round's: its accepted path's, core/round/head_tree.py)."""
        rnd, head = self.rnd, self.head
        ids = out.clamp_min(0)  # stale ids past the emitted ones
        # clamped as a whole: a one-token prompt's first round (P - e = -1) would otherwise put two
        # rows at position 0, and which of their keys the cache keeps is the write's choice
        positions = (rnd.target.position - rnd.emitted).clamp_min(0) + rnd.steps
        logits, hidden = head.extend(ids, features, positions)
        last = (rnd.emitted - 1).view(1)
        return logits.index_select(0, last), hidden.index_select(0, last)

    def draft(self) -> None:
        rnd = self.rnd
        logits, hidden = self.extend()
        self.pick(0, logits)
        for i in range(1, rnd.k):  # step i embeds draft i - 1 at position P + i - 1
            logits, hidden = self.head.step(rnd.drafts[i - 1 : i], hidden, (rnd.target.position + (i - 1)).view(1))
            self.pick(i, logits)
        self.pick.count()

    def follow(self) -> None:
        self.extend()

    def commit_fields(self) -> dict:
        return dict(ran=self.rnd.k + 1)

    def state(self) -> list[torch.Tensor]:
        """The output row and emitted count outlive the round only for the head's next extend."""
        return [self.rnd.out, self.rnd.emitted, self.head.tap.out, *self.pick.state()]
