"""The hybrid proposer drafting every row of a batch (core/round/batch_round.py's drafter part):
prompt lookup where a row's lookup matches, else the model `hybrid_with` names (the draft model,
core/round/batch_round.py's BatchDraftModel, or an EAGLE-3 head, core/round/batch_head.py's
BatchHead). Chains only (tree_width 1; engine.batch_refusal refuses hybrid trees at batch).

Alone, hybrid takes turns by round (core/decode.py): a round whose lookup finds tokens is a host
round (the drafts the host's, q one-hot, the model following: the draft model steps once over
[committed[-2], feed], a head extends), any other a model round. At batch every row takes its own
turn in one round: the model drafts every row (its k steps over [B, ...], as BatchRound's), then
each row whose lookup found a continuation takes the lookup's drafts and count instead, chosen
per row on the device from one staged buffer the host copies once per round (each row's drafts,
their count and its budget for the model; a count > 0 is a host row), no host read:

    drafts   feed[:, 1:] and num_drafts: the lookup's where the row is a host row, else the model's
    q        rejection coupling: one-hot at a host row's counted drafts (BatchCoupling.one_hot),
             the model's q at the others'
    follow   the model's follow_host: the draft model steps the host rows over [committed[-2],
             feed] from where the round started (the others at the cache's scratch end), so each
             host row's cache holds the lookup's tokens as alone; a head needs nothing (its next
             extend rewrites the positions its steps wrote)

Each row draws what it draws alone: rejection coupling draws every round, whoever drafts, the
noise rows of the model's k draft steps and the target's, then k uniforms (core/round/couplings.py's
RejectionCoupling for a proposer whose model races; a host round reads only the target's row and
the uniforms), which the batch draws for a row whose drafter races (BatchCoupling.draw); Gumbel
noise is keyed by the row's seed and positions. A host row's model picks race its noise rows and
are then dropped: no number is consumed by them. So greedy, Gumbel and rejection coupling give a
row the tokens (and drafts) it gets alone. The next round's drafts depend on this round's tokens
(`host_proposes`): the batch loop keeps one round in flight. Buffers are allocated once; the body
reads no host value.
"""

from __future__ import annotations

import torch

from specgen.core.drafters.ngram import NgramProposer
from specgen.core.round.staging import host_tensor


class BatchHybrid:
    """model(round): the model part (BatchDraftModel, BatchHead) that drafts every row; ngram_min,
    ngram_max: each row's NgramProposer's n-gram sizes ([proposer] ngram_min/max)."""

    one_hot = False  # the model's rows race q: every row draws their noise rows
    host_proposes = True  # the host's lookups, from the round before: one round in flight

    def __init__(self, rnd, model, ngram_min: int, ngram_max: int):
        self.rnd, self.model = rnd, model(rnd)
        self.runners = self.model.runners
        self.proposers = [NgramProposer(ngram_min, ngram_max) for _ in range(rnd.batch)]
        z = dict(device=rnd.device)
        # per row: the lookup's k drafts (zeros past its count), its count, the model's budget
        self.staged = torch.zeros(rnd.batch, rnd.k + 2, dtype=torch.long, **z)
        self.host = torch.zeros(rnd.batch, dtype=torch.bool, **z)  # the rows whose lookup matched
        self.counts = torch.zeros(rnd.batch, dtype=torch.int32, **z)

    def start(self, b: int, ids: list[int]) -> None:
        """Row b's prompt: the model part's prefill and row b's proposer."""
        self.model.start(b, ids)
        self.proposers[b].start(ids)

    def room(self, slots: int, capacity: int) -> None:
        self.model.room(slots, capacity)

    def propose(self, budgets: list[int]) -> None:
        """Every row's lookup for the next round, up to its budget (0: none), its count and the
        model's budget: one host buffer, one queued copy, then the model's budgets from it on the
        device (count_drafts_rows reads them before the body drafts)."""
        k = self.rnd.k
        flat = []
        for proposer, budget in zip(self.proposers, budgets):
            tokens = proposer.lookup(budget) if budget > 0 else []
            flat += tokens + [0] * (k - len(tokens)) + [len(tokens), budget]
        self.staged.copy_(self.rnd.staging.put(host_tensor(flat).view(len(budgets), -1)))
        self.rnd.budget.copy_(self.staged[:, k + 1])

    def follow(self, b: int, committed: list[int]) -> None:
        """Row b's committed tokens of a round, which its next lookup reads."""
        self.proposers[b].follow(committed)

    def draft(self) -> None:
        """The model's drafts for every row, then the lookup's for the rows it matched (see the
        module's text), and the model following those rows."""
        rnd, k = self.rnd, self.rnd.k
        self.model.draft()
        lookup, count = self.staged[:, :k], self.staged[:, k]
        torch.gt(count, 0, out=self.host)
        self.counts.copy_(count)
        torch.where(self.host[:, None], lookup, rnd.feed[:, 1:], out=rnd.feed[:, 1:])
        torch.where(self.host, self.counts, rnd.num_drafts, out=rnd.num_drafts)
        if rnd.coupling.q is not None:
            rnd.coupling.one_hot(self.host)
        self.model.follow_host(self.host)

    def reading(self):
        return self.model.reading()

    def commit_fields(self) -> dict:
        return self.model.commit_fields()

    def state(self) -> list[torch.Tensor]:
        return self.model.state()

    def close(self) -> None:
        self.model.close()
