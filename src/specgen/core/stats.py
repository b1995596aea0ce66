"""Acceptance statistics: one object fed by the loop's round events, read by every command.

acceptance rate = accepted / drafted; mean accepted length = emitted tokens per round (accepted + 1);
per-position acceptance = P(draft position i accepted | position i was drafted).
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
    first_token_seconds: float | None = None

    def add_round(self, num_drafted: int, num_accepted: int, num_emitted: int, timings: dict[str, float],
                  early_stop: bool = False, k_used: int = 0) -> None:
        self.rounds += 1
        self.k_total += k_used
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.emitted += num_emitted
        self.early_stops += int(early_stop)
        if num_emitted > num_accepted:  # a round cut short by a stop token ends on an accepted token
            if num_accepted == num_drafted:
                self.bonus += 1
            else:
                self.recovered += 1
        grow = num_drafted - len(self.drafted_at)
        if grow > 0:
            self.drafted_at.extend([0] * grow)
            self.accepted_at.extend([0] * grow)
        for i in range(num_drafted):
            self.drafted_at[i] += 1
        for i in range(num_accepted):
            self.accepted_at[i] += 1
        for phase, value in timings.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + value

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

        first_token_seconds is per run and stays this object's.
        """
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name == "first_token_seconds":
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
    def decode_seconds(self) -> float:
        return sum(self.seconds.values())

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
    def per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def tokens_per_second(self) -> float:
        total = self.decode_seconds + self.prefill_seconds
        return self.emitted / total if total > 0 else 0.0

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
            "prefill_seconds": self.prefill_seconds,
            "time_to_first_token_seconds": self.first_token_seconds,
            "round_seconds": {k: v for k, v in self.seconds.items()},
        }

    def summary_line(self) -> str:
        return (
            f"{self.emitted} tokens in {self.rounds} rounds, {self.tokens_per_second:.1f} tok/s, "
            f"acceptance {self.acceptance_text}, mean accepted length {self.mean_accepted_length:.2f}"
        )
