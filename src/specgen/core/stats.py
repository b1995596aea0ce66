"""Acceptance statistics: one object fed by the loop's round events, read by every command.

acceptance rate = accepted / drafted; mean accepted length = emitted tokens per round (accepted + 1);
per-position acceptance = P(draft position i accepted | position i was drafted).
Token trees: a drawn child that the node budget left out of the tree, accepted by the recursive
walk, ends the round and counts as accepted, with no recovered or bonus token after it
(docs/sampling.md, "Token trees").

What a tree bought (tree rounds, from each accepted node's sibling index, 0 the first child): the
chain inside the tree is the path of first children from the root (each node's child the draft
ranks first: its top-1 token, or with drawn children its first draw; with top-w children it is
the best-scoring node of every level, the draft's own greedy chain). Verified with the same
random numbers, that chain accepts exactly the leading first children of the tree's accepted
path (a0 of them: the walks try a node's first child with the chain's own test), then emits one
more token, so it would have yielded min(a0 + 1, the round's tokens) (the cap: a stop token or
max_tokens ends both). Per depth d: the rounds whose accepted path reached d (accepted_at),
those whose chain would have (chain_at), and those whose node at d is not a first child
(branch_at: a branch won there).

Hybrid token trees (the lookup's trie merged with the model's tree, core/round/merged_tree.py):
each round's accepted path is the lookup's nodes or the model's, never both (a node's children
are its own part's); source_rounds counts the rounds told, merged_rounds those whose tree held
the lookup's nodes, lookup_paths and model_paths the rounds whose accepted path took each part's,
lookup_accepted and model_accepted the tokens each one's nodes gave (a draw taken outside the tree
is the model's), and lookup_at per depth the rounds whose accepted path reached it through the
lookup's nodes (the model's: accepted_at less those).

Rates (one definition each, used by generate, bench and the live view):
generation rate = tokens / seconds from the run's start to its last token (prefill included);
decode rate = tokens after the first round's / seconds after the first round's tokens were out:
what decoding sustains once it runs, without prefill, the first round and start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

PHASES = ("draft", "verify", "sample", "other")


@dataclass
class AcceptanceStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    recovered: int = 0
    bonus: int = 0
    early_stops: int = 0  # rounds that drafted fewer tokens than their k
    k_total: int = 0  # sum of the k used per round (adaptive k varies it)
    drafted_at: list[int] = field(default_factory=list)  # [position] rounds that drafted position i
    accepted_at: list[int] = field(default_factory=list)  # [position] rounds that accepted position i
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    prefill_seconds: float = 0.0
    first_token_seconds: float | None = None  # from the run's start to the first round's tokens
    first_round_tokens: int = 0  # tokens that first round released
    generation_seconds: float = 0.0  # from the run's start to the latest round's tokens
    tree_rounds: int = 0  # rounds that verified a token tree
    tree_emitted: int = 0  # tokens those rounds emitted (as verified: drop() leaves it, as the chain's)
    chain_emitted: int = 0  # tokens the chain inside each tree would have emitted (see above)
    chain_at: list[int] = field(default_factory=list)  # [depth] tree rounds whose chain reached depth i + 1
    branch_at: list[int] = field(default_factory=list)  # [depth] tree rounds accepting a non-first child there
    source_rounds: int = 0  # hybrid tree rounds (see above)
    merged_rounds: int = 0  # of those, rounds whose tree held the lookup's nodes
    lookup_paths: int = 0  # rounds whose accepted path took the lookup's nodes
    model_paths: int = 0  # rounds whose accepted path took the model's
    lookup_accepted: int = 0  # tokens accepted from the lookup's nodes
    model_accepted: int = 0  # tokens accepted from the model's
    lookup_at: list[int] = field(default_factory=list)  # [depth] rounds whose path reached it through the lookup's

    def add_round(self, num_drafted: int, num_accepted: int, num_emitted: int, timings: dict[str, float],
                  early_stop: bool = False, k_used: int = 0, ranks: list[int] | None = None,
                  source: tuple[str, int] | None = None) -> None:
        """ranks: a tree round's accepted nodes' sibling indices (num_accepted of them; None: a chain).
        source: a hybrid tree round's (whose nodes the accepted path took, the lookup's node count)."""
        self.rounds += 1
        self.k_total += k_used
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.emitted += num_emitted
        if early_stop:
            self.early_stops += 1
        # a round cut short by a stop token ends on an accepted token, as does a tree's that ends on
        # a draw accepted outside the tree
        if num_emitted > num_accepted:
            if num_accepted == num_drafted:
                self.bonus += 1
            else:
                self.recovered += 1
        drafted_at, accepted_at = self.drafted_at, self.accepted_at
        grow = num_drafted - len(drafted_at)
        if grow > 0:
            drafted_at.extend([0] * grow)
            accepted_at.extend([0] * grow)
        for i in range(num_drafted):
            drafted_at[i] += 1
        for i in range(num_accepted):
            accepted_at[i] += 1
        seconds = self.seconds
        for phase, value in timings.items():
            seconds[phase] = seconds.get(phase, 0.0) + value
        if ranks is not None:
            self._add_tree(ranks, num_emitted)
        if source is not None:
            self._add_source(*source, num_accepted)

    def _add_tree(self, ranks: list[int], num_emitted: int) -> None:
        chain = next((i for i, rank in enumerate(ranks) if rank != 0), len(ranks))  # a0: its accepted
        self.tree_rounds += 1
        self.tree_emitted += num_emitted
        self.chain_emitted += min(chain + 1, num_emitted)
        grow = len(ranks) - len(self.chain_at)
        if grow > 0:
            self.chain_at.extend([0] * grow)
            self.branch_at.extend([0] * grow)
        for i, rank in enumerate(ranks):
            self.chain_at[i] += int(i < chain)
            self.branch_at[i] += int(rank != 0)

    def _add_source(self, drafter: str, lookup_nodes: int, num_accepted: int) -> None:
        self.source_rounds += 1
        self.merged_rounds += int(lookup_nodes > 0)
        if drafter == "lookup":
            self.lookup_paths += 1
            self.lookup_accepted += num_accepted
            self.lookup_at.extend([0] * (num_accepted - len(self.lookup_at)))
            for i in range(num_accepted):
                self.lookup_at[i] += 1
        elif drafter == "model":
            self.model_paths += 1
            self.model_accepted += num_accepted

    @property
    def lookup_share(self) -> float | None:
        """The lookup's share of a hybrid tree run's accepted tokens (None: none accepted, or no hybrid round)."""
        accepted = self.lookup_accepted + self.model_accepted
        return self.lookup_accepted / accepted if accepted else None

    def released(self, seconds: float, tokens: int) -> None:
        """A round's tokens are out, `seconds` after the run's start (the first time: time to first token)."""
        if self.first_token_seconds is None:
            self.first_token_seconds = seconds
            self.first_round_tokens = tokens
        self.generation_seconds = seconds

    def drop(self, fates: list[str]) -> None:
        """Tokens of earlier rounds taken back from the output (a stop string that began there):
        emitted and the per-fate counts follow the output; what the verifier decided stays."""
        self.emitted -= len(fates)
        for fate in fates:
            if fate == "accepted":
                self.accepted -= 1
            elif fate == "recovered":
                self.recovered -= 1
            else:
                self.bonus -= 1

    def merge(self, other: AcceptanceStats) -> None:
        """Add another run's counts, per-position counts and seconds (bench totals over prompts).

        The times of one run's tokens (PER_RUN) stay this object's.
        """
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name in PER_RUN:
                continue
            if isinstance(mine, list):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, value in enumerate(theirs):
                    mine[i] += value
            elif isinstance(mine, dict):
                for key, value in theirs.items():
                    mine[key] = mine.get(key, 0.0) + value
            else:
                setattr(self, f.name, mine + theirs)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_text(self) -> str:
        """The acceptance rate for people: n/a when nothing was drafted (target only, or an n-gram
        proposer that never matched), where 0.0% would read as a draft that always lost."""
        return f"{self.acceptance_rate:.1%}" if self.drafted else "n/a"

    @property
    def mean_accepted_length(self) -> float:
        return self.emitted / self.rounds if self.rounds else 0.0

    @property
    def mean_k(self) -> float:
        return self.k_total / self.rounds if self.rounds else 0.0

    @property
    def tree_gain(self) -> float | None:
        """Tokens per tree round over what the chain inside the tree would have yielded (None: no tree round)."""
        return (self.tree_emitted - self.chain_emitted) / self.tree_rounds if self.tree_rounds else None

    def tree_line(self) -> str:
        """What the tree bought, for people ("" without tree rounds): tokens per round over its
        chain's, per depth the share of the paths reaching it through a branch, and in a hybrid
        run the lookup's share of the accepted tokens."""
        if not self.tree_rounds:
            return ""
        wins = [b / a if a else 0.0 for b, a in zip(self.branch_at, self.accepted_at)]
        line = f"tree {self.tree_gain:+.2f} tok/round over its chain"
        if wins:
            line += f", branch wins at depth 1..{len(wins)}: " + " ".join(f"{w:.0%}" for w in wins)
        if self.lookup_share is not None:  # a hybrid tree run: what the lookup's nodes gave
            line += f", lookup {self.lookup_share:.0%} of accepted"
        return line

    @property
    def per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def tokens_per_second(self) -> float:
        return generation_rate(self.emitted, self.generation_seconds)

    @property
    def decode_tokens(self) -> int:
        return decode_tokens(self.emitted, self.first_round_tokens)

    @property
    def decode_seconds(self) -> float | None:
        return decode_seconds(self.first_token_seconds, self.generation_seconds)

    @property
    def decode_tokens_per_second(self) -> float | None:
        return decode_rate(self.emitted, self.first_round_tokens, self.first_token_seconds, self.generation_seconds)

    def as_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "recovered": self.recovered,
            "bonus": self.bonus,
            "generated_tokens": self.emitted,
            "early_stops": self.early_stops,
            "mean_k": self.mean_k,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "per_position_acceptance": self.per_position,
            "tokens_per_second": self.tokens_per_second,
            "generation_seconds": self.generation_seconds,
            "prefill_seconds": self.prefill_seconds,
            "time_to_first_token_seconds": self.first_token_seconds,
            "decode_tokens": self.decode_tokens,
            "decode_seconds": self.decode_seconds,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "round_seconds": {k: v for k, v in self.seconds.items()},
        }

    def summary_line(self, interrupted: bool = False) -> str:
        """Time to first token, then the decode rate (not the generation rate, which mixes the two);
        interrupted: Ctrl-C ended the run, said before the rates so the counts read as partial."""
        rate = self.decode_tokens_per_second
        then = f", then {rate:.1f} tok/s" if rate is not None else ""  # nothing to rate after a single round
        state = " (interrupted)" if interrupted else ""
        return (
            f"{self.emitted} tokens in {self.rounds} rounds{state}, first token "
            f"{1000 * (self.first_token_seconds or 0.0):.0f}"
            f" ms{then}, "
            f"acceptance {self.acceptance_text}, mean accepted length {self.mean_accepted_length:.2f}"
        )


PER_RUN = ("first_token_seconds", "first_round_tokens", "generation_seconds")


def generation_rate(tokens: int, seconds: float) -> float:
    """Tokens over the whole generation's seconds (bench's tok/s column, generate's tokens_per_second)."""
    return tokens / seconds if seconds > 0 else 0.0


def decode_tokens(tokens: int, first_round_tokens: int) -> int:
    """Tokens released after the first round (a stop string may take back earlier ones)."""
    return max(0, tokens - first_round_tokens)


def decode_seconds(first_token_seconds: float | None, seconds: float) -> float | None:
    """Seconds from the first round's tokens to the last tokens; None without a later round."""
    if first_token_seconds is None or seconds <= first_token_seconds:
        return None
    return seconds - first_token_seconds


def decode_rate(tokens: int, first_round_tokens: int, first_token_seconds: float | None,
                seconds: float) -> float | None:
    """The decode rate (bench's decode tok/s column, generate's decode_tokens_per_second): tokens
    after the first round over the seconds after it; None when no round followed the first."""
    after = decode_seconds(first_token_seconds, seconds)
    return decode_tokens(tokens, first_round_tokens) / after if after is not None else None
