"""Adaptive k: the host's budget of drafts for the next round, from recent acceptance.

It never changes the output distribution: the budget is decided before the round's draws.
"""

from __future__ import annotations


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
