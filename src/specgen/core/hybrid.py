"""Hybrid proposer: prompt lookup where the context repeats itself, the draft model elsewhere.

Each round first looks the committed context up in NgramProposer's tables. A match (a suffix of
ngram_max down to ngram_min tokens seen before) drafts the tokens that followed it, with one-hot
q; without one the draft model drafts the round, with q its warped distribution when sampling.
The choice reads only the committed context, never a random draw, so every round is an ordinary
round of one lossless proposer and the output follows the target exactly.

Both proposers follow every committed token. The draft model does not run in an n-gram round: the
tokens committed there join its `pending` ones, which its next round feeds in one step.
"""

from __future__ import annotations

from specgen.core.ngram import NgramProposer
from specgen.core.proposers import DraftModelProposer, Proposal


class HybridProposer:
    kind = "hybrid"

    def __init__(self, ngram: NgramProposer, draft: DraftModelProposer):
        self.ngram = ngram
        self.draft = draft
        self.runner = draft.runner  # gpu/loop.py reserves the draft cache's room through `.runner`
        self.used: NgramProposer | DraftModelProposer = draft  # who drafted the current round
        self.rounds = {"ngram": 0, "draft": 0}  # rounds each proposer drafted in this run

    @property
    def insight(self) -> bool:
        return self.draft.insight

    @insight.setter
    def insight(self, value: bool) -> None:  # the decoder sets it; only the draft model reads it
        self.draft.insight = value

    def start(self, prompt_ids: list[int]) -> None:
        self.ngram.start(prompt_ids)
        self.draft.start(prompt_ids)
        self.rounds = dict.fromkeys(self.rounds, 0)

    def propose(self, k: int, state, generator) -> Proposal:
        proposal = self.ngram.propose(k)
        self.used = self.ngram if len(proposal) else self.draft
        self.rounds[self.used.kind] += 1
        return proposal if self.used is self.ngram else self.draft.propose(k, state, generator)

    def commit(self, num_accepted: int, next_token: int) -> None:
        committed = self.used.drafted[:num_accepted] + [next_token]
        self.ngram.follow(committed)
        if self.used is self.draft:
            self.draft.commit(num_accepted, next_token)
        else:
            self.draft.follow(committed)
