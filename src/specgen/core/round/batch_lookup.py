"""Prompt lookup drafting every row of a batch (core/round/batch_round.py's drafter part).

The chain round's host drafts (core/round/drafters.HostLookup, core/drafters/ngram.py) with a
batch dimension: each row has its own NgramProposer over its own prompt and committed tokens.
Before each round the host asks every row's proposer for up to its budget of tokens (a row whose
suffix matches nothing drafts none) and writes all rows' drafts and counts into one staged buffer,
copied to the device in one queued copy (core/round/staging.py); the round's body copies them into
feed[:, 1:] and num_drafts. A row with fewer drafts than k (none, too) runs the round's shapes as
every short row does: its drafts past its count do not count (core/round/batch_round.py's
verification), so its round emits what the chain round emits with that many drafts.

q is one-hot at each draft (one_hot): greedy and Gumbel verification compare the draft with the
target's pick, rejection verification accepts draft d with probability p(d) (BatchCoupling builds
the one-hot q rows, zero past a row's count), and no draft step races, so a row draws only the
target's noise row and its uniforms, as the chain round draws for host drafts. The next round's
drafts depend on this round's tokens, so the batch loop keeps one round in flight
(core/batch_decode.py: the round's host_drafts, from the part's `host_proposes`).

No model besides the target: a row's prompt is prefilled into the target's cache row as target-only
rows are. The body reads no host value (the staged buffer is static), so the round captures it whole.
"""

from __future__ import annotations

import contextlib

import torch

from specgen.core.drafters.ngram import NgramProposer
from specgen.core.round.staging import host_tensor


class BatchLookup:
    """ngram_min, ngram_max: each row's NgramProposer's n-gram sizes ([proposer] ngram_min/max)."""

    one_hot = True  # the host drafts (q is one-hot)
    host_proposes = True  # from the round before: one round in flight
    runners: list = []  # no model the round keeps a cache of besides the target

    def __init__(self, rnd, ngram_min: int, ngram_max: int):
        self.rnd = rnd
        self.proposers = [NgramProposer(ngram_min, ngram_max) for _ in range(rnd.batch)]
        # per row: its k drafts (zeros past its count), then its count; written by the host in one copy
        self.staged = torch.zeros(rnd.batch, rnd.k + 1, dtype=torch.long, device=rnd.device)

    def start(self, b: int, ids: list[int]) -> None:
        """Row b's prompt: the target's cache row (all but the last id) and row b's proposer."""
        self.rnd._prefill(0, b, ids[:-1])
        self.proposers[b].start(ids)

    def room(self, slots: int, capacity: int) -> None:
        """No cache of its own."""

    def propose(self, budgets: list[int]) -> None:
        """Every row's drafts for the next round, up to its budget (0: a free row drafts nothing),
        from its proposer, and its count: one host buffer, one queued copy to the device."""
        k = self.rnd.k
        flat = []
        for proposer, budget in zip(self.proposers, budgets):
            tokens = proposer.lookup(budget) if budget > 0 else []
            flat += tokens + [0] * (k - len(tokens)) + [len(tokens)]
        self.staged.copy_(self.rnd.staging.put(host_tensor(flat).view(len(budgets), -1)))

    def follow(self, b: int, committed: list[int]) -> None:
        """Row b's committed tokens of a round, which its next lookup reads."""
        self.proposers[b].follow(committed)

    def draft(self) -> None:
        """The host's drafts into feed[:, 1:] and their counts into num_drafts (in place of the count
        from the budget: each row's count is at most its budget, which the host capped at max_tokens
        as count_drafts_rows caps it)."""
        rnd, k = self.rnd, self.rnd.k
        rnd.feed[:, 1:].copy_(self.staged[:, :k])
        rnd.num_drafts.copy_(self.staged[:, k])

    def reading(self):
        """What it reads of the target's step: nothing."""
        return contextlib.nullcontext()

    def commit_fields(self) -> dict:
        return {}

    def state(self) -> list[torch.Tensor]:
        """Nothing the body writes outlives the round but the round's own buffers."""
        return []

    def close(self) -> None:
        pass
