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
    accepted (the last draft never went through the draft model), so the cache stays whole.
    """

    kind = "draft"
    insight = False  # set by the decoder: q(x) also for argmax drafts, for acceptance insight

    def __init__(self, runner, sample: bool, stop_ids: set[int]):
        self.runner = runner
        self.sample = sample  # draw from q (True) or take its argmax (False, q treated one-hot)
        self.stop_ids = stop_ids  # a drafted stop token ends the proposal: nothing after it can count
        self.pending: list[int] = []
        self.drafted: list[int] = []

    def start(self, prompt_ids: list[int]) -> None:
        self.runner.reset()
        self.runner.forward(torch.tensor(prompt_ids[:-1], dtype=torch.long), want_logits=False)
        self.pending = [prompt_ids[-1]]

    def propose(self, k: int, state: SamplingState, generator) -> Proposal:
        device = self.runner.device
        feed = torch.tensor(self.pending, dtype=torch.long, device=device)
        drafted = torch.zeros(0, dtype=torch.long, device=device)
        q_rows, token_q = [], []
        for _ in range(k):
            logits = self.runner.forward(feed)[-1:]  # [1, V]
            rows = state.last_row(drafted)
            argmax, probs = verifier.warp(logits, rows.params, rows.penalties, rows.bad_mask)
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
        return Proposal(drafted, probs, token_q or None)

    def commit(self, num_accepted: int, next_token: int) -> None:
        n = len(self.drafted)
        if n == 0:
            self.pending = self.pending + [next_token]
            return
        # The cache holds pending + drafted[:n-1]; keep pending + drafted[:num_accepted].
        if num_accepted == n:
            self.pending = [self.drafted[-1], next_token]
        else:
            self.runner.truncate(self.runner.length - (n - 1) + num_accepted)
            self.pending = [next_token]
