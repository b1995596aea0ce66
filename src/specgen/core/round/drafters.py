"""Drafters: who writes the round's drafts into feed[0, 1:] and how many count (num_drafts).

One protocol, three kinds of part:

    DraftModel   core/round/draft_model.py: the draft model steps over `pending`, then k - 1 steps
    HeadDrafts   core/round/head.py: a head on the target's hidden states (EAGLE-3, MTP)
    HostLookup   the host wrote the drafts (n-gram lookup); the device drafter, if any, follows
    NoDraft      target-only (k = 0), and what follows host rounds when no model drafts

The device drafters pick each id through one `DraftPick`, which holds what picking needs of the
request: the logits rows (core/round/rows.py), the coupling's race rows, and draft_p_min (drafting
stops counting at the first step whose confidence is below it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import torch

from specgen.core.round.staging import host_tensor
from specgen.core.sampling.warp import logprobs_from_logits
from specgen.core.settings import SamplingSpec


def draft_spec(spec: SamplingSpec, cut: bool) -> SamplingSpec:
    """What the draft warps its logits with: the request's own settings (cut), or its temperature and
    penalties without top-k / top-p / min-p (speculation.draft_sampling = "temperature": a cheaper
    pick, q wider than p). Any q keeps the output lossless, as long as the draft samples from it."""
    return spec if cut else replace(spec, top_k=-1, top_p=1.0, min_p=0.0)


class Drafter(Protocol):
    """What the round's body calls. one_hot: the drafts come from the host (q is one-hot)."""

    one_hot: bool
    runners: list  # what holds a cache besides the target

    def prefill(self, ids: list[int]) -> None:
        """The target's prefill (all but the last id) and the drafter's own."""

    def draft(self) -> None:
        """On the device: drafts into feed[0, 1:], and num_drafts."""

    def follow(self) -> None:
        """On the device, in a round another drafter drafts: keep the drafter's cache following."""

    def commit_fields(self) -> dict:
        """What the commit moves besides the target (core/sampling/bookkeeping.CommitBuffers)."""

    def state(self) -> list[torch.Tensor]: ...


class DraftPick:
    """Draft step i's id into drafts[i]: raced against the coupling's noise row, warped (rows with
    penalties or masks), or the argmax; q(d_i) and the step's confidence where p_min or a stage
    reads them. count() then cuts num_drafts (core/sampling/bookkeeping.count_drafts)."""

    def __init__(self, rnd, rows, coupling, p_min: float, keep_q: bool):
        self.rnd, self.rows, self.coupling, self.p_min = rnd, rows, coupling, p_min
        self.q_token = torch.zeros(rnd.k, dtype=torch.float32, device=rnd.device)  # q(d_i)
        self.confident = torch.ones(rnd.k, dtype=torch.bool, device=rnd.device)  # confidence >= p_min
        self.need_q = p_min > 0 or keep_q
        self.plain = rows.plain and not self.need_q  # the argmax of the raw logits is the pick

    def state(self) -> list[torch.Tensor]:
        return [self.confident]

    def __call__(self, i: int, logits: torch.Tensor) -> None:
        ops, out = self.rnd.ops, self.rnd.drafts[i : i + 1]
        params, penalties, bad = self.rows.draft_row(i)
        race, probs = self.coupling.race(i), None
        if race is not None:  # the probs straight into q's row: no copy between the pick and the next step
            probs = ops.warp_and_race(logits, params, race[0], out, penalties, bad, probs_out=race[1])
        elif self.plain:
            ops.argmax(logits, out)
        else:
            out.copy_(ops.warp(logits, params, penalties, bad)[0])
        if self.need_q:
            q = probs if probs is not None else logprobs_from_logits(logits, params, penalties, bad).exp()
            self.q_token[i : i + 1].copy_(q[0, out])
            self.confident[i : i + 1].copy_(q.max(dim=-1).values >= self.p_min)
        self.rows.penalties.picked(out)

    def count(self) -> None:
        """Drafts that count: the host's budget, cut at the first step below p_min and at max_tokens."""
        rnd = self.rnd
        rnd.ops.count_drafts(self.confident, rnd.budget, rnd.limit, rnd.generated, rnd.num_drafts)


def prefill_target(rnd, ids: list[int]) -> None:
    rnd.target.forward(torch.tensor(ids[:-1], dtype=torch.long), want_logits=False)


class NoDraft:
    """Target-only rounds (a bonus token each), and the follower of host rounds without a model."""

    one_hot, runners = False, []

    def __init__(self, rnd):
        self.rnd = rnd

    def prefill(self, ids: list[int]) -> None:
        prefill_target(self.rnd, ids)

    def draft(self) -> None:
        self.rnd.num_drafts.zero_()

    def follow(self) -> None:
        pass

    def follow_commit(self, out: torch.Tensor, bookkeep) -> None:
        """A host tree round's commit (core/round/host_tree.py): no cache to keep, only the round's
        bookkeeping (core/round/tree_round.py's TreeRound.commit)."""
        bookkeep()

    def commit_fields(self) -> dict:
        return dict(ran=self.rnd.k + 1)

    def state(self) -> list[torch.Tensor]:
        return []


class HostLookup:
    """Drafts the host wrote into feed (n-gram lookup, core/drafters/ngram.py), 0 to k of them; the device
    drafter (`follower`) keeps its cache following the committed sequence: a draft model steps
    once over [committed[-2], feed], a head extends over the previous round's rows."""

    one_hot = True

    def __init__(self, rnd, follower):
        self.rnd, self.follower = rnd, follower
        self.runners = follower.runners

    def set_drafts(self, tokens: list[int]) -> None:
        if tokens:
            self.rnd.drafts[: len(tokens)].copy_(host_tensor(tokens), non_blocking=True)
        self.rnd.budget.fill_(len(tokens))

    def prefill(self, ids: list[int]) -> None:
        self.follower.prefill(ids)

    def draft(self) -> None:
        self.rnd.num_drafts.copy_(self.rnd.budget)
        self.follower.follow()

    def follow(self) -> None:
        pass

    def commit_fields(self) -> dict:
        return {**self.follower.commit_fields(), "ran": self.rnd.k + 2}  # the draft also ran [committed[-2]]

    def state(self) -> list[torch.Tensor]:
        return self.follower.state()
