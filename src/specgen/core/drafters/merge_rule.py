"""Which tree a hybrid round drafts where prompt lookup finds continuations ([speculation]
hybrid_merge, with tree_width > 1): the lookup's trie merged with the model's tree
(core/round/merged_tree.py, Mode.MERGED), or the lookup's trie alone while the model only follows
the committed tokens (core/round/host_tree.py's HostTree over the model's follower, Mode.HOST).

A merged round verifies the lookup's nodes and the model's best ones besides, and pays for the
model's whole tree; a lookup round pays one drafter call. `never` is the default: on an H200 with
the bench pair (k = 4, w = 2, n = 8, docs/benchmarks.md "Prompt lookup and hybrid trees (H200)")
the lookup's trie alone gave 6,174 and 6,182 tok/s greedy, always merging 5,162 (4.10 tokens a
round against 3.90), auto 5,353 and 5,183; at t 0.8 every run between 3,066 and 3,412, no choice ahead. Auto's rounds cost more
than its share of merged rounds explains: in its runs the `other` phase of every row, the hybrid
chain's too, was some 0.05 ms longer (a third program captured per shape, at a guess; not found).

`auto` merges where the tokens a merged round brings, over what the lookup's trie alone brings,
are at least the merged round's cost over a lookup round's:

- cost: the weight-streaming floor of each round (core/bench/floors.py's bytes; the bandwidth
  cancels), known before the run: a lookup round streams the target's weights and one drafter
  call's, a merged round the target's and `calls` drafter calls' (the draft model: its pending
  pair, k - 1 levels and the commit's step over the round's tokens; a head: its extend and k - 1
  levels), so ratio = (target + calls x drafter) / (target + drafter);
- tokens: the run's own rounds, as running means (each round weighs WEIGHT): a merged round's
  emitted tokens; and what the lookup alone would have emitted, which a merged round tells too:
  the same tokens where its accepted path took the lookup's nodes (or took none), else 1, the
  target's own token at the root, where the model's nodes won (every lookup child failed there);
  a lookup round's emitted tokens count for that mean as they are.

The first lookup round merges (nothing is known yet), and a lookup round is merged at least every
PROBE lookup rounds, so that the merged rounds' mean follows the text as it changes. `always` and
`never` fix the choice.

Every choice is a function of the tokens committed before it, so a seeded run stays seed-stable
(the host draws a round's numbers whichever tree it takes), and both trees are verified losslessly:
the output is distributed as the target's whatever the rule chooses. Pure Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROBE = 16  # a merged round at least every this many lookup rounds (auto)
WEIGHT = 0.1  # each round's weight in the running means (auto)
CHOICES = ("never", "always", "auto")


def cost_ratio(target_bytes: int, drafter_bytes: int, calls: int) -> float:
    """A merged round's floor over a lookup round's: the target's bytes and `calls` drafter calls'
    against the target's and one call's."""
    return (target_bytes + calls * drafter_bytes) / (target_bytes + drafter_bytes)


@dataclass
class MergeRule:
    """choice: never | always | auto; ratio: cost_ratio's, what auto weighs the tokens against."""

    choice: str = "never"
    ratio: float = 1.0
    merged: float | None = None  # running mean of a merged round's emitted tokens
    alone: float | None = None  # running mean of what the lookup's trie alone emits
    since: int = 0  # lookup rounds since the last merged one
    merged_rounds: int = 0  # this run's rounds of each kind
    lookup_rounds: int = 0

    def __post_init__(self):
        if self.choice not in CHOICES:
            raise ValueError(f"hybrid_merge must be one of {', '.join(CHOICES)}, not {self.choice!r}")
        if not (self.ratio > 0 and math.isfinite(self.ratio)):
            raise ValueError(f"a cost ratio must be a positive number, not {self.ratio}")

    def start(self) -> None:
        """A new run: what the last one measured is another text's."""
        self.merged = self.alone = None
        self.since = self.merged_rounds = self.lookup_rounds = 0

    def merge(self) -> bool:
        """Whether the next round whose lookup found continuations merges them with the model's tree."""
        if self.choice != "auto":
            return self.choice == "always"
        if self.merged is None or self.alone is None or self.since + 1 >= PROBE:
            return True
        return self.merged >= self.ratio * self.alone

    def update(self, merged: bool, emitted: int, source: str | None) -> None:
        """A lookup or merged round's emitted tokens and whose nodes its accepted path took
        (core/round/tree_stage.py's path_source: lookup, model or none)."""
        if merged:
            self.merged_rounds += 1
            self.since = 0
            self.merged = _mean(self.merged, emitted)
            alone = 1 if source == "model" else emitted
        else:
            self.lookup_rounds += 1
            self.since += 1
            alone = emitted
        self.alone = _mean(self.alone, alone)

    def describe(self) -> str:
        """What the rule does, for reports (generate -v, the bench JSON)."""
        if self.choice != "auto":
            return f"{self.choice}: {'every' if self.choice == 'always' else 'no'} round whose lookup " \
                   "finds continuations merges them with the model's tree"
        return (f"auto: merge the lookup's trie with the model's tree where a merged round's tokens are "
                f"at least {self.ratio:.2f}x the lookup's alone (the bytes each round streams), and at "
                f"least every {PROBE} lookup rounds")


def _mean(mean: float | None, value: float) -> float:
    return float(value) if mean is None else (1 - WEIGHT) * mean + WEIGHT * value
