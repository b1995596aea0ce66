"""Prompts and stub lookups for the hybrid proposer's token trees (tests/core/round/
test_hybrid_tree_round.py, test_mtp_tree_round.py): rounds where prompt lookup's trie is merged with
a model's tree, and host rounds that accept up to k drafts on a tiny random target."""

from __future__ import annotations

import random

from decode_helpers import next_token_probs
from specgen.core.drafters.ngram import LookupTree


def lookup_prompts(vocab: int, count: int, seed: int = 0, mixed: bool = True) -> list[list[int]]:
    """Pieces repeated with a change (one n-gram, several continuations: the lookup's trees); mixed:
    every other one a piece and a random token instead (the model drafts, until the output repeats
    itself)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        piece = [rng.randrange(vocab) for _ in range(rng.randint(2, 5))]
        tweak = list(piece)
        tweak[rng.randrange(1, len(tweak))] = rng.randrange(vocab)
        out.append(piece * 2 + tweak + piece if i % 2 or not mixed else piece + [rng.randrange(vocab)])
    return out


class Following:
    """A stub lookup's part of the proposer protocol: the committed sequence, and how often asked."""

    kind = "ngram"

    def start(self, prompt_ids: list[int]) -> None:
        self.tokens, self.asked = list(prompt_ids), 0

    def follow(self, committed: list[int]) -> None:
        self.tokens += committed


class OracleLookup(Following):
    """A lookup for the decode loop that knows the target's greedy continuation: every other round
    (from the first) a tree whose first branch is that continuation cut after its first `right`
    tokens and ended by a wrong one, and a wrong child of the root beside it; `right` cycles
    through 0 .. k, so greedy host rounds emit every count 1 .. k + 1 (a tiny random target
    rarely follows a real lookup's drafts, whose host rounds then emit one token). The rounds
    between find nothing: the model drafts them."""

    def __init__(self, model, vocab: int, k: int):
        self.model, self.vocab, self.k = model, vocab, k
        self.tokens: list[int] = []
        self.asked = 0

    def lookup(self, k: int) -> LookupTree:
        self.asked += 1
        if k <= 0 or self.asked % 2 == 0:
            return LookupTree()
        right = (self.asked // 2) % (self.k + 1)
        branch = []
        for _ in range(min(right, k)):
            branch.append(int(next_token_probs(self.model, self.tokens + branch).argmax()))
        if len(branch) < k:  # a token the greedy target does not take there
            branch.append((int(next_token_probs(self.model, self.tokens + branch).argmax()) + 1) % self.vocab)
        wrong = (branch[0] + 2) % self.vocab
        return LookupTree(branch + [wrong], list(range(-1, len(branch) - 1)) + [-1])
