"""tree_width / tree_nodes auto (core/tree_cost.py): the shape chosen from measured rows, with
synthetic numbers, and the facts bench keeps for it (core/measured.py)."""

from __future__ import annotations

import json

import pytest

from specgen.core import measured
from specgen.core.settings import ProposerSpec
from specgen.core.tree_cost import (MARGIN, POSITIONS_REACH, POSITIONS_SLACK, choose, regime, sibling_share,
                                     tree_accepted)


def row(k: int, width: int = 1, nodes: int = 0, *, tokens: float, draft: float, verify: float, rest: float = 0.05,
        reach: list[float] | None = None, temperature: float = 0.0, coupling: str | None = None,
        proposer: str = "draft") -> dict:
    """A measured row as core/measured.py keeps it: round phases in ms, tokens per round, P_i."""
    return {"proposer": proposer, "temperature": temperature, "coupling": coupling, "k": k, "tree_width": width,
            "tree_nodes": nodes or k, "tokens_per_round": tokens, "rounds": 100,
            "round_ms": {"draft": draft, "verify": verify, "sample": rest, "other": 0.0,
                         "total": draft + verify + rest},
            "per_position_acceptance": reach or []}


def alone(ms: float, temperature: float = 0.0, coupling: str | None = None) -> dict:
    return row(0, tokens=1.0, draft=0.0, verify=ms - 0.05, temperature=temperature, coupling=coupling,
               proposer="none")


REACH = [0.6, 0.4, 0.25, 0.15]  # P(at least i + 1 of a chain's drafts accepted): a middling draft


def test_a_chain_is_chosen_where_trees_are_measured_slower():
    """Trees that gain a little acceptance but cost much more per round (the H100 bench pair's
    trees, 2026-11-28) lose to the chain, measured or modelled."""
    rows = [alone(0.35), row(4, tokens=2.4, draft=0.18, verify=0.33, reach=REACH),
            row(4, 2, 8, tokens=2.6, draft=0.58, verify=0.49, rest=0.58)]
    choice = choose(4, "auto", "auto", rows)
    assert (choice.width, choice.nodes, choice.speculate) == (1, 4, True)
    assert choice.reason.startswith("a chain: chain ")
    assert "w=2 n=8" in choice.reason or "w=2 n=" in choice.reason  # the best tree it beat is named


def test_a_tree_is_chosen_where_it_is_measured_faster():
    """A verification nearly as cheap at 9 rows as at 5 and a tree that accepts more: the measured
    tree wins, with its own width and node budget."""
    rows = [alone(0.35), row(4, tokens=2.4, draft=0.18, verify=0.33, reach=REACH),
            row(4, 2, 8, tokens=3.2, draft=0.22, verify=0.34)]
    choice = choose(4, "auto", "auto", rows)
    assert (choice.width, choice.nodes, choice.speculate) == (2, 8, True)
    assert "measured" in choice.reason and choice.reason.startswith("a tree of width 2, 8 nodes")


def test_trees_measured_far_shorter_than_the_run_are_left_out():
    """A tree measured faster where generations reached 300 positions: chosen for a run that reaches
    up to POSITIONS_REACH x 300 + POSITIONS_SLACK, not for one that reaches further (a tree's round
    grows with the context faster than a chain's), where the reason says why and how to measure;
    rows without positions (kept before rows had them) stand for any run; a fixed width is kept."""
    rows = [alone(0.35), row(4, tokens=2.4, draft=0.18, verify=0.33, reach=REACH),
            row(4, 2, 8, tokens=3.2, draft=0.22, verify=0.34)]
    for r in rows:
        r["positions"] = 300
    edge = int(POSITIONS_REACH * 300 + POSITIONS_SLACK)
    assert choose(4, "auto", "auto", rows).width == 2  # no positions known: as before
    assert choose(4, "auto", "auto", rows, positions=edge).width == 2
    far = choose(4, "auto", "auto", rows, positions=edge + 1)
    assert (far.width, far.nodes, far.speculate) == (1, 4, True)
    assert far.reason.startswith("a chain") and "w=2" not in far.reason
    assert f"trees left out: measured where generations reached about 300 positions, this run's reach {edge + 1:,}" \
        in far.reason and "--prompts-file" in far.reason
    assert choose(4, 2, "auto", rows, positions=edge + 1).width == 2  # a width the profile fixes stays
    old = [{k: v for k, v in r.items() if k != "positions"} for r in rows]
    assert choose(4, "auto", "auto", old, positions=10 * edge).width == 2
    slow_chain = [alone(0.2), *rows[1:]]  # target-only fastest once the tree is left out: said with the reason
    far = choose(4, "auto", "auto", slow_chain, positions=edge + 1)
    assert not far.speculate and far.reason.startswith("no speculation") and "trees left out" in far.reason


def modelled(k: int, width: int, nodes: int, reach: list[float]) -> float:
    """The model's tokens per round for a shape, from a chain's P_i (as _Facts.conditional reads them)."""
    a = [reach[d] / reach[d - 1] if d else reach[0] for d in range(k)]
    return 1.0 + tree_accepted(a, width, nodes)


def test_a_modelled_tree_needs_the_margin_to_beat_a_measured_chain():
    """At k = 4 no tree was measured: each node budget is modelled from the chain's per-depth
    acceptance and the costs measured at its rows and width (a k = 3 tree at 9 rows). Where the
    target's step costs as much at 9 rows as at 5, a tree is predicted more than MARGIN faster
    than the chain; where the walk costs 0.25 ms more a round, not."""
    tree3 = modelled(3, 2, 8, REACH)
    cheap = [alone(0.35), row(4, tokens=1 + sum(REACH), draft=0.2, verify=0.33, reach=REACH),
             row(3, 2, 8, tokens=tree3, draft=0.15, verify=0.33, rest=0.05)]
    choice = choose(4, "auto", "auto", cheap)
    best = next(p for p in choice.predictions if p.width == 2)
    chain = next(p for p in choice.predictions if p.width == 1)
    assert choice.width == 2 and not best.measured and chain.measured
    assert best.rate > chain.rate * (1 + MARGIN) and best.tokens == pytest.approx(modelled(4, 2, choice.nodes, REACH))
    dear = [dict(r, round_ms={**r["round_ms"], "sample": 0.3, "total": r["round_ms"]["total"] + 0.25})
            if r["tree_width"] == 2 else r for r in cheap]
    assert choose(4, "auto", "auto", dear).width == 1


def test_trees_measured_below_the_model_damp_it():
    """A tree that accepted fewer tokens than the model says (top-w children under sampling) lowers
    the model's tokens at its width: the cheap tree of the test above then loses to the chain."""
    low = [alone(0.35), row(4, tokens=1 + sum(REACH), draft=0.2, verify=0.33, reach=REACH),
           row(3, 2, 8, tokens=1 + sum(REACH[:3]) * 0.9, draft=0.15, verify=0.33, rest=0.05)]
    choice = choose(4, "auto", "auto", low)
    assert choice.width == 1


def test_no_speculation_where_target_only_is_measured_faster():
    rows = [alone(0.30), row(4, tokens=1.3, draft=0.2, verify=0.33, reach=[0.2, 0.06, 0.03, 0.01])]
    choice = choose(4, "auto", "auto", rows)
    assert choice.speculate is False and choice.reason.startswith("no speculation")
    # a width the user fixed is kept: only what is auto is chosen
    fixed = choose(4, 2, "auto", rows)
    assert fixed.speculate and fixed.width == 2


def test_nothing_measured_resolves_to_a_chain():
    choice = choose(4, "auto", "auto", [], " for this pair")
    assert (choice.width, choice.nodes, choice.speculate) == (1, 4, True)
    assert choice.reason.startswith("nothing measured for this pair: a chain (specgen bench")
    assert choose(4, "auto", 12, []).width == 1
    assert (choose(4, 3, "auto", []).width, choose(4, 3, "auto", []).nodes) == (3, 4)  # the user's width, k nodes
    # target-only alone, or trees without a chain, predict no chain: still a chain
    assert choose(4, "auto", "auto", [alone(0.3)]).width == 1
    only_trees = [row(4, 2, 8, tokens=3.0, draft=0.2, verify=0.3)]
    assert choose(4, "auto", "auto", only_trees).width == 1


def test_no_extrapolation_past_the_rows_measured():
    """A node budget whose verification has more rows than any step measured is not considered."""
    rows = [alone(0.35), row(2, tokens=1.8, draft=0.1, verify=0.33, reach=REACH[:2]),
            row(2, 2, 4, tokens=2.4, draft=0.1, verify=0.34)]  # at most 5 rows measured
    choice = choose(2, "auto", "auto", rows)
    assert all(p.nodes <= 4 for p in choice.predictions if p.width > 1)
    assert (choice.width, choice.nodes) == (2, 4)


def test_the_tree_model_is_the_chain_at_width_one_and_conservative_beyond():
    a = [0.8, 0.7, 0.6]
    chain = 0.8 + 0.8 * 0.7 + 0.8 * 0.7 * 0.6
    assert tree_accepted(a, 1, 3) == pytest.approx(chain)
    assert tree_accepted(a, 2, 3) == pytest.approx(chain)  # 3 nodes: the top-1 path is the best 3
    wide = tree_accepted(a, 2, 10)
    assert chain < wide < 3
    # the siblings' shares never exceed the probability mass there is
    assert sum(sibling_share(0.3, r) for r in range(1, 50)) <= 1.0
    assert sibling_share(0.3, 2) < (1 - 0.3) * 0.3  # a second child: less than what the top child misses x a


def test_regime_picks_the_requests_sampling():
    rows = [alone(0.3), row(4, tokens=3, draft=0.2, verify=0.3, reach=REACH),
            row(4, tokens=2, draft=0.2, verify=0.3, reach=REACH, temperature=0.7, coupling="rejection"),
            row(4, tokens=2, draft=0.2, verify=0.3, reach=REACH, temperature=1.0, coupling="rejection"),
            row(4, tokens=2, draft=0.2, verify=0.3, reach=REACH, temperature=0.8, coupling="gumbel")]
    assert {r["temperature"] for r in regime(rows, 0.0, "rejection")} == {0.0}
    assert {(r["temperature"], r["coupling"]) for r in regime(rows, 0.8, "rejection")} == {(0.7, "rejection")}
    assert {r["coupling"] for r in regime(rows, 0.8, "gumbel")} == {"gumbel"}
    assert regime(rows, 0.8, "gumbel", proposer="eagle") == []


def bench_document(results: list[dict], baselines: list[dict]) -> dict:
    return {"created": "2026-12-01T00:00:00+00:00", "environment": {"device_name": "GPU X", "dtype": "bfloat16"},
            "profile": {"target": "/m/target", "draft": "/m/draft"}, "results": results, "baselines": baselines,
            "settings": {"max_tokens": 128}, "prompts": [{"index": 0, "tokens": 20}, {"index": 1, "tokens": 41}]}


def result(k: int, width: int, nodes: int, tokens: float, ms: dict, reach: list[float]) -> dict:
    return {"proposer": "draft", "temperature": 0.0, "coupling": None, "k": k, "tree_width": width,
            "tree_nodes": nodes, "mean_accepted_length": tokens, "round_ms": ms, "per_position_acceptance": reach,
            "counts": {"rounds": 50}}


def test_bench_rows_are_kept_and_merged(tmp_path):
    """bench's results and its target-only baseline become rows of its pair; a later bench of the
    same shapes replaces them and keeps the others; an unreadable file is nothing measured."""
    ms = {"draft": 0.2, "verify": 0.3, "sample": 0.02, "other": 0.03, "total": 0.55}
    base = {"method": "target-only", "temperature": 0.0, "coupling": None, "available": True, "rounds": 99,
            "round_ms": {"draft": 0.0, "verify": 0.3, "sample": 0.01, "other": 0.02, "total": 0.33}}
    hf = {"method": "hf", "temperature": 0.0, "coupling": None, "available": True}
    first = bench_document([result(4, 1, 4, 3.0, ms, REACH), result(4, 2, 8, 3.1, ms, REACH)], [base, hf])
    path, written = measured.save(str(tmp_path), first)
    assert written == 3 and path == tmp_path / measured.FILE
    key = measured.pair_key("/m/target", "/m/draft", "GPU X", "bfloat16")
    rows = measured.load(str(tmp_path))[key]
    assert sorted((r["proposer"], r["k"], r["tree_width"]) for r in rows) == [("draft", 4, 1), ("draft", 4, 2),
                                                                            ("none", 0, 1)]
    assert {r["positions"] for r in rows} == {round((20 + 41) / 2 + 128)}  # the prompts' mean and max_tokens
    again = bench_document([result(4, 2, 8, 3.5, ms, REACH)], [])
    measured.save(str(tmp_path), again)
    rows = measured.load(str(tmp_path))[key]
    assert len(rows) == 3 and [r["tokens_per_round"] for r in rows if r["tree_width"] == 2] == [3.5]
    (tmp_path / measured.FILE).write_text("{not json")
    assert measured.load(str(tmp_path)) == {}
    (tmp_path / measured.FILE).write_text(json.dumps({"format": 99, "pairs": {}}))
    assert measured.load(str(tmp_path)) == {}


def test_tree_rows_are_keyed_by_the_head_they_were_measured_with(tmp_path):
    """A head's rows (eagle, hybrid with eagle) carry its folder: a later bench of another head
    keeps them, one of the same head replaces them; a run reads target-only's and its own head's
    rows (none: the rows without a head). Rows kept before rows carried a head read as head-less:
    the draft model's as before (a new draft bench replaces them), a head's for no head's run."""
    ms = {"draft": 0.2, "verify": 0.3, "sample": 0.02, "other": 0.03, "total": 0.55}
    key = measured.pair_key("/m/target", "/m/draft", "GPU X", "bfloat16")
    old = [{**measured.rows_from_bench(bench_document([result(4, 2, 8, 2.0, ms, REACH)], []))[1][0], "proposer": p}
           for p in ("draft", "eagle")]
    for r in old:
        del r["head"]  # as kept before rows carried a head
    (tmp_path / measured.FILE).write_text(json.dumps({"format": measured.FORMAT, "pairs": {key: old}}))
    base = {"method": "target-only", "temperature": 0.0, "coupling": None, "available": True, "rounds": 99,
            "round_ms": {"draft": 0.0, "verify": 0.3, "sample": 0.01, "other": 0.02, "total": 0.33}}

    def eagle(tokens: float, head: str, proposer: str = "eagle") -> dict:
        return {**result(4, 2, 8, tokens, ms, REACH), "proposer": proposer, "head": head}

    measured.save(str(tmp_path), bench_document([eagle(3.0, "/h/a"), eagle(3.3, "/h/a", "hybrid")], [base]))
    measured.save(str(tmp_path), bench_document([eagle(2.5, "/h/b")], []))
    measured.save(str(tmp_path), bench_document([eagle(3.1, "/h/a")], []))  # head a's again: replaces its own
    rows = measured.load(str(tmp_path))[key]

    def seen(head):
        return sorted((r["proposer"], r.get("head"), r["tokens_per_round"]) for r in measured.tree_rows(rows, head))

    assert seen("/h/a") == [("eagle", "/h/a", 3.1), ("hybrid", "/h/a", 3.3), ("none", None, 1.0)]
    assert seen("/h/b") == [("eagle", "/h/b", 2.5), ("none", None, 1.0)]
    assert seen(None) == [("draft", None, 2.0), ("eagle", None, 2.0), ("none", None, 1.0)]
    assert regime(measured.tree_rows(rows, "/h/c"), 0.0, "rejection", "eagle") == [r for r in rows
                                                                                 if r["proposer"] == "none"]
    measured.save(str(tmp_path), bench_document([result(4, 2, 8, 2.2, ms, REACH)], []))  # the draft model's again
    rows = measured.load(str(tmp_path))[key]
    assert sorted(r["tokens_per_round"] for r in rows if r["proposer"] == "draft") == [2.2]


def test_the_head_a_run_drafts_with():
    """Bench writes it into each result and auto reads its rows: eagle's, and hybrid's with eagle."""
    spec = ProposerSpec(kind="hybrid", head="/h/a", hybrid_with="eagle")
    assert [measured.drafting_head(spec, kind) for kind in ("eagle", "hybrid", "draft", "ngram", "none")] == \
        ["/h/a", "/h/a", None, None, None]
    assert measured.drafting_head(ProposerSpec(kind="hybrid", head="/h/a"), "hybrid") is None  # with the draft
