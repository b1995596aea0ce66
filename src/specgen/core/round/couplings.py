"""Couplings: how the round's randomness ties the draft's picks to the target's verdict.

    RejectionCoupling   greedy requests: drafts accepted while they equal the target's argmax.
                        Sampled: Leviathan et al.'s rejection sampling (core/sampling/rejection.py), from
                        Exp(1) rows and uniforms the host draws into static buffers before each
                        round (draw(), in the same order and shapes every round, so a seed
                        reproduces the text on every backend).
    GumbelCoupling      sampled: the body computes noise row i from (seed, the position of row i,
                        token id) on the device (core/sampling/noise.py); the draft races q̃ against row i,
                        the target picks x_i = argmax p̃_i / E_i, and verification is greedy
                        against x: the text does not depend on k or the proposer.

A coupling offers the draft its race row for step i (race(); None: the draft takes its argmax),
and verify() writes the round's output row from the target's warped rows; it returns the target's
probs and the draft's q (None: one-hot or not kept), which a stage may read.
"""

from __future__ import annotations

import torch

from specgen.core.sampling import noise
from specgen.core.sampling.warp import exponentials_, uniforms_


class RejectionCoupling:
    """noise: Exp(1) rows, one per sampled draft step then the target's recovery row; uniform: one
    per draft; q: the draft's probs per step (where the draft samples). None where greedy."""

    def __init__(self, rnd, sampled: bool, draft_races: bool):
        k, width, z = rnd.k, rnd.width, dict(device=rnd.device)
        self.rnd = rnd
        draft_rows = k if draft_races else 0
        self.noise = torch.ones(draft_rows + 1, width, dtype=torch.float32, **z) if sampled else None
        self.uniform = torch.ones(k, dtype=torch.float32, **z) if sampled else None
        self.q = torch.zeros(k, width, dtype=torch.float32, **z) if draft_rows else None
        self.draft_races = draft_races

    def start(self, seed: int, origin: int) -> None:
        """The caller's generator draws rejection coupling's numbers: nothing to key."""

    def draw(self, generator: torch.Generator) -> None:
        """The next round's random numbers, in place: the Exp(1) rows (sampled draft steps, then the
        target's recovery row) in one draw, then the uniforms (greedy rounds draw nothing). The host
        launches these between replays, so they are as few calls as the buffers allow: on the GPU
        each call costs the decode loop a few microseconds of host time a round."""
        if self.noise is None:
            return
        exponentials_(self.noise, generator)
        uniforms_(self.uniform, generator)

    def begin(self) -> None:
        pass

    def race(self, i: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Draft step i's (noise row, where its probs go), or None: the draft picks its argmax."""
        if not self.draft_races:
            return None
        return self.noise[i : i + 1], self.q[i : i + 1]

    def verify(self, rows: tuple, one_hot: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The output row from the target's rows; one_hot: the host drafted (q is one-hot)."""
        rnd = self.rnd
        q = self.q if not one_hot else None
        argmax, probs = rnd.ops.warp(rnd.target_logits, *rows)
        if probs is None:
            out = rnd.ops.verify_greedy(rnd.drafts, rnd.num_drafts, argmax, rnd.k)
        else:
            out = rnd.ops.verify_random(rnd.drafts, rnd.num_drafts, q, probs, self.uniform,
                                        self.noise[-1:], rnd.k)
        rnd.out.copy_(out)
        return probs, q


class GumbelCoupling:
    """noise: one Exp(1) row per position of the round, computed on the device from key (the seed
    as Philox's key words) and first = origin (the prompt's length) + generated; choice: the
    target's x per row."""

    def __init__(self, rnd, draft_races: bool):
        k, width, z = rnd.k, rnd.width, dict(device=rnd.device)
        self.rnd, self.draft_races = rnd, draft_races
        self.noise = torch.ones(k + 1, width, dtype=torch.float32, **z)
        self.key = torch.zeros(2, dtype=torch.long, **z)
        self.origin = torch.zeros((), dtype=torch.long, **z)  # position of token 0 of the output
        self.first = torch.zeros((), dtype=torch.long, **z)  # position of this round's row 0
        self.choice = torch.zeros(k + 1, dtype=torch.long, **z)
        self.q = None

    def start(self, seed: int, origin: int) -> None:
        self.key.copy_(torch.tensor(noise.split_seed(seed)))
        self.origin.fill_(origin)

    def draw(self, generator: torch.Generator) -> None:
        """The noise is the body's: the host draws nothing."""

    def begin(self) -> None:
        torch.add(self.origin, self.rnd.generated, out=self.first)
        self.rnd.ops.gumbel_noise(self.noise, self.key, self.first)

    def race(self, i: int) -> tuple[torch.Tensor, None] | None:
        return (self.noise[i : i + 1], None) if self.draft_races else None

    def verify(self, rows: tuple, one_hot: bool) -> tuple[torch.Tensor | None, None]:
        """x_i = argmax p̃_i / E_i; a draft is accepted iff it equals x_i."""
        rnd = self.rnd
        probs = rnd.ops.warp_and_race(rnd.target_logits, rows[0], self.noise, self.choice, *rows[1:])
        rnd.out.copy_(rnd.ops.verify_greedy(rnd.drafts, rnd.num_drafts, self.choice, rnd.k))
        return probs, None
