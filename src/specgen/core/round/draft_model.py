"""The draft model as the round's drafter: a small language model with a static cache of its own.

Its cache always holds the committed sequence minus its last two ids, which wait in `pending`:
a model round steps over `pending` (predicting the first draft from the committed sequence's
last id), then k - 1 single steps, each on the id picked before it, straight into feed. In a
host round it steps once over [committed[-2], feed] so its cache keeps following. The commit
moves its position back past the rows beyond the accepted ones and writes `pending` anew
(core/sampling/bookkeeping.py).
"""

from __future__ import annotations

import torch

from specgen.core.round.drafters import prefill_target


class DraftModel:
    """runner: the draft model's Runner; pick: the round's DraftPick."""

    one_hot = False

    def __init__(self, rnd, runner, pick):
        k, z = rnd.k, dict(device=rnd.device)
        self.rnd, self.runner, self.pick = rnd, runner, pick
        self.runners = [runner]
        self.pending = torch.zeros(1, 2, dtype=torch.long, **z)  # [B, 2] committed[-2:]
        self.follow_ids = torch.zeros(k + 2, dtype=torch.long, **z)  # committed[-2], last, drafts
        self.logits = {n: torch.full((n, rnd.width), float("-inf"), dtype=torch.float32, **z) for n in (1, 2, k + 2)}

    def prefill(self, ids: list[int]) -> None:
        """A one-token prompt: the draft sees that id twice (its cache needs two committed ids to
        start from); only its first guesses can change, never the output."""
        prefill_target(self.rnd, ids)
        self.runner.reset()
        self.runner.forward(torch.tensor(ids[:-2], dtype=torch.long), want_logits=False)
        self.pending[0].copy_(torch.tensor((ids * 2)[-2:], device=self.rnd.device))

    def draft(self) -> None:
        ids = self.pending[0]
        for i in range(self.rnd.k):
            n = ids.shape[0]
            with self.runner.step_context(n):
                self.runner.step(ids, self.logits[n])
            self.pick(i, self.logits[n][n - 1 :])
            ids = self.rnd.drafts[i : i + 1]
        self.pick.count()

    def follow(self) -> None:
        self.follow_ids[:1].copy_(self.pending[0, :1])
        self.follow_ids[1:].copy_(self.rnd.feed[0])
        with self.runner.step_context(self.rnd.k + 2):
            self.runner.step(self.follow_ids, self.logits[self.rnd.k + 2])

    def commit_fields(self) -> dict:
        return dict(draft_position=self.runner.position, pending=self.pending[0], ran=self.rnd.k + 1)

    def state(self) -> list[torch.Tensor]:
        return [self.pending, *self.pick.state()]
