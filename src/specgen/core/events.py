"""What a run emits: a RoundEvent per round, then one Finished; the fates of tokens; and the
running record (Output) that a stop string can cut back."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from specgen.core.stats import AcceptanceStats


class Fate(str, Enum):
    ACCEPTED = "accepted"
    RECOVERED = "recovered"
    BONUS = "bonus"


@dataclass
class RoundEvent:
    index: int
    token_ids: list[int]
    fates: list[Fate]
    text: str  # text released by this round (stop strings and held-back prefixes excluded)
    pieces: list[str]  # the text each token completed, for per-token display (before stop-string cuts)
    num_drafted: int
    num_accepted: int
    drafted_ids: list[int]
    timings: dict[str, float]
    draft_q: list[float] | None = None  # q(x) of each drafted token (probabilistic drafting)
    target_p: list[float] | None = None  # p(x) of each drafted token under the target
    logprobs: list[dict] | None = None
    target_entropy: list[float] | None = None  # insight only: entropy of p at each drafted position (nats)
    k_used: int = 0  # the round's k: the profile's, cut to fit max_tokens, or the adaptive one
    early_stop: bool = False  # fewer than k_used drafted (unsure draft, drafted stop token, short n-gram match)
    ranks: list[int] | None = None  # token trees: each accepted node's sibling index (0: the chain's choice)
    tree: object | None = None  # token trees with insight: the round's tree (core/round/tree_stage.TreeView)
    source: str | None = None  # hybrid token trees: whose nodes the accepted path took (lookup | model | none)
    lookup_nodes: int | None = None  # hybrid token trees: the lookup's nodes, the tree's rows 1 .. m (0: none)


@dataclass
class Finished:
    reason: str  # eos | stop | stop_token | length
    text: str
    token_ids: list[int]
    fates: list[Fate]
    stats: AcceptanceStats
    pieces: list[str] = field(default_factory=list)  # per-token text, as in RoundEvent
    tail: str = ""  # text released only at the end (held back for stop strings or incomplete bytes)
    logprobs: list[dict] | None = None


class Output:
    """Everything a run emitted so far, for Finished."""

    def __init__(self, logprobs: bool):
        self.ids: list[int] = []
        self.fates: list[Fate] = []
        self.pieces: list[str] = []
        self.logprobs: list[dict] | None = [] if logprobs else None
        self.starts: list[int] = []  # where each token's text starts in the output text

    def add(self, event: RoundEvent, starts: list[int]) -> None:
        self.extend(event.token_ids, event.fates, event.pieces, starts)
        if self.logprobs is not None:
            self.logprobs += event.logprobs or []

    def extend(self, ids: list[int], fates: list[Fate], pieces: list[str], starts: list[int]) -> None:
        """A round's tokens without its event (the batch loop builds none: a row's events are not
        yielded, and one per row and round is host work that grows with the batch)."""
        self.starts += starts
        self.ids += ids
        self.fates += fates
        self.pieces += pieces

    def trim(self, length: int) -> list[Fate]:
        """Drop the tokens whose text starts at or after `length` (a stop string cut the text there);
        returns their fates."""
        keep = sum(1 for at in self.starts if at < length)
        dropped = self.fates[keep:]
        self.ids, self.fates, self.pieces, self.starts = (
            self.ids[:keep], self.fates[:keep], self.pieces[:keep], self.starts[:keep])
        if self.logprobs is not None:
            self.logprobs = self.logprobs[:keep]
        return dropped


def logprob_entries(tokens: list[int], chosen: list[float], top_values: list[list[float]] | None,
                    top_ids: list[list[int]] | None) -> list[dict]:
    """Each emitted token's logprob entry, with its alternatives (`top`) where they were asked for:
    the single decode loop's and a batch row's alike (core/decode.py, core/round/batch_logprobs.py)."""
    entries = []
    for i, token in enumerate(tokens):
        entry = {"token_id": token, "logprob": chosen[i]}
        if top_values is not None:
            entry["top"] = [{"token_id": int(t), "logprob": float(v)} for v, t in zip(top_values[i], top_ids[i])]
        entries.append(entry)
    return entries


def text_starts(offset: int, pieces: list[str]) -> list[int]:
    starts = []
    for piece in pieces:
        starts.append(offset)
        offset += len(piece)
    return starts
