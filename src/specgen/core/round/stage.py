"""Float stages: what the host reads of a round besides its ids, gathered into one buffer.

    DraftProbs   p(d_i) and q(d_i) for every drafted token (sampled rejection coupling: the
                 round's events report them)
    Insight      the same, and the entropy of p at every drafted position (inspect-acceptance);
                 greedy rounds compute p from the target's warped rows for it

A round without one (greedy or Gumbel coupling without insight, target-only) stages no floats.
The ids are staged with the commit (core/sampling/bookkeeping.py).
"""

from __future__ import annotations

import torch

from specgen.core.sampling.warp import logprobs_from_logits


class NoStage:
    """Nothing staged: the host reads the ids only."""

    staged = False

    def __init__(self, rnd):
        self.out = torch.zeros(1, dtype=torch.float32, device=rnd.device)

    def stage(self, probs, q, rows: tuple, one_hot: bool) -> None:
        pass

    def read(self, floats: list[float], one_hot: bool) -> tuple:
        return None, None, None


class DraftProbs:
    """stage_f = [p(d) (k) | q(d) (k)]; has_q: the drafter's q is real (not zeros) in model rounds."""

    parts = 2
    staged = True

    def __init__(self, rnd, q_token: torch.Tensor, has_q: bool):
        self.rnd, self.q_token, self.has_q = rnd, q_token, has_q
        self.out = torch.zeros(self.parts * rnd.k, dtype=torch.float32, device=rnd.device)

    def _probs(self, probs: torch.Tensor | None, rows: tuple) -> torch.Tensor:
        return probs

    def _parts(self, probs: torch.Tensor, one_hot: bool, q: torch.Tensor | None) -> list[torch.Tensor]:
        rnd = self.rnd
        index = rnd.steps[: rnd.k]
        p_token = probs[index, rnd.drafts]
        q_token = q[index, rnd.drafts] if q is not None else self.q_token
        if one_hot:
            q_token = torch.ones_like(p_token)  # the host's drafts: one-hot q
        return [p_token, q_token]

    def stage(self, probs: torch.Tensor | None, q: torch.Tensor | None, rows: tuple, one_hot: bool) -> None:
        probs = self._probs(probs, rows)
        torch.cat(self._parts(probs, one_hot, q), out=self.out)

    def read(self, floats: list[float], one_hot: bool) -> tuple:
        """(p, q, entropy) of a round from the host's copy of `out` (None: not staged)."""
        k = self.rnd.k
        q = floats[k : 2 * k] if self.has_q and not one_hot else None
        return floats[:k], q, None


class Insight(DraftProbs):
    """stage_f = [p(d) | q(d) | H(p)]: q(d) of argmax drafts too (the pick computes it)."""

    parts = 3

    def __init__(self, rnd, q_token: torch.Tensor):
        super().__init__(rnd, q_token, has_q=True)

    def _probs(self, probs: torch.Tensor | None, rows: tuple) -> torch.Tensor:
        if probs is None:  # greedy: p is the softmax of the penalised logits
            probs = logprobs_from_logits(self.rnd.target_logits, *rows).exp()
        return probs

    def _parts(self, probs: torch.Tensor, one_hot: bool, q: torch.Tensor | None) -> list[torch.Tensor]:
        k = self.rnd.k
        return [*super()._parts(probs, one_hot, q), torch.special.entr(probs[:k]).sum(dim=-1)]

    def read(self, floats: list[float], one_hot: bool) -> tuple:
        p, q, _ = super().read(floats, one_hot)
        k = self.rnd.k
        return p, q, floats[2 * k : 3 * k]
