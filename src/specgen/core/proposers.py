"""Proposers: who drafts the tokens of a round.

A proposer follows the committed sequence: start(prompt) once, then per round propose(k) and
commit(num_accepted, next_token) with the verifier's verdict. `q` in a Proposal is exactly the
distribution each drafted token was drawn from (None when the proposal is deterministic and the
verifier treats q as one-hot, as for n-gram lookup or argmax drafting).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.core import verifier
from specgen.core.sampling import exponentials, logprobs_from_logits, sample_race
from specgen.core.state import SamplingState


@dataclass
class Proposal:
    token_ids: torch.Tensor  # [n] int64
    probs: torch.Tensor | None  # [n, V] float32: q rows, or None for one-hot q
    token_q: list[float] | None = None  # q(x) of each drafted token, for insight
    k: int | None = None  # the round's budget the proposer used (adaptive k); None = what it was asked

    def __len__(self) -> int:
        return self.token_ids.shape[0]


class NoProposer:
    """Target-only decoding through the same loop: every round is an empty proposal plus a bonus."""

    kind = "none"

    def __init__(self, device: torch.device):
        self.empty = torch.zeros(0, dtype=torch.long, device=device)

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, k: int, state: SamplingState, generator) -> Proposal:
        return Proposal(self.empty, None)

    def commit(self, num_accepted: int, next_token: int) -> None:
        pass


def _argmax_q(logits: torch.Tensor, rows, token: torch.Tensor, probs: torch.Tensor | None) -> float:
    """q(x) of an argmax draft (insight only): the warped q where there is one, else the softmax
    of the draft's penalised logits."""
    if probs is not None:
        return float(probs[0, token])
    return float(logprobs_from_logits(logits, rows.params, rows.penalties, rows.bad_mask)[0, token].exp())


class DraftModelProposer:
    """A small causal LM drafting autoregressively over its own KV cache.

    The draft cache holds the committed sequence except its last `pending` tokens, which are fed
    at the start of the next round: one token normally, two after a round whose every draft was
    accepted (the last draft never went through the draft model), so the cache stays whole; more
    after rounds that another proposer drafted (follow(), the hybrid proposer's n-gram rounds).

    Adaptive speculation (both off by default): p_min ends a round's drafting early when the
    draft is unsure of its next token; adaptive_k drafts at most AdaptiveK's budget per round.
    Neither changes the output distribution: every stop and budget is decided before the draw.
    """

    kind = "draft"
    insight = False  # set by the decoder: q(x) also for argmax drafts, for acceptance insight

    def __init__(self, runner, sample: bool, stop_ids: set[int], p_min: float = 0.0, adaptive_k: bool = False,
                 cut: bool = True):
        self.runner = runner
        self.sample = sample  # draw from q (True) or take its argmax (False, q treated one-hot)
        self.cut = cut  # q with the request's top-k / top-p / min-p (True) or temperature only (state.draft_spec)
        self.stop_ids = stop_ids  # a drafted stop token ends the proposal: nothing after it can count
        self.p_min = p_min  # early stop: below this confidence (see _confidence) the round ends; 0 = off
        self.adaptive = AdaptiveK() if adaptive_k else None
        self.pending: list[int] = []
        self.drafted: list[int] = []
        self.base = 0  # cache length once pending is fed; drafts in the cache lie beyond it
        self.k_used = 0

    def start(self, prompt_ids: list[int]) -> None:
        self.runner.reset()
        self.runner.forward(torch.tensor(prompt_ids[:-1], dtype=torch.long), want_logits=False)
        self.pending = [prompt_ids[-1]]
        if self.adaptive is not None:
            self.adaptive = AdaptiveK()

    def propose(self, k: int, state: SamplingState, generator) -> Proposal:
        k = self.adaptive.budget(k) if self.adaptive is not None else k
        self.k_used = k
        device = self.runner.device
        feed = torch.tensor(self.pending, dtype=torch.long, device=device)
        self.base = self.runner.length + len(self.pending)
        drafted = torch.zeros(0, dtype=torch.long, device=device)
        q_rows, token_q = [], []
        for _ in range(k):
            logits = self.runner.forward(feed)[-1:]  # [1, V]
            rows = state.last_row(drafted, self.cut)
            argmax, probs = verifier.warp(logits, rows.params, rows.penalties, rows.bad_mask)
            if self.p_min > 0 and _confidence(logits, argmax, probs) < self.p_min:
                break
            if self.sample and probs is not None:
                token = sample_race(probs, exponentials(probs.shape, generator, device))
                q_rows.append(probs)
                token_q.append(float(probs[0, token]))
            else:
                token = argmax
                if self.insight:
                    token_q.append(_argmax_q(logits, rows, token, probs))
            drafted = torch.cat([drafted, token])
            feed = token
            if int(token) in self.stop_ids:
                break
        self.drafted = drafted.tolist()
        probs = torch.cat(q_rows) if q_rows else None
        return Proposal(drafted, probs, token_q or None, k=k)

    def commit(self, num_accepted: int, next_token: int) -> None:
        if self.adaptive is not None and self.k_used > 0:
            self.adaptive.update(num_accepted)
        # The cache holds pending + drafted[:fed]: fed is n-1 (the last draft is never fed) or n
        # after an early stop (its logits were computed, then judged too unsure to draft from).
        fed = self.runner.length - self.base
        if fed < 0:  # k was 0: not even pending went in
            self.pending = self.pending + [next_token]
            return
        keep = min(num_accepted, fed)
        self.runner.truncate(self.base + keep)
        self.pending = self.drafted[keep:num_accepted] + [next_token]

    def follow(self, committed: list[int]) -> None:
        """A round that another proposer drafted committed these tokens: the draft model did not run,
        so its cache is as the last commit left it and they wait, after the pending ones, for the
        next round's first step (one multi-token forward instead of one step per token)."""
        self.pending = self.pending + committed


def _confidence(logits: torch.Tensor, argmax: torch.Tensor, probs: torch.Tensor | None) -> float:
    """The draft's probability of its most likely next token, judged BEFORE any token is drawn.

    With warped q (sampled or argmax drafting at temperature > 0) it is max q; in greedy mode
    (no warped q) the softmax of the draft's logits at the argmax. Taking q(x) of a token already
    drawn from q and dropping it when low would skew the proposal away from q, and then the
    verifier, which assumes x ~ q, would no longer be lossless; a stop decided before the draw
    keeps every drafted token an exact draw from q.
    """
    if probs is not None:
        return float(probs.max())
    return float(torch.softmax(logits, dim=-1)[0, argmax])


class AdaptiveK:
    """k for the next round: one more than an exponential moving average of accepted per round.

    After rounds that accept everything k grows by one (up to the k the loop asks for, the
    profile's k or fewer near max_tokens); when little is accepted it shrinks toward 1.
    """

    WEIGHT = 0.5  # of the newest round in the average

    def __init__(self):
        self.average: float | None = None  # None: no round yet, use the full k

    def budget(self, k: int) -> int:
        if self.average is None or k <= 0:
            return k
        return max(1, min(k, int(self.average + 0.5) + 1))

    def update(self, accepted: int) -> None:
        if self.average is None:
            self.average = float(accepted)
        else:
            self.average += self.WEIGHT * (accepted - self.average)
