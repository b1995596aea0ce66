"""Prompt lookup: draft by copying what followed the most recent earlier occurrence of the suffix.

The context is the prompt plus every committed token. For n from ngram_max down to ngram_min, the
last n tokens are looked up among the n-grams that END before the last position, so the suffix
never matches itself; the first n with a match wins, and the proposal is the up to k tokens that
followed the most recent such occurrence (fewer when it sits near the end of the context).

One table per n maps an n-gram to the end of its latest occurrence. It is filled once for the
prompt and then only for the committed tokens of each round, so a round costs O(k + new tokens)
lookups and the prompt is read once, by zip() in C rather than by a Python loop per token.
Proposals are deterministic: q is one-hot, lossless at any temperature.

Trees (lookup_tree, speculation.tree_width > 1): every DISTINCT continuation the index finds, as
branches of one trie. With `every`, each table entry also chains back to the n-gram's earlier
occurrences (`earlier[n][end]`: the end of the occurrence before the one ending at `end`, -1
none), so a lookup reads the occurrences latest first in O(occurrences read), never by scanning
the context. Keeping the chains costs a Python loop per indexed token (a prompt of 2k tokens:
some milliseconds), so only tree rounds ask for them.
"""

from __future__ import annotations


from dataclasses import dataclass, field

SCAN = 4  # lookup_tree reads at most SCAN * nodes occurrences (a round's cost stays O(nodes k))


@dataclass
class LookupTree:
    """A drafted tree: tokens [m] and parents [m] (the index of a node's parent among the nodes, -1
    for a child of the last committed token; parents before children). Falsy when empty, as a
    chain lookup's empty list is."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)


class NgramProposer:
    kind = "ngram"

    def __init__(self, ngram_min: int, ngram_max: int, every: bool = False):
        """every: keep each n-gram's earlier occurrences too (lookup_tree reads them)."""
        self.sizes = range(ngram_max, ngram_min - 1, -1)  # longest first
        self.every = every
        self.tokens: list[int] = []
        self.tables: dict[int, dict[tuple[int, ...], int]] = {}
        self.earlier: dict[int, list[int]] = {}  # per n, by end: the previous occurrence's end (-1: none)
        self.indexed = 0  # n-grams ending before this position are in the tables

    def start(self, prompt_ids: list[int]) -> None:
        self.tokens = list(prompt_ids)
        self.tables = {n: {} for n in self.sizes}
        self.earlier = {n: [] for n in self.sizes} if self.every else {}
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

    def lookup_tree(self, k: int, width: int, nodes: int, root_width: int | None = None) -> LookupTree:
        """Every distinct continuation (up to k tokens) of the n-grams that match the context's
        suffix, merged into a trie: shared prefixes share nodes, a node has at most `width`
        children (the root at most `root_width`, default `width`), the trie at most `nodes` nodes,
        depth <= k. Needs `every`.

        Order: the longest matching n first, its occurrences latest first, then shorter n (whose
        occurrences include the longer ones': an end already read is skipped); each continuation
        is inserted whole, or up to the node where a cap (width or nodes) stops it. So the first
        branch is lookup(k)'s chain (nodes >= k: the profile's rule), and a node's children are
        ranked by the most recent occurrence that reached them. Recency, not frequency: the
        chain's own proposal stays first, so the tree never offers less than the chain, and a
        greedy walk that agrees with the chain follows rank 0 as the chain does. A deterministic
        function of the committed sequence (q is one-hot: the sibling walk is lossless)."""
        if not self.every:
            raise ValueError("lookup_tree needs NgramProposer(every=True)")
        tree = LookupTree()
        tokens, length = self.tokens, len(self.tokens)
        root_width = width if root_width is None else root_width
        if k <= 0 or nodes <= 0 or width <= 0 or root_width <= 0:
            return tree
        kids: list[dict[int, int]] = [{}]  # per trie node (0: the root), token -> node
        seen: set[int] = set()
        scan = SCAN * nodes
        for n in self.sizes:
            if n > length:
                continue
            end = self.tables[n].get(tuple(tokens[length - n:]), -1)
            while end >= 0 and scan > 0 and len(tree) < nodes:
                if end not in seen:
                    seen.add(end)
                    scan -= 1
                    self._insert(tree, kids, tokens[end:end + k], width, nodes, root_width)
                end = self.earlier[n][end]
        return tree

    @staticmethod
    def _insert(tree: LookupTree, kids: list[dict[int, int]], path: list[int], width: int, nodes: int,
                root_width: int) -> None:
        at = 0  # trie node (0: the root; node i + 1 is tree node i)
        for token in path:
            below = kids[at].get(token)
            if below is None:
                if len(kids[at]) >= (root_width if at == 0 else width) or len(tree) >= nodes:
                    return
                tree.tokens.append(token)
                tree.parents.append(at - 1)
                kids.append({})
                below = kids[at][token] = len(tree)
            at = below

    def _index(self) -> None:
        """Add the n-grams ending at positions indexed .. len-1 (the suffix ending at len is left out)."""
        tokens, stop = self.tokens, len(self.tokens)
        for n, table in self.tables.items():
            first = max(self.indexed, n)  # an n-gram needs n tokens before its end
            if first >= stop:
                continue
            grams = zip(*(tokens[first - n + i:stop - n + i] for i in range(n)))
            if not self.every:
                table.update(zip(grams, range(first, stop)))  # later ends overwrite: the latest wins
                continue
            earlier = self.earlier[n]
            earlier.extend([-1] * (stop - len(earlier)))
            for end, gram in zip(range(first, stop), grams):
                earlier[end] = table.get(gram, -1)
                table[gram] = end
        self.indexed = stop


class TreeLookup:
    """The n-gram proposer drafting trees for a TreeRound: lookup(k) is lookup_tree(k, width, nodes,
    root_width) (the decode loop asks it as it asks the chain's proposer; the round's HostTree, or
    the hybrid proposer's MergedTree, takes the tree)."""

    kind = "ngram"

    def __init__(self, ngram_min: int, ngram_max: int, width: int, nodes: int, root_width: int | None = None):
        self.proposer = NgramProposer(ngram_min, ngram_max, every=True)
        self.width, self.nodes, self.root_width = width, nodes, root_width

    @property
    def tokens(self) -> list[int]:
        return self.proposer.tokens

    def start(self, prompt_ids: list[int]) -> None:
        self.proposer.start(prompt_ids)

    def follow(self, committed: list[int]) -> None:
        self.proposer.follow(committed)

    def lookup(self, k: int) -> LookupTree:
        return self.proposer.lookup_tree(k, self.width, self.nodes, self.root_width)
