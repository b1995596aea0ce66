"""`specgen bench --batch-size`: batches, target-only and each k, at each batch size (tiny models,
CPU), the JSON's fields, and where the recommendation says speculation stops paying."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repo_paths import REPO
from specgen.core.bench.batches import recommend
from tiny_models import build_pair, head_for, write_profile

PROMPTS = ["def add(a, b):", "class Point:", "import os", "for i in range(10):", "x = [1, 2, 3]"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-batches")
    target, draft = build_pair(root, noisy=0.1)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return write_profile(root / "tiny.toml", target, draft)


def pair_of(profile) -> tuple[Path, Path]:
    import tomllib

    table = tomllib.loads(Path(profile).read_text())
    return Path(table["target"]["path"]), Path(table["draft"]["path"])


@pytest.fixture(scope="module")
def head(tiny):
    """A tiny EAGLE-3 head of the profile's target, over a reduced draft vocabulary."""
    return head_for(pair_of(tiny)[0], Path(tiny).parent / "head", draft_vocab=150)


def run(tps: dict) -> list[dict]:
    """Results of synthetic runs: {(batch, k): tokens/s}, k 0 target-only."""
    return [{"batch_size": b, "method": "speculative" if k else "target-only", "k": k, "tokens_per_second": v}
            for (b, k), v in tps.items()]


def test_recommendation_says_where_speculation_stops_paying():
    """Speculation wins at B = 1 and 4 (by its best k), loses at 16 and 32: it stops paying at 16,
    where target-only is the choice; a tie still pays (speculative is not below target-only)."""
    recs, stops = recommend(run({(1, 0): 100, (1, 2): 180, (1, 4): 200,
                                 (4, 0): 350, (4, 2): 420, (4, 4): 400,
                                 (8, 0): 600, (8, 2): 600,
                                 (16, 0): 900, (16, 2): 850, (16, 4): 700,
                                 (32, 0): 1500, (32, 2): 1100}))
    assert stops == 16
    assert [(r["batch_size"], r["choice"], r["best_k"], r["speculation_pays"]) for r in recs] == [
        (1, "k=4", 4, True), (4, "k=2", 2, True), (8, "k=2", 2, True), (16, "target-only", 2, False),
        (32, "target-only", 2, False)]
    assert recs[0]["speedup"] == pytest.approx(2.0) and recs[3]["speedup"] == pytest.approx(850 / 900)
    assert recs[3]["k"] == 0 and recs[0]["k"] == 4


def test_recommendation_when_speculation_always_pays_or_never_does():
    assert recommend(run({(1, 0): 10, (1, 3): 20, (8, 0): 50, (8, 3): 60}))[1] is None
    recs, stops = recommend(run({(1, 0): 10, (1, 3): 9, (8, 0): 50, (8, 3): 60}))
    assert stops == 1 and [r["speculation_pays"] for r in recs] == [False, True]  # the first size where it loses


def test_recommendation_names_a_tree_where_one_is_fastest():
    """A tree's row (tree_width > 1) competes with the chains: its shape is the choice."""
    rows = run({(1, 0): 100, (1, 4): 200, (8, 0): 600, (8, 4): 650})
    rows += [{"batch_size": 1, "method": "speculative", "k": 4, "tree_width": 2, "tree_nodes": 8,
              "tokens_per_second": 230},
             {"batch_size": 8, "method": "speculative", "k": 4, "tree_width": 2, "tree_nodes": 8,
              "tokens_per_second": 590}]
    recs, stops = recommend(rows)
    assert stops is None
    assert [(r["choice"], r["k"], r["tree_width"], r["tree_nodes"]) for r in recs] == [
        ("k=4 w=2 n=8", 4, 2, 8), ("k=4", 4, 1, 4)]


def test_batch_bench_sweeps_tree_shapes(cli, tiny):
    """--tree-width / --tree-nodes at batch: each k in every shape that fits it, each row its own
    tree (core/round/batch_tree.py), named in the table and the recommendation."""
    code, out, err = cli("bench", "-p", tiny, "--batch-size", "1,3", "--k", "2,3", "--tree-width", "1,2",
                         "--tree-nodes", "4", "--max-tokens", "6", "--warmup", "0", "--format", "json", "-q")
    assert code == 0, err
    doc = json.loads(out)
    assert [(r["batch_size"], r["k"], r["tree_width"], r["tree_nodes"]) for r in doc["results"]] == [
        (b, k, w, n) for b in (1, 3) for k, w, n in ((0, 1, 0), (2, 1, 2), (2, 2, 4), (3, 1, 3), (3, 2, 4))]
    for r in doc["results"]:
        assert r["tokens"] == 6 * len(PROMPTS) and r["tokens_per_second"] > 0 and r["rounds"] > 0
        # a tree's round carries at least the chain's tokens of its depth: it was verified
        assert r["k"] == 0 or r["mean_accepted_length"] >= 1
    recs, _ = recommend(doc["results"])
    assert doc["recommendations"] == recs
    code, out, err = cli("bench", "-p", tiny, "--batch-size", "2", "--k", "2", "--tree-width", "2",
                         "--tree-nodes", "4", "--max-tokens", "4", "--warmup", "0", "-n", "2")
    assert code == 0, err
    assert "k=2 w=2 n=4" in out


def test_batch_bench_json_has_each_size_and_method(cli, tiny):
    code, out, err = cli("bench", "-p", tiny, "--batch-size", "1,3", "--k", "2,3", "--max-tokens", "6",
                         "--warmup", "1", "--format", "json", "-q")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "specgen.bench.batches/1" and not doc["incomplete"]
    assert doc["batch_sizes"] == [1, 3] and doc["prompts"] == len(PROMPTS) and doc["temperature"] == 0.0
    assert doc["proposer"] == "draft" and doc["pair"]["head"] is None
    assert [(r["batch_size"], r["method"], r["proposer"], r["k"]) for r in doc["results"]] == [
        (b, m, p, k) for b in (1, 3) for m, p, k in (("target-only", "none", 0), ("speculative", "draft", 2),
                                                      ("speculative", "draft", 3))]
    for r in doc["results"]:
        assert r["tokens"] == 6 * len(PROMPTS)  # ignore_eos: max_tokens each
        assert r["tokens_per_second"] > 0 and r["seconds"] > 0
        assert r["tokens_per_second"] == pytest.approx(r["tokens"] / r["seconds"])
        assert r["row_ms_per_token"]["median"] > 0
        assert (r["mean_accepted_length"] is None) == (r["method"] == "target-only")
        assert r["decoder"] == ("single" if r["batch_size"] == 1 else "batch")
    recs, stops = recommend(doc["results"])
    assert doc["recommendations"] == recs and doc["speculation_stops_paying_at"] == stops
    assert [r["batch_size"] for r in recs] == [1, 3]
    documented = documented_batch_fields()
    assert documented
    for path in documented:  # every documented field is in the document, and every field documented
        *lists, last = path.split("[].")
        node = doc[lists[0]][0] if lists else doc
        assert last.split(".")[0] in node, path
    assert set(doc) == {p.split("[].")[0] for p in documented}


def test_batch_bench_json_weighs_each_round_against_its_floor(cli, tiny):
    """On the CPU the bytes of a round's floor are known and its ms are not (no copy bandwidth):
    round_floor_ms and round_over_floor are null, never a made-up number."""
    code, out, err = cli("bench", "-p", tiny, "--batch-size", "1,2", "--k", "2", "--max-tokens", "5",
                         "--warmup", "0", "--format", "json", "-q")
    assert code == 0, err
    doc = json.loads(out)
    facts = doc["floor"]
    assert facts["copy_bandwidth_bytes_per_s"] is None
    assert set(facts["streamed_bytes"]) == set(facts["cache_bytes_per_position"]) == {"target", "draft"}
    assert all(v > 0 for part in ("streamed_bytes", "cache_bytes_per_position") for v in facts[part].values())
    for r in doc["results"]:
        assert r["rounds"] > 0 and r["round_ms"] > 0 and 1 <= r["rows_per_round"] <= r["batch_size"]
        floor = r["round_floor_bytes"]
        # the weights once a round, and more: each row's keys and values
        assert floor["target"] > facts["streamed_bytes"]["target"]
        if r["method"] == "target-only":
            assert floor["draft"] is None
        else:
            assert floor["draft"] > r["k"] * facts["streamed_bytes"]["draft"]
        assert r["round_floor_ms"] is None and r["round_over_floor"] is None


def test_batch_bench_floor_with_a_bandwidth(cli, tiny, monkeypatch):
    from specgen.core.bench import floors

    monkeypatch.setattr(floors, "copy_bandwidth", lambda device: 2e9)  # a stand-in: the CPU has none
    code, out, err = cli("bench", "-p", tiny, "--batch-size", "2", "--k", "2", "--max-tokens", "5",
                         "--warmup", "0", "--format", "json", "-q")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["floor"]["copy_bandwidth_bytes_per_s"] == 2e9
    for r in doc["results"]:
        total = sum(v for v in r["round_floor_bytes"].values() if v is not None)
        assert r["round_floor_ms"] == pytest.approx(total / 2e9 * 1e3)
        assert r["round_over_floor"] == pytest.approx(r["round_ms"] / r["round_floor_ms"])
    code, out, err = cli("bench", "-p", tiny, "--batch-size", "2", "--k", "2", "--max-tokens", "4",
                         "--warmup", "0", "-n", "2")
    assert code == 0, err
    assert "at 2 GB/s" in out  # the table names the bandwidth it divides by
    floor_rows = out.split("rounds against their floor", 1)[1].splitlines()
    assert any("k=2" in line and line.rstrip().endswith("×") for line in floor_rows)


def documented_batch_fields() -> list[str]:
    """The field paths of docs/bench-schema.md's "Batches" table."""
    import re

    lines = (REPO / "docs" / "bench-schema.md").read_text().split("## Batches", 1)[1].splitlines()
    return [m.group(1) for m in (re.match(r"\| `([^`]+)` \|", line) for line in lines) if m]


def test_batch_bench_table(cli, tiny):
    code, out, err = cli("bench", "-p", tiny, "--batch-size", "2", "--k", "2", "--max-tokens", "4",
                         "--warmup", "0", "-n", "3")
    assert code == 0, err
    assert "target-only" in out and "k=2" in out and "row ms/tok" in out
    # the rounds against their floor: the round's ms measured, the floor's ms not known on the CPU
    floors = out.split("rounds against their floor", 1)[1].split("batch 2: ", 1)[0]
    assert "no bandwidth measured off CUDA" in floors
    for name in ("rows/round", "round ms", "floor GB", "floor ms", "× floor"):
        assert name in floors
    rows = [line.split() for line in floors.splitlines() if line.strip().startswith("2 ")]
    assert [row[1] for row in rows] == ["target-only", "k=2"]
    for row in rows:
        assert float(row[3]) > 0 and float(row[4]) > 0 and row[5:] == ["–", "–"]
    assert "batch 2: " in out and ("speculation stops paying at batch 2" in out
                                   or "speculation pays at every batch size measured" in out)
    assert "single-prompt decoder" not in out  # said only where batch 1 ran


def test_a_batch_larger_than_the_prompts_is_said(cli, tiny):
    code, out, err = cli("bench", "-p", tiny, "--batch-size", "2,8", "--k", "2", "--max-tokens", "3",
                         "--warmup", "0", "--num-prompts", "3", "--format", "json")
    assert code == 0, err
    assert "--batch-size 8: more rows than the 3 prompts measured; those batches never fill" in err
    rows = {r["batch_size"]: r["rows_per_round"] for r in json.loads(out)["results"] if r["k"] == 0}
    assert rows[8] <= 3 < 8


def test_batch_bench_table_says_what_batch_one_ran(cli, tiny):
    code, out, err = cli("bench", "-p", tiny, "--batch-size", "1", "--k", "2", "--max-tokens", "4",
                         "--warmup", "0", "-n", "2")
    assert code == 0, err
    assert "batch 1: the prompts one after another through the single-prompt decoder" in out


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "each batch size must be from 1 to 256"),
    (["--batch-size", "2", "--proposer", "draft,ngram"], "measures one proposer (draft, eagle, ngram, hybrid) "
                                                         "against target-only, not draft,ngram"),
    (["--batch-size", "2", "--proposer", "mtp"], "measures one proposer (draft, eagle, ngram, hybrid) against "
                                                 "target-only, not mtp"),
    (["--batch-size", "2", "--records"], "--batch-size takes no --records"),
])
def test_what_a_batch_bench_cannot_take_is_one_line(cli, tiny, args, message):
    code, out, err = cli("bench", "-p", tiny, "--k", "2", "--max-tokens", "4", *args)
    assert code == 2 and out == "" and message in err
    assert len([line for line in err.splitlines() if line.strip()]) <= 2  # the error and its hint


def test_batch_bench_with_an_eagle_head(cli, tiny, head, tmp_path):
    """--proposer eagle --head: the head drafts every speculative run; the document and each result
    say so, the head's floor is its own (fc once a round, its one layer's cache), and the rows kept
    for batch_size auto are the head's, beside the draft model's."""
    from specgen.core import measured

    facts = tmp_path / "facts"
    own = write_profile(tmp_path / "own.toml", *pair_of(tiny), runtime={"threads": 1, "measured": str(facts)})
    code, out, err = cli("bench", "-p", own, "--proposer", "eagle", "--head", str(head), "--batch-size", "1,3",
                         "--k", "2", "--max-tokens", "5", "--warmup", "0", "--format", "json", "-q")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["proposer"] == "eagle" and doc["pair"]["head"] == str(head) and not doc["incomplete"]
    assert [(r["batch_size"], r["proposer"], r["k"]) for r in doc["results"]] == [
        (1, "none", 0), (1, "eagle", 2), (3, "none", 0), (3, "eagle", 2)]
    floor = doc["floor"]
    assert floor["first_call_bytes"]["draft"] > 0 and floor["first_call_bytes"]["target"] == 0
    per_call = floor["streamed_bytes"]["draft"] - floor["first_call_bytes"]["draft"]
    for r in doc["results"]:
        assert r["tokens"] == 5 * len(PROMPTS) and r["tokens_per_second"] > 0
        if r["k"]:
            assert r["round_floor_bytes"]["draft"] > 2 * per_call + floor["first_call_bytes"]["draft"]
            assert r["mean_accepted_length"] >= 1
    kept = measured.load_batches(str(facts))
    assert doc["measured"]["rows"] == 4 and len(kept) == 1
    rows = next(iter(kept.values()))
    assert sorted((r["proposer"], r["head"], r["batch_size"], r["k"]) for r in rows) == [
        ("eagle", str(head), 1, 2), ("eagle", str(head), 3, 2), ("none", None, 1, 0), ("none", None, 3, 0)]
    code, out, err = cli("bench", "-p", own, "--proposer", "eagle", "--head", str(head), "--batch-size", "2",
                         "--k", "2", "--max-tokens", "4", "--warmup", "0", "-n", "2")
    assert code == 0, err
    assert " · batches · eagle · " in out and "k=2" in out


@pytest.mark.parametrize("proposer", ["ngram", "hybrid"])
def test_batch_bench_of_prompt_lookup(cli, tiny, tmp_path, proposer):
    """--proposer ngram or hybrid: every speculative run drafts with it; a lookup streams nothing to
    draft (its floor's draft part 0), hybrid's floor is its draft model's; the rows kept for
    batch_size auto are the proposer's, and a run of it reads them."""
    from dataclasses import replace

    from specgen.core import measured
    from specgen.core.engine import Engine
    from specgen.core.profile import load_profile

    facts = tmp_path / "facts"
    own = write_profile(tmp_path / "own.toml", *pair_of(tiny), runtime={"threads": 1, "measured": str(facts)})
    code, out, err = cli("bench", "-p", own, "--proposer", proposer, "--batch-size", "1,3", "--k", "2",
                         "--max-tokens", "5", "--warmup", "0", "--format", "json", "-q")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["proposer"] == proposer and doc["pair"]["head"] is None and not doc["incomplete"]
    assert [(r["batch_size"], r["proposer"], r["k"]) for r in doc["results"]] == [
        (1, "none", 0), (1, proposer, 2), (3, "none", 0), (3, proposer, 2)]
    streamed = doc["floor"]["streamed_bytes"]
    for r in doc["results"]:
        assert r["tokens"] == 5 * len(PROMPTS) and r["tokens_per_second"] > 0
        if r["k"] and proposer == "ngram":
            assert r["round_floor_bytes"]["draft"] == 0 and streamed["draft"] is None
        elif r["k"]:
            assert r["round_floor_bytes"]["draft"] > 2 * streamed["draft"]
    kept = next(iter(measured.load_batches(str(facts)).values()))
    assert sorted((r["proposer"], r["batch_size"], r["k"]) for r in kept) == sorted([
        ("none", 1, 0), ("none", 3, 0), (proposer, 1, 2), (proposer, 3, 2)])
    profile = load_profile(own)
    profile = replace(profile, proposer=replace(profile.proposer, kind=proposer),
                      runtime=replace(profile.runtime, batch_size="auto"))
    choice = Engine(profile).resolve_batch(profile, 8, 20)
    assert choice.measured, choice.reason  # from the rows just kept, not "nothing measured"
