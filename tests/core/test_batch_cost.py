"""batch_size auto's choice (core/batch_cost.py) from synthetic measured rows: the measured batch
size with the most tokens per second, capped by memory and by the prompts; batch 1 with nothing
measured; target-only where speculation stops paying at the chosen size."""

from __future__ import annotations

import pytest

from specgen.core.batch_cost import BENCH_HINT, choose, memory_rows


def rows(tps: dict) -> list[dict]:
    """Batch rows as core/measured.py keeps them: {(batch, k): tokens/s}, k 0 target-only."""
    return [{"proposer": "draft" if k else "none", "temperature": 0.0, "coupling": None, "batch_size": b, "k": k,
             "tokens_per_second": v} for (b, k), v in tps.items()]


# speculation pays up to B = 8 (k = 4, then k = 2) and stops paying at 16; 16 is fastest overall
MEASURED = rows({(1, 0): 100, (1, 2): 180, (1, 4): 200,
                 (4, 0): 350, (4, 2): 420, (4, 4): 400,
                 (8, 0): 600, (8, 2): 700,
                 (16, 0): 900, (16, 2): 850})


def test_picks_the_measured_batch_with_the_most_tokens_per_second():
    choice = choose(MEASURED, "draft", 100, None, " (here)", "memory not capped on cpu")
    assert (choice.batch, choice.speculate, choice.k, choice.measured) == (16, False, 0, True)
    assert choice.reason.startswith("batch 16, target-only (here): ")
    assert "; speculation does not pay at batch 16: target-only was measured faster" in choice.reason
    assert "batch 8 k=2 700 tok/s" in choice.reason and "memory not capped on cpu" in choice.reason


def test_speculates_at_the_chosen_batch_where_it_pays():
    fast = rows({(1, 0): 100, (1, 4): 200, (8, 0): 600, (8, 2): 900, (8, 4): 800})
    choice = choose(fast, "draft", 50, None)
    assert (choice.batch, choice.speculate, choice.k) == (8, True, 2)
    assert choice.reason.startswith("batch 8, k=2: ")


def test_memory_lowers_the_batch():
    choice = choose(MEASURED, "draft", 100, 12, memory="memory holds 12 rows")
    assert (choice.batch, choice.speculate, choice.k) == (8, True, 2)
    assert "batch 16 would not fit" in choice.reason and "memory holds 12 rows" in choice.reason
    assert choose(MEASURED, "draft", 100, 3).batch == 1  # only B = 1 of those measured fits


def test_memory_below_every_measured_batch():
    larger = rows({(4, 0): 350, (4, 2): 420, (8, 0): 600, (8, 2): 700})
    choice = choose(larger, "draft", 100, 2)
    assert (choice.batch, choice.speculate, choice.k) == (2, True, 2)  # the rows that fit, B = 4's recommendation
    assert "no measured batch fits, 2 rows do" in choice.reason
    assert choose(larger, "draft", 100, 0).batch == 1


def test_never_more_rows_than_prompts():
    choice = choose(MEASURED, "draft", 6, None)
    assert choice.batch == 6 and "6 prompts: 6 rows, not batch 16's 16" in choice.reason
    # it takes the recommendation of the measured batch nearest to 6 rows: B = 4 (k = 2)
    assert (choice.speculate, choice.k) == (True, 2)


def test_nothing_measured_is_batch_one_and_says_how_to_measure():
    choice = choose([], "draft", 40, None, " for tiny + draft on cpu (float32), greedy")
    assert (choice.batch, choice.measured) == (1, False)
    assert choice.reason == f"nothing measured for tiny + draft on cpu (float32), greedy: batch 1 ({BENCH_HINT})"


def test_a_single_prompt_is_batch_one():
    choice = choose(MEASURED, "draft", 1, None)
    assert (choice.batch, choice.measured, choice.reason) == (1, False, "a single prompt: batch 1")


def test_a_target_only_profile_reads_target_only_rows():
    choice = choose(MEASURED, "none", 100, None)
    assert (choice.batch, choice.speculate, choice.k) == (16, False, 0)
    assert "speculation does not pay" not in choice.reason  # it was not asked to speculate


@pytest.mark.parametrize("free, row, fit", [(10 * 2**30, 2**30, 8), (2**30, 2 * 2**30, 0), (100, 0, 0)])
def test_memory_rows(free, row, fit):
    assert memory_rows(free, row) == fit


def batch_document(tps: dict, temperature: float = 0.0) -> dict:
    """A batch bench document (docs/bench-schema.md, "Batches") with the fields the store reads."""
    return {"pair": {"target": "/m/target", "draft": "/m/draft", "device_name": "GPU X", "dtype": "bfloat16"},
            "temperature": temperature, "coupling": "rejection" if temperature else None, "max_tokens": 64,
            "results": [{"batch_size": b, "method": "speculative" if k else "target-only", "k": k, "prompts": 32,
                         "tokens_per_second": v, "row_ms_per_token": {"median": 1000 * b / v}}
                        for (b, k), v in tps.items()]}


def test_batch_rows_are_kept_beside_the_tree_rows(tmp_path):
    """A batch bench's rows go under `batches`, keyed as the tree rows are; saving either keeps the
    other; a later batch bench replaces the (B, k) it ran again; format 1 stays what it was."""
    import json

    from specgen.core import measured

    key = measured.pair_key("/m/target", "/m/draft", "GPU X", "bfloat16")
    folder = str(tmp_path)
    tree_rows = [{"proposer": "none", "temperature": 0.0, "coupling": None, "k": 0, "tree_width": 1}]
    (tmp_path / measured.FILE).write_text(json.dumps({"format": 1, "pairs": {key: tree_rows}}))  # an older file
    assert measured.load_batches(folder) == {}
    path, written = measured.save_batches(folder, batch_document({(1, 0): 100, (1, 2): 180, (4, 0): 350}))
    assert written == 3 and path == tmp_path / measured.FILE
    assert measured.load(folder) == {key: tree_rows}
    measured.save_batches(folder, batch_document({(4, 0): 400, (4, 2): 500}))
    measured.save_batches(folder, batch_document({(4, 0): 300}, temperature=0.8))  # another regime: kept apart
    kept = measured.load_batches(folder)[key]
    assert sorted((r["temperature"], r["batch_size"], r["k"], r["tokens_per_second"]) for r in kept) == [
        (0.0, 1, 0, 100), (0.0, 1, 2, 180), (0.0, 4, 0, 400), (0.0, 4, 2, 500), (0.8, 4, 0, 300)]
    assert {r["proposer"] for r in kept if r["k"]} == {"draft"}
    assert {r["proposer"] for r in kept if not r["k"]} == {"none"}
    assert kept[0]["row_ms_per_token"] == pytest.approx(10.0)
    # the tree rows' save keeps the batch rows
    measured.save(folder, {"created": None, "environment": {"device_name": "GPU X", "dtype": "bfloat16"},
                           "profile": {"target": "/m/target", "draft": "/m/draft"}, "results": [], "baselines": []})
    assert len(measured.load_batches(folder)[key]) == 5
    data = json.loads((tmp_path / measured.FILE).read_text())
    assert data["format"] == measured.FORMAT == 1 and set(data) == {"format", "updated", "pairs", "batches"}
    # what the chooser makes of them: greedy rows only for a greedy run, B = 4 with k = 2
    from specgen.core.tree_cost import regime

    choice = choose(regime(kept, 0.0, "rejection"), "draft", 10, None)
    assert (choice.batch, choice.speculate, choice.k) == (4, True, 2)


def test_batch_tree_rows_are_kept_beside_the_chains(tmp_path):
    """A batch bench with trees keeps each (B, k, tree shape); a row kept before batches measured
    trees (no tree fields) is a chain, which a later chain row of the same (B, k) replaces."""
    import json

    from specgen.core import measured

    folder = str(tmp_path)
    key = measured.pair_key("/m/target", "/m/draft", "GPU X", "bfloat16")
    measured.save_batches(folder, batch_document({(4, 0): 350, (4, 2): 500}))
    data = json.loads((tmp_path / measured.FILE).read_text())
    for row in data["batches"][key]:  # as an older specgen wrote them
        del row["tree_width"], row["tree_nodes"]
    (tmp_path / measured.FILE).write_text(json.dumps(data))
    trees = batch_document({(4, 0): 360, (4, 2): 510})
    trees["results"].append({"batch_size": 4, "method": "speculative", "k": 2, "tree_width": 2, "tree_nodes": 4,
                             "prompts": 32, "tokens_per_second": 560, "row_ms_per_token": {"median": 7.0}})
    measured.save_batches(folder, trees)
    kept = measured.load_batches(folder)[key]
    assert sorted((r["k"], r["tree_width"], r["tree_nodes"], r["tokens_per_second"]) for r in kept) == [
        (0, 1, 0, 360), (2, 1, 2, 510), (2, 2, 4, 560)]


def test_batch_rows_are_labelled_by_proposer_and_head(tmp_path):
    """An eagle batch bench's rows carry proposer eagle and the head's folder, kept beside the draft
    model's (target-only rows are shared: the same measurement); a run reads its own proposer's
    rows (a head's of that head only) and target-only's; a row kept without a proposer reads as
    the draft model's (k > 0) or target-only (k 0)."""
    import json

    from specgen.core import measured
    from specgen.core.tree_cost import regime

    folder = str(tmp_path)
    key = measured.pair_key("/m/target", "/m/draft", "GPU X", "bfloat16")
    measured.save_batches(folder, batch_document({(1, 0): 100, (1, 2): 180, (4, 0): 350, (4, 2): 500}))
    eagle = batch_document({(1, 0): 100, (1, 3): 250, (4, 0): 350, (4, 3): 300})
    eagle["proposer"], eagle["pair"]["head"] = "eagle", "/m/head"
    path, written = measured.save_batches(folder, eagle)
    assert written == 4
    kept = measured.load_batches(folder)[key]
    assert sorted((r["proposer"], r["head"], r["batch_size"], r["k"]) for r in kept) == [
        ("draft", None, 1, 2), ("draft", None, 4, 2), ("eagle", "/m/head", 1, 3), ("eagle", "/m/head", 4, 3),
        ("none", None, 1, 0), ("none", None, 4, 0)]

    def chosen(proposer, head=None):
        rows = regime(measured.batch_rows(kept, proposer, head), 0.0, "rejection", proposer)
        choice = choose(rows, proposer, 10, None)
        return choice.batch, choice.speculate, choice.k

    assert chosen("draft") == (4, True, 2)
    assert chosen("eagle", "/m/head") == (4, False, 0)  # the head's k = 3 is slower than target-only at 4
    assert choose(regime(measured.batch_rows(kept, "eagle", "/m/other"), 0.0, "rejection", "eagle"), "eagle",
                  10, None).measured is False  # another head's rows are not this one's
    # a file written before rows were labelled: its rows are the draft model's and target-only's
    data = json.loads(path.read_text())
    data["batches"][key] = [{k: v for k, v in row.items() if k != "proposer"} for row in data["batches"][key]
                            if row["proposer"] != "eagle"]
    path.write_text(json.dumps(data))
    assert sorted((r["proposer"], r["k"]) for r in measured.load_batches(folder)[key]) == [
        ("draft", 2), ("draft", 2), ("none", 0), ("none", 0)]
