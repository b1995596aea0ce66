"""Acceptance insight: per-round records of runs, and what they add up to. No terminal code.

A RunRecord keeps what one generation did round by round: the drafted ids, how many the verifier
accepted, the tokens it emitted and, from a decoder built with insight=True, p(x) and q(x) of every
drafted token and the target's entropy at each drafted position. `analyse` turns records into the
report of `specgen inspect-acceptance` (and the per-round data that `specgen bench --records` stores).

Definitions used below: a drafted position is *verified* when the verifier judged it, i.e. it was
accepted or it was the first rejection of its round; positions after a rejection were drafted but
never judged. A token is *rejected* at the first unaccepted position of a round that emitted a
recovered token there (a round cut by a stop token rejects nothing).

Token trees: a record also keeps each accepted node's sibling index (`branch`: 0 the first child,
the chain's choice), and with insight the round's tree (`tree`, core/round/tree_stage.TreeView as
a dict); `tree_report` compares the tree with the chain inside it (core/stats.py defines it).
A hybrid tree run's record also keeps whose nodes each round's accepted path took (`source`:
lookup, model or none) and how many of the tree's nodes were the lookup's (`lookup_nodes`: its
rows 1 .. m); other runs' records leave both out (their JSON is as before).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from specgen.core.stats import AcceptanceStats

ENTROPY_EDGES = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)  # nats; the last bin is [4, inf)
CONTEXT_CHARS = 40  # text shown before a rejected token
EXAMPLES = 3  # contexts kept per rejected token
HYBRID_FIELDS = ("source", "lookup_nodes")  # RoundRecord's, left out of other runs' JSON


@dataclass
class RoundRecord:
    drafted_ids: list[int]
    num_accepted: int
    token_ids: list[int]  # emitted: accepted + (recovered | bonus; none after a tree's taken draw), cut at a stop token
    target_p: list[float] | None = None  # [drafted] p(x) of each drafted token
    draft_q: list[float] | None = None  # [drafted] q(x) of each drafted token
    target_entropy: list[float] | None = None  # [drafted] entropy of p at each drafted position (nats)
    k_used: int | None = None  # the k this round asked for (adaptive k, or less near max_tokens)
    early_stop: bool = False  # drafted fewer than k_used (draft_p_min, a drafted stop, a short n-gram)
    branch: list[int] | None = None  # token trees: each accepted node's sibling index (0: the chain's choice)
    tree: dict | None = None  # token trees with insight: the round's tree (TreeView.as_dict)
    source: str | None = None  # hybrid token trees: whose nodes the accepted path took (lookup | model | none)
    lookup_nodes: int | None = None  # hybrid token trees: the lookup's nodes, the tree's rows 1 .. m

    @classmethod
    def from_event(cls, event) -> "RoundRecord":
        tree = getattr(event, "tree", None)
        return cls(event.drafted_ids, event.num_accepted, event.token_ids, event.target_p, event.draft_q,
                   getattr(event, "target_entropy", None), event.k_used, event.early_stop,
                   getattr(event, "ranks", None), tree.as_dict() if tree is not None else None,
                   getattr(event, "source", None), getattr(event, "lookup_nodes", None))

    @property
    def rejected(self) -> bool:
        return self.num_accepted < len(self.drafted_ids) and len(self.token_ids) > self.num_accepted

    @property
    def verified(self) -> int:
        return self.num_accepted + int(self.rejected)


@dataclass
class RunRecord:
    prompt: str
    text: str
    token_ids: list[int]
    fates: list[str]
    pieces: list[str]  # per-token text
    rounds: list[RoundRecord]
    # the text of every rejected draft token and of the target's choice there, each decoded alone
    # with its special tokens named (the pieces leave out EOS, which would read '')
    token_text: dict[int, str] = field(default_factory=dict)

    @classmethod
    def build(cls, prompt: str, finished, events, tokenizer) -> "RunRecord":
        rounds = [RoundRecord.from_event(e) for e in events]
        rejected = {r.drafted_ids[r.num_accepted] for r in rounds if r.rejected}
        chosen = {r.token_ids[r.num_accepted] for r in rounds if r.rejected}
        # a tree's nodes and the round's own tokens, for the HTML report's drawing of each tree
        nodes = {t for r in rounds if r.tree for t in r.tree["tokens"] + r.token_ids}
        token_text = {t: tokenizer.decode([t], skip_special_tokens=False) for t in sorted(rejected | chosen | nodes)}
        return cls(prompt, finished.text, finished.token_ids, [f.value for f in finished.fates],
                   finished.pieces, rounds, token_text)

    def as_dict(self) -> dict:
        data = asdict(self)
        for r in data["rounds"]:  # a hybrid tree run's fields only where it has them
            for name in HYBRID_FIELDS:
                if r[name] is None:
                    del r[name]
        data["token_text"] = {str(k): v for k, v in self.token_text.items()}  # JSON object keys are strings
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RunRecord":
        rounds = [RoundRecord(**r) for r in data["rounds"]]
        token_text = {int(k): v for k, v in data.get("token_text", {}).items()}
        return cls(data["prompt"], data["text"], data["token_ids"], data["fates"], data["pieces"], rounds,
                   token_text)


def record(decoder, prompt: str, prompt_ids: list[int], tokenizer) -> RunRecord:
    """Run one generation and keep its rounds (build the decoder with insight=True for p, q, entropy)."""
    events = list(decoder.run(prompt_ids))
    return RunRecord.build(prompt, events[-1], events[:-1], tokenizer)


def stats_of(runs: list[RunRecord]) -> AcceptanceStats:
    """The acceptance counts of the records, through the same stats object the loop fills."""
    stats = AcceptanceStats()
    for run in runs:
        for r in run.rounds:
            k_used = len(r.drafted_ids) if r.k_used is None else r.k_used
            stats.add_round(len(r.drafted_ids), r.num_accepted, len(r.token_ids), {},
                            early_stop=r.early_stop, k_used=k_used, ranks=r.branch,
                            source=(r.source, r.lookup_nodes or 0) if r.source is not None else None)
    return stats


def analyse(runs: list[RunRecord], top: int = 10) -> dict:
    """The inspect-acceptance report as plain data (documented in docs/cli.md)."""
    stats = stats_of(runs)
    fates = {fate: sum(run.fates.count(fate) for run in runs) for fate in ("accepted", "recovered", "bonus")}
    return {
        "totals": {
            "prompts": len(runs),
            "generated_tokens": stats.emitted,
            "rounds": stats.rounds,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "acceptance_rate": stats.acceptance_rate,
            "mean_accepted_length": stats.mean_accepted_length,
            "mean_k": stats.mean_k,
            "early_stops": stats.early_stops,
        },
        "fates": fates,
        "per_position": [
            {"position": i + 1, "drafted": d, "accepted": a, "rate": a / d if d else 0.0}
            for i, (d, a) in enumerate(zip(stats.drafted_at, stats.accepted_at))
        ],
        "rejected": rejected_tokens(runs, top),
        "entropy": entropy_bins(runs),
        "has_probabilities": any(r.target_p is not None for run in runs for r in run.rounds if r.drafted_ids),
        "tree": tree_report(stats),
    }


def tree_report(stats: AcceptanceStats) -> dict | None:
    """What the tree bought over the chain inside it (core/stats.py), None without tree rounds:
    tokens per round of each, and per depth d (1-based) the rounds whose accepted path reached d
    (`reached`, rate: of all tree rounds), those whose chain would have (`chain_reached`), and
    those whose node at d is not a first child (`branch_wins`, rate: of `reached`)."""
    rounds = stats.tree_rounds
    if not rounds:
        return None
    per_depth = []
    for d, (reached, chain, wins) in enumerate(zip(stats.accepted_at, stats.chain_at, stats.branch_at)):
        per_depth.append({"depth": d + 1, "reached": reached, "rate": reached / rounds, "chain_reached": chain,
                          "chain_rate": chain / rounds, "branch_wins": wins,
                          "branch_rate": wins / reached if reached else None})
    report = {"rounds": rounds, "tokens_per_round": stats.tree_emitted / rounds,
              "chain_tokens_per_round": stats.chain_emitted / rounds, "gain_per_round": stats.tree_gain,
              "line": stats.tree_line(), "per_depth": per_depth}
    if stats.source_rounds:  # only hybrid runs: the other reports stay as they were
        report["hybrid"] = hybrid_report(stats)
    return report


def hybrid_report(stats: AcceptanceStats) -> dict:
    """A hybrid tree run's rounds by whose nodes their accepted path took (core/stats.py): the
    rounds (and those whose tree held the lookup's nodes: `merged_rounds`), per part the rounds
    whose path took its nodes (rate: of all rounds) and the tokens accepted from them (share: of
    all accepted), `none`: rounds that accepted no draft; per depth the rounds whose path reached
    it through each part's nodes."""
    rounds = stats.source_rounds
    accepted = stats.lookup_accepted + stats.model_accepted

    def part(paths: int, tokens: int) -> dict:
        return {"rounds": paths, "rate": paths / rounds, "accepted": tokens,
                "share": tokens / accepted if accepted else None,
                "tokens_per_round": tokens / paths if paths else None}

    lookup_at = stats.lookup_at + [0] * (len(stats.accepted_at) - len(stats.lookup_at))
    return {"rounds": rounds, "merged_rounds": stats.merged_rounds,
            "lookup": part(stats.lookup_paths, stats.lookup_accepted),
            "model": part(stats.model_paths, stats.model_accepted),
            "none": rounds - stats.lookup_paths - stats.model_paths,
            "per_depth": [{"depth": d + 1, "lookup": look, "model": reached - look}
                          for d, (reached, look) in enumerate(zip(stats.accepted_at, lookup_at))]}


def rejected_tokens(runs: list[RunRecord], top: int) -> list[dict]:
    """Draft tokens rejected most often, with mean p(x), q(x) and a few contexts."""
    found: dict[int, dict] = {}
    for run in runs:
        emitted = 0
        for r in run.rounds:
            if r.rejected:
                at = r.num_accepted
                token = r.drafted_ids[at]
                entry = found.setdefault(token, {"token_id": token, "text": run.token_text.get(token, ""),
                                                 "count": 0, "p": [], "q": [], "examples": []})
                entry["count"] += 1
                p = r.target_p[at] if r.target_p else None
                q = r.draft_q[at] if r.draft_q else None
                if p is not None:
                    entry["p"].append(p)
                if q is not None:
                    entry["q"].append(q)
                if len(entry["examples"]) < EXAMPLES:
                    entry["examples"].append(_example(run, emitted + at, p, q))
            emitted += len(r.token_ids)
    ranked = sorted(found.values(), key=lambda e: (-e["count"], e["token_id"]))[:top]
    for entry in ranked:
        entry["mean_p"] = _mean(entry.pop("p"))
        entry["mean_q"] = _mean(entry.pop("q"))
    return ranked


def _example(run: RunRecord, position: int, p: float | None, q: float | None) -> dict:
    before = (run.prompt + "".join(run.pieces[:position]))[-CONTEXT_CHARS:]
    chosen = run.token_ids[position]
    return {"context": before, "target_token_id": chosen, "target_text": run.token_text.get(chosen, run.pieces[position]),
            "p": p, "q": q}


def token_details(run: RunRecord) -> list[dict]:
    """For each emitted token of the run, what the insight decoder knew of it: an accepted draft
    token's p(x), q(x) and the target's entropy there; for a recovered token, the same of the
    draft token it replaced (`rejected`: that token's text); a bonus token has none. Empty dicts
    where the records carry no probabilities (bench records)."""
    details = []
    for r in run.rounds:
        for i in range(len(r.token_ids)):
            known = {}
            if i < len(r.drafted_ids) and r.target_p is not None:
                # q: None for prompt lookup's rounds (one-hot drafts: the insight stages no q)
                known = {"p": r.target_p[i], "q": r.draft_q[i] if r.draft_q is not None else None}
                if r.target_entropy is not None:
                    known["entropy"] = r.target_entropy[i]
                if i == r.num_accepted:
                    known["rejected"] = run.token_text.get(r.drafted_ids[i], "")
            details.append(known)
    return details


def entropy_bins(runs: list[RunRecord]) -> list[dict]:
    """Acceptance of verified positions, binned by the target's entropy there (empty without insight)."""
    bins = [{"lower": lo, "upper": hi, "verified": 0, "accepted": 0}
            for lo, hi in zip(ENTROPY_EDGES, ENTROPY_EDGES[1:] + (math.inf,))]
    seen = False
    for run in runs:
        for r in run.rounds:
            if r.target_entropy is None:
                continue
            seen = True
            for i in range(r.verified):
                entropy = max(r.target_entropy[i], 0.0)  # rounding can leave -1e-7
                b = next(b for b in reversed(bins) if entropy >= b["lower"])
                b["verified"] += 1
                b["accepted"] += int(i < r.num_accepted)
    for b in bins:
        b["rate"] = b["accepted"] / b["verified"] if b["verified"] else None
        if b["upper"] == math.inf:
            b["upper"] = None  # JSON has no infinity
    return bins if seen else []


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def runs_from_bench(document: dict, k: int | None, temperature: float | None) -> tuple[dict, list[RunRecord]]:
    """The records of one (k, temperature) result of a `specgen bench --records` document.

    Without k or temperature, the recommended k (and proposer, where the bench compared several) at
    the first temperature (or the given one); with k, the first proposer's result of that k.
    Returns (that result, its records).
    """
    from specgen.core.errors import UsageError

    if not isinstance(document, dict) or not str(document.get("schema", "")).startswith("specgen.bench/"):
        raise UsageError("this is not the JSON of `specgen bench --format json`")
    results = document.get("results", [])
    if temperature is None:
        temperature = results[0]["temperature"] if results else 0.0
    proposer = None
    if k is None:  # the recommended k, else the first result's at that temperature
        rec = [r for r in document.get("recommendation", []) if r["temperature"] == temperature]
        k, proposer = (rec[0]["k"], rec[0].get("proposer")) if rec else (None, None)
    chosen = [r for r in results if k in (None, r["k"]) and r["temperature"] == temperature
              and proposer in (None, r.get("proposer"))]
    if not chosen:
        have = ", ".join(f"k={r['k']} T={r['temperature']:g}" for r in results)
        asked = f"k={k} at temperature {temperature:g}" if k is not None else f"temperature {temperature:g}"
        raise UsageError(f"the bench has no result for {asked}", hint=f"it has: {have}")
    if "records" not in chosen[0]:
        raise UsageError("this bench JSON has no per-round records",
                         hint="run `specgen bench --records --format json` to keep them")
    return chosen[0], [RunRecord.from_dict(r) for r in chosen[0]["records"]]
