"""`tree_width` / `tree_nodes` auto: the round shape with the most tokens per second, predicted from
what `specgen bench` measured on this machine (core/measured.py), never from guesses.

Facts: measured rows, one per (proposer, temperature, coupling, k, width, nodes) the bench ran, each
with the round's phases in ms (draft, verify, sample, other: core/stats.py's PHASES, per round), its
wall ms per round (wall_ms: its tokens over the bench's decode rate), its tokens per round and its
per-position acceptance P_i = P(at least i + 1 drafts accepted); and target-only's round (k 0: a
one-row target step).

A shape's rate is its tokens per round over its round's wall ms. For a shape the bench ran at this
sampling regime both are its own measurements. For one it did not run:

- round ms = verify(n + 1) + k · level(w) + rest(w, n + 1):
  verify(rows): the target step's ms, linear between the measured (rows, verify ms) points of every
  shape (target-only at 1 row, chains at k + 1, trees at n + 1), never past the largest rows measured;
  level(w): the draft's ms per level (draft ms / k) at width w, measured at that width (a width never
  measured is not considered); rest(w, rows): the wall ms left besides draft and verify (the walk,
  the host), linear in rows between that width's measured rows, flat beyond them.
- tokens per round = 1 + the expected accepted length:
  a chain's: the sum of its first k P_i, pooled over the measured chains (a position no chain
  drafted counts 0);
  a tree's: a_d = P_d / P_(d-1) is the top-1 child's acceptance at depth d; the stats have no
  per-rank acceptance, so a lower-ranked sibling is modelled conservatively: the rank-r child is
  the target's token with probability a_d ((1 - a_d) SIBLING)^(r - 1), i.e. each further sibling
  catches SIBLING (1/2) of the top child's share of what the ones before it missed. The tree is
  built as core/round/tree.py builds it (each level expands the w best nodes of the level before;
  the n best nodes of all levels are kept), and its expected accepted length is the sum, over the
  kept nodes, of the probability that the path to each is accepted.

Where trees of that width were measured, the modelled accepted length is scaled by the least of
their measured / modelled ratios (at most 1): a measurement that the model overestimated (top-w
children at t 0.8 accepted fewer tokens than the chain on the H100, docs/benchmarks.md) lowers it.

A modelled tree must beat the best chain by MARGIN (5%) to be chosen: its sibling gain is a model,
not a measurement. With tree_width auto, no speculation is chosen where target-only's measured
round is faster than the best shape, so that auto does not fall below target-only. Where nothing
was measured for the request's regime, auto is a chain: the shape specgen measured fast everywhere
so far (docs/benchmarks.md).

Trees stand for the context they were measured at. A round's verification attends over every
position before it, and a tree's rows each walk their own path past the prompt while a chain's
share theirs, so a tree's round grows with the context faster than a chain's (Llama 3.1 8B shapes,
one H200: a 32-node round 1.18x the chain's after a 10-token prompt, 1.30x after 1,024 tokens;
docs/benchmarks.md). Rows carry `positions`, the mean position their generations reached (prompt
and max_tokens); a request that reaches past POSITIONS_REACH times the trees' and POSITIONS_SLACK
more is chosen among the chain and target-only, and the reason says to bench at that length.

Pure Python: no torch, so that it is tested with synthetic numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specgen.core.settings import AUTO, MAX_TREE_NODES, tree_envelope

SIBLING = 0.5  # the share of the top child's acceptance each further sibling is credited with
POSITIONS_REACH = 2.0  # trees stand for requests up to this many times the positions they were measured at
POSITIONS_SLACK = 256  # and this many more (a short bench's trees still stand for a prompt of a few hundred tokens)
MARGIN = 0.05  # a modelled (not measured) tree must be predicted this much faster than the chain
PHASES = ("draft", "verify", "sample", "other")
BENCH_HINT = "specgen bench --k K --tree-width 1,2,4 --tree-nodes 8,16 measures trees"


@dataclass(frozen=True)
class Prediction:
    """A shape's predicted tokens per round and round ms; measured: the bench ran this very shape."""

    width: int  # 1: a chain; 0: target-only
    nodes: int
    tokens: float
    ms: float
    measured: bool

    @property
    def rate(self) -> float:
        """Tokens per second while decoding: no prefill, so above bench's tok/s column, which counts it."""
        return 1000.0 * self.tokens / self.ms if self.ms > 0 else 0.0

    def label(self) -> str:
        if self.width == 0:
            return f"target-only {self.rate:,.0f} decode tok/s (measured)"
        shape = "chain" if self.width == 1 else f"w={self.width} n={self.nodes}"
        return f"{shape} {self.rate:,.0f} decode tok/s ({'measured' if self.measured else 'modelled'})"


@dataclass(frozen=True)
class TreeChoice:
    """What auto resolved to, and why (generate -v, bench JSON)."""

    width: int  # 1: a chain
    nodes: int  # the node budget (k for a chain)
    speculate: bool = True  # False: target-only is predicted faster (tree_width auto only)
    reason: str = ""
    predictions: list[Prediction] = field(default_factory=list)


def regime(rows: list[dict], temperature: float, coupling: str, proposer: str = "draft") -> list[dict]:
    """The measured rows that stand for a request: its proposer's (and target-only's) at its
    temperature, or, sampled, at the nearest sampled temperature measured with its coupling (greedy
    takes greedy rows only)."""
    def same(row: dict) -> bool:
        if temperature == 0:
            return row["temperature"] == 0
        return row["temperature"] > 0 and row.get("coupling") == coupling

    ours = [row for row in rows if same(row) and row["proposer"] in (proposer, "none")]
    if not ours:
        return []
    nearest = min({row["temperature"] for row in ours}, key=lambda t: (abs(t - temperature), t))
    return [row for row in ours if row["temperature"] == nearest]


def choose(k: int, width: int | str, nodes: int | str, rows: list[dict], where: str = "",
           positions: int | None = None) -> TreeChoice:
    """The shape for depth k: width and nodes as the profile gives them (an int, or auto), from
    `rows` (one regime's, regime()). where: the facts' description, for the reason. positions: the
    most positions the request's generations reach (prompt and max_tokens), where known: with width
    auto, trees measured at far fewer are not considered (the module's docstring)."""
    if width == 1:
        return TreeChoice(1, k, reason="tree_width 1 is a chain")
    nodes = nodes or k  # 0 = k
    beyond = ""
    if width == AUTO and positions is not None:
        rows, beyond = _within_reach(rows, positions)
    facts = _Facts(rows)
    if not facts.chains and not facts.trees:
        shape = "a chain" if width == AUTO else f"width {width} with k = {k} nodes"
        return TreeChoice(1 if width == AUTO else width, k,
                          reason=f"nothing measured{where}: {shape} ({BENCH_HINT}){beyond}")
    widths = [width] if width != AUTO else [1, *sorted(facts.trees)]
    candidates = []
    for w in widths:
        budgets = [k] if w == 1 else ([nodes] if nodes != AUTO else range(k, _most_nodes(k, w) + 1))
        for n in budgets:
            if w == 1 or k <= n <= _most_nodes(k, w):
                predicted = facts.predict(k, w, n)
                if predicted is not None:
                    candidates.append(predicted)
    if not candidates and width != AUTO:
        return TreeChoice(width, k, reason=f"width {width} was not measured at k = {k}{where}: {k} nodes "
                                           f"({BENCH_HINT})")
    chains = [c for c in candidates if c.width == 1]
    if width == AUTO and not chains:  # a tree is chosen only against a chain it is predicted to beat
        return TreeChoice(1, k, reason=f"the chain of k = {k} cannot be predicted from what was measured{where}: "
                                       f"a chain ({BENCH_HINT}){beyond}")
    best_chain = max((c.rate for c in chains), default=0.0)

    def score(c: Prediction) -> float:
        """The rate a shape competes with: a modelled tree's only where it beats the chain by MARGIN."""
        if c.width > 1 and not c.measured and chains:
            return c.rate / (1 + MARGIN) if c.rate / (1 + MARGIN) > best_chain else 0.0
        return c.rate

    best = max(candidates, key=lambda c: (score(c), -c.width, -c.nodes))
    trees = [c for c in candidates if c.width > 1]
    alone = facts.target_only()
    shown = [best]
    if best.width > 1 and chains:
        shown.append(max(chains, key=lambda c: c.rate))
    if best.width == 1 and trees:
        shown.append(max(trees, key=lambda c: c.rate))
    summary = ", ".join([c.label() for c in shown] + ([alone.label()] if alone else []))
    if width == AUTO and alone is not None and alone.rate > score(best):
        return TreeChoice(1, k, speculate=False, predictions=shown + [alone],
                          reason=f"no speculation, target-only is faster{where}: {summary}{beyond}")
    what = "a chain" if best.width == 1 else f"a tree of width {best.width}, {best.nodes} nodes"
    return TreeChoice(best.width, best.nodes if best.width > 1 else k, predictions=shown + ([alone] if alone else []),
                      reason=f"{what}{where}: {summary}{beyond}")


def _within_reach(rows: list[dict], positions: int) -> tuple[list[dict], str]:
    """(the rows that stand for a request reaching `positions`, why trees were left out or ""):
    trees measured where generations reached far fewer positions are left out (rows without
    `positions`, kept before rows carried it, stand for any request)."""
    measured = [row["positions"] for row in rows if row["tree_width"] > 1 and row.get("positions")]
    if not measured or positions <= POSITIONS_REACH * max(measured) + POSITIONS_SLACK:
        return rows, ""
    kept = [row for row in rows if row["tree_width"] == 1 or not row.get("positions")]
    return kept, (f"; trees left out: measured where generations reached about {max(measured):,.0f} positions, "
                  f"this run's reach {positions:,} (bench with prompts this long: --prompts-file)")


def _most_nodes(k: int, width: int) -> int:
    return min(tree_envelope(k, width), MAX_TREE_NODES)


def _interpolate(points: dict[int, float], x: int, flat: bool = False) -> float | None:
    """Linear between the measured points; None outside them (flat: the nearest end's value)."""
    if not points:
        return None
    xs = sorted(points)
    if x in points:
        return points[x]
    if x < xs[0] or x > xs[-1]:
        return points[xs[0] if x < xs[0] else xs[-1]] if flat else None
    hi = next(i for i in xs if i > x)
    lo = max(i for i in xs if i < x)
    return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


class _Facts:
    """One regime's measured rows, as the model reads them."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        self.chains = [r for r in rows if r["proposer"] != "none" and r["tree_width"] == 1 and r["k"] > 0]
        self.trees: dict[int, list[dict]] = {}
        for row in rows:
            if row["proposer"] != "none" and row["tree_width"] > 1:
                self.trees.setdefault(row["tree_width"], []).append(row)
        self.verify = self._mean([(_rows(r), r["round_ms"]["verify"]) for r in rows])
        self.level = {w: sum(r["round_ms"]["draft"] / r["k"] for r in group) / len(group)
                      for w, group in [(1, self.chains), *self.trees.items()] if group}
        self.rest = {w: self._mean([(_rows(r), max(0.0, wall_ms(r) - r["round_ms"]["draft"] - r["round_ms"]["verify"]))
                                    for r in group])
                     for w, group in [(1, self.chains), *self.trees.items()] if group}
        self.reach = self._reach()

    @staticmethod
    def _mean(pairs: list[tuple[int, float]]) -> dict[int, float]:
        sums: dict[int, list[float]] = {}
        for x, y in pairs:
            sums.setdefault(x, []).append(y)
        return {x: sum(ys) / len(ys) for x, ys in sums.items()}

    def _reach(self) -> list[float]:
        """P_i pooled over the chains, each weighted by its rounds; positions no chain drafted: 0."""
        depth = max((r["k"] for r in self.chains), default=0)
        out = []
        for i in range(depth):
            drafted = [(r.get("rounds") or 1, r["per_position_acceptance"][i]) for r in self.chains
                       if i < len(r["per_position_acceptance"])]
            total = sum(w for w, _ in drafted)
            out.append(sum(w * p for w, p in drafted) / total if total else 0.0)
        return out

    def target_only(self) -> Prediction | None:
        row = next((r for r in self.rows if r["proposer"] == "none"), None)
        if row is None or not wall_ms(row):
            return None
        return Prediction(0, 0, 1.0, wall_ms(row), True)

    def predict(self, k: int, w: int, n: int) -> Prediction | None:
        """Measured where the bench ran this shape, else modelled (None where a cost is unmeasured)."""
        for row in self.chains if w == 1 else self.trees.get(w, []):
            if row["k"] == k and (w == 1 or row["tree_nodes"] == n):
                return Prediction(w, n if w > 1 else k, row["tokens_per_round"], wall_ms(row), True)
        rows = (n if w > 1 else k) + 1
        verify, level, rest = _interpolate(self.verify, rows), self.level.get(w), _interpolate(
            self.rest.get(w, {}), rows, flat=True)
        if verify is None or level is None or rest is None or not self.chains:
            return None
        tokens = 1.0 + (sum(self.reach[:k]) if w == 1 else tree_accepted(self.conditional(k), w, n) * self.damp(w))
        return Prediction(w, n if w > 1 else k, tokens, verify + k * level + rest, False)

    def damp(self, w: int) -> float:
        """What the model's accepted length is multiplied by at width w: the least measured /
        modelled ratio of the trees measured at that width, at most 1 (the model never gains from
        a tree that accepted more than it predicted, and follows one that accepted less)."""
        ratios = [(r["tokens_per_round"] - 1.0) / modelled for r in self.trees.get(w, [])
                  if (modelled := tree_accepted(self.conditional(r["k"]), w, r["tree_nodes"])) > 0]
        return max(0.0, min([1.0, *ratios]))

    def conditional(self, k: int) -> list[float]:
        """a_d: the top-1 child's acceptance at depth d, given its parent's."""
        reach = (self.reach + [0.0] * k)[:k]
        return [(reach[d] / reach[d - 1] if reach[d - 1] > 0 else 0.0) if d else reach[0] for d in range(k)]


def wall_ms(row: dict) -> float:
    """A measured round's wall time: its tokens over the bench's decode rate where the row has it
    (core/measured.py), else its phases' sum. The phases leave out what the host does between
    rounds, and on the CPU, where a round runs as it is queued, `other` holds the next round too."""
    return row.get("wall_ms") or row["round_ms"]["total"]


def _rows(row: dict) -> int:
    """The rows the round's target step verified: the root and its drafts (target-only: 1)."""
    if row["proposer"] == "none":
        return 1
    return (row["tree_nodes"] if row["tree_width"] > 1 else row["k"]) + 1


def sibling_share(a: float, rank: int) -> float:
    """P(the rank-th child (1 = the draft's best) is the target's token | its parent accepted)."""
    return a * ((1.0 - a) * SIBLING) ** (rank - 1)


def tree_accepted(accept: list[float], width: int, nodes: int) -> float:
    """Expected accepted drafts of a tree of depth len(accept), this width and node budget, with
    per-depth top-1 acceptance `accept` (the model in the module's docstring). At width 1 it is a
    chain's: sum over d of prod a_1 .. a_d."""
    found: list[tuple[float, int]] = []  # (P(path to the node accepted), depth)
    frontier = [1.0]
    for depth, a in enumerate(accept):
        level = sorted((p * sibling_share(a, r) for p in frontier for r in range(1, width + 1)), reverse=True)
        found += [(p, depth) for p in level]
        frontier = level[:width]
    kept = sorted(found, key=lambda item: (-item[0], item[1]))[:nodes]
    return sum(p for p, _ in kept)
