"""Prompt lookup: draft by copying what followed the most recent earlier occurrence of the suffix.

The context is the prompt plus every committed token. For n from ngram_max down to ngram_min, the
last n tokens are looked up among the n-grams that END before the last position, so the suffix
never matches itself; the first n with a match wins, and the proposal is the up to k tokens that
followed the most recent such occurrence (fewer when it sits near the end of the context).

One table per n maps an n-gram to the end of its latest occurrence. It is filled once for the
prompt and then only for the committed tokens of each round, so a round costs O(k + new tokens)
lookups and the prompt is read once, by zip() in C rather than by a Python loop per token.
Proposals are deterministic: q is one-hot, lossless at any temperature.
"""

from __future__ import annotations



class NgramProposer:
    kind = "ngram"

    def __init__(self, ngram_min: int, ngram_max: int):
        self.sizes = range(ngram_max, ngram_min - 1, -1)  # longest first
        self.tokens: list[int] = []
        self.tables: dict[int, dict[tuple[int, ...], int]] = {}
        self.indexed = 0  # n-grams ending before this position are in the tables

    def start(self, prompt_ids: list[int]) -> None:
        self.tokens = list(prompt_ids)
        self.tables = {n: {} for n in self.sizes}
        self.indexed = 0
        self._index()

    def follow(self, committed: list[int]) -> None:
        """Extend the context with a round's committed tokens, whoever drafted them."""
        self.tokens += committed
        self._index()

    def lookup(self, k: int) -> list[int]:
        """Up to k tokens after the latest earlier occurrence of the longest matching suffix."""
        tokens, length = self.tokens, len(self.tokens)
        if k <= 0:
            return []
        for n in self.sizes:
            if n > length:
                continue
            end = self.tables[n].get(tuple(tokens[length - n:]))
            if end is not None:
                return tokens[end:end + k]
        return []

    def _index(self) -> None:
        """Add the n-grams ending at positions indexed .. len-1 (the suffix ending at len is left out)."""
        tokens, stop = self.tokens, len(self.tokens)
        for n, table in self.tables.items():
            first = max(self.indexed, n)  # an n-gram needs n tokens before its end
            if first >= stop:
                continue
            grams = zip(*(tokens[first - n + i:stop - n + i] for i in range(n)))
            table.update(zip(grams, range(first, stop)))  # later ends overwrite: the latest wins
        self.indexed = stop
