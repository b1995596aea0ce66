"""`specgen bench` on tiny random models: every documented JSON field, sane values, the sweep, errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.core.bench.run import Bench, Unavailable, first_divergence, hf_generation_config, notes, percentile, recommend
from specgen.core.settings import SamplingSpec
from cli_helpers import specgen
from repo_paths import REPO, TESTS
from tiny_models import build_pair, write_profile

SCHEMA_DOC = REPO / "docs" / "bench-schema.md"
CLI_DOC = SCHEMA_DOC.parent / "cli.md"
# The JSON documents of the bench runs docs/cli.md shows (records and per-prompt rows left out).
DOC_RUNS = TESTS / "data"
PROMPTS = ["def add(a, b):", "class Point:"]
KS = (1, 3)
BASELINES = ("target-only", "hf", "hf-static", "hf-assisted")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny pair whose folder also holds prompts.jsonl, as the pair recipe writes it."""
    root = tmp_path_factory.mktemp("bench")
    target, draft = build_pair(root, noisy=0.1)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return write_profile(root / "tiny.toml", target, draft)


@pytest.fixture(scope="module")
def sweep(tiny, tmp_path_factory):
    """One bench over k x temperature with every baseline, run once for the module (in-process)."""
    from specgen.cli import errors
    from specgen.cli.main import app

    out = tmp_path_factory.mktemp("out") / "bench.json"
    argv = sys.argv
    sys.argv = ["specgen", "bench", "-p", str(tiny), "--k", ",".join(map(str, KS)), "-t", "0,0.8",
                "--baseline", ",".join(BASELINES), "-n", "8", "--warmup", "1", "--records",
                "--format", "json", "-q"]
    stdout = sys.stdout
    try:
        with open(out, "w") as sys.stdout:
            code = errors.run(app)
    finally:
        sys.stdout, sys.argv = stdout, argv
    assert code == 0
    return out


def documented_paths() -> list[str]:
    """Every field path in docs/bench-schema.md's tables (records prefixed with their place)."""
    paths, prefix = [], ""
    for line in SCHEMA_DOC.read_text().splitlines():
        if line.startswith("## Batches"):  # another document's (tests/cli/test_bench_batches.py)
            break
        if line.startswith("## Per-round records"):
            prefix = "results[].records[]."
        match = re.match(r"\| `([^`]+)` \|", line)
        if match:
            paths.append(prefix + match.group(1))
    return paths


def resolve(node, parts: list[str], baselines: list[str], where: str, proposers: tuple[str, ...] = ("draft",)) -> None:
    """Check that the path exists in node (stopping at null, which documented nullable fields may be).
    <baseline> and <proposer> stand for each baseline and each proposer (but ngram) of the sweep."""
    if not parts or node is None:
        return
    head, rest = parts[0], parts[1:]
    if head.endswith("[]"):
        node = node[head[:-2]] if head[:-2] else node
        assert isinstance(node, list), where
        for item in node:
            resolve(item, rest, baselines, where, proposers)
        return
    keys = {"<baseline>": baselines, "<proposer>": [p for p in proposers if p != "ngram"]}.get(head, [head])
    for key in keys:
        assert isinstance(node, dict) and key in node, f"{where}: missing {key!r}"
        resolve(node[key], rest, baselines, where, proposers)


def test_bench_json_has_every_documented_field(sweep):
    document = json.loads(sweep.read_text())
    paths = documented_paths()
    assert len(paths) > 80
    for path in paths:
        resolve(document, path.split("."), document["settings"]["baselines"], path,
                tuple(document["settings"]["proposers"]))
    assert document["schema"] == "specgen.bench/1"


def test_docs_cli_md_shows_a_whole_result(sweep):
    """The result docs/cli.md shows from its bench has the fields a real result has (records aside,
    which only --records keeps), and its per-prompt row those of a real row."""
    text = CLI_DOC.read_text()
    shown = text[text.index("```json\n", text.index("one result of it")) + len("```json\n"):]
    shown = json.loads(shown[: shown.index("```")])
    real = json.loads(sweep.read_text())["results"][0]
    assert list(shown) == [key for key in real if key != "records"]
    assert list(shown["per_prompt"][0]) == list(real["per_prompt"][0])


def test_bench_values_are_sane(sweep):
    document = json.loads(sweep.read_text())
    assert [p["text"] for p in document["prompts"]] == PROMPTS  # the pair's prompts.jsonl by default
    assert all(b["available"] == (b["coupling"] != "gumbel" or b["method"] == "target-only")
               for b in document["baselines"])
    assert {(r["temperature"], r["coupling"]) for r in document["results"]} == {
        (0.0, None), (0.8, "rejection"), (0.8, "gumbel")}
    for result in document["results"]:
        if result["coupling"] == "gumbel":  # same seeds: the text of target-only, prompt by prompt
            assert result["sampled_agreement"]["target-only"]["identical_fraction"] == 1.0
    for result in document["results"]:
        k = result["k"]
        assert 0.0 <= result["acceptance_rate"] <= 1.0
        assert 1.0 <= result["mean_accepted_length"] <= k + 1
        assert len(result["per_position_acceptance"]) <= k
        assert all(0.0 <= r <= 1.0 for r in result["per_position_acceptance"])
        assert result["tokens_per_second"]["median"] > 0
        assert result["tokens_per_second"]["min"] <= result["tokens_per_second"]["median"] <= result[
            "tokens_per_second"]["max"]
        assert result["coupling"] == (None if result["temperature"] == 0 else result["coupling"])
        for name in BASELINES:
            if result["coupling"] == "gumbel" and name != "target-only":  # hf baselines: rejection's sweep
                assert result["speedup"][name] is None
                assert all(row["speedup"][name] is None for row in result["per_prompt"])
                continue
            assert result["speedup"][name]["median"] > 0
            assert all(row["speedup"][name] > 0 for row in result["per_prompt"])
        assert all(v >= 0 for v in result["round_ms"].values())
        assert result["round_ms"]["total"] == pytest.approx(sum(result["round_ms"][p] for p in
                                                                ("draft", "verify", "sample", "other")))
        counts = result["counts"]
        assert counts["accepted"] + counts["recovered"] + counts["bonus"] == counts["generated_tokens"] == 8 * len(PROMPTS)
        assert result["peak_gpu_memory_bytes"] is None  # CPU
        assert 0 < result["time_to_first_token_seconds"]["median"]
        if result["temperature"] == 0:
            agreement = result["greedy_agreement"]
            assert set(agreement) == set(BASELINES)
            assert agreement["target-only"]["identical_fraction"] == 1.0  # lossless greedy, float32
            assert agreement["target-only"]["first_divergence"] == [None] * len(PROMPTS)
            assert all(0.0 <= a["identical_fraction"] <= 1.0 for a in agreement.values())
        else:
            assert result["greedy_agreement"] is None


def test_k_sweep_runs_each_k_at_each_temperature(sweep):
    document = json.loads(sweep.read_text())
    sweeps = [(0.0, None), (0.8, "rejection"), (0.8, "gumbel")]  # sampled: both couplings by default
    combos = [(r["temperature"], r["coupling"], r["k"]) for r in document["results"]]
    assert combos == [(t, c, k) for t, c in sweeps for k in KS]
    for result in document["results"]:
        counts = result["counts"]
        assert counts["drafted"] <= result["k"] * counts["rounds"]
        assert max(len(r["rounds"][0]["drafted_ids"]) for r in result["records"]) == result["k"]
    assert [(b["temperature"], b["coupling"], b["method"]) for b in document["baselines"]] == [
        (t, c, m) for t, c in sweeps for m in BASELINES]
    recommended = document["recommendation"]
    assert [(r["temperature"], r["coupling"]) for r in recommended] == sweeps
    for rec in recommended:  # chosen by the statistic the × column shows
        best = max((r for r in document["results"]
                    if (r["temperature"], r["coupling"]) == (rec["temperature"], rec["coupling"])),
                   key=lambda r: r["speedup"]["target-only"]["median"])
        assert rec["k"] == best["k"] and rec["by"] == "speedup.target-only"
        assert rec["speedup"] == rec["speedup_vs_target_only"] == best["speedup"]["target-only"]["median"]
        assert rec["faster_than_target_only"] == (rec["speedup_vs_target_only"] > 1)
    assert document["incomplete"] is False and document["skipped_prompts"] == []
    assert document["fp32_check"] is None  # float32 models: the run itself is the float32 check
    assert document["startup_seconds"] > 0 and "compile" not in document["settings"]


def test_json_alone_on_stdout_in_a_real_process(tiny, tmp_path):
    """A separate process, so nothing printed at import or load time can hide: stdout is one JSON line."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\n\n{\"prompt\": \"import os\"}\n")
    env = {k: v for k, v in os.environ.items() if k != "SPECGEN_DEBUG"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "specgen.cli.main", "bench", "-p", str(tiny), "--prompts", str(prompts), "--k", "2",
         "-n", "4", "--warmup", "0", "--format", "json"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.endswith("\n")
    document = json.loads(proc.stdout)
    assert [p["text"] for p in document["prompts"]] == ["def f(x):", "import os"]
    assert "recommended k" in proc.stderr  # the table goes to stderr with --format json
    assert "\x1b[" not in proc.stderr  # not a terminal: no colours, no progress bar


def test_text_table_on_stdout(cli, tiny):
    code, out, err = cli("bench", "-p", tiny, "--k", "2", "-n", "4", "--warmup", "0", "--num-prompts", "1")
    assert code == 0, err
    assert "k=2" in out and "target-only" in out and "recommended k at temperature 0: 2" in out
    assert err == ""  # stderr is not a terminal: no progress bar


def test_more_prompts_asked_than_the_file_holds_is_said(cli, tiny):
    code, out, err = cli("bench", "-p", tiny, "--k", "2", "-n", "2", "--warmup", "0", "--num-prompts", "5",
                         "--format", "json")
    assert code == 0, err
    assert "--num-prompts 5: the prompts file holds 2; measuring those" in err
    assert len(json.loads(out)["prompts"]) == len(PROMPTS)


def test_errors(cli, tiny, tmp_path):
    no_prompts = write_profile(tmp_path / "bare.toml", *build_pair_paths(tiny))
    code, out, err = cli("bench", "-p", no_prompts)
    assert code == 2 and out == ""
    assert "no prompts" in err and "prompts.jsonl" in err and "--prompts-file" in err
    code, _, err = cli("bench", "-p", tiny, "--k", "1,two")
    assert code == 2 and "--k takes a comma list" in err
    code, _, err = cli("bench", "-p", tiny, "--baseline", "vllm")
    assert code == 2 and "unknown baseline 'vllm'" in err
    code, _, err = cli("bench", "-p", tiny, "--k", "0")
    assert code == 2 and "--k" in err


def build_pair_paths(profile: Path) -> tuple[Path, Path]:
    """The tiny pair's folders, copied (without prompts.jsonl) into a fresh folder."""
    import shutil

    src = profile.parent
    dst = profile.parent.parent / (src.name + "-bare")
    for name in ("target", "draft"):
        if not (dst / name).exists():
            shutil.copytree(src / name, dst / name)
    return dst / "target", dst / "draft"


def test_summaries_and_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([7.0], 0.25) == 7.0
    rows = [{"temperature": 0.0, "k": k, "tokens_per_second": {"median": tps}, "speedup": {"target-only": {"median": s}}}
            for k, tps, s in ((1, 10.0, 0.9), (2, 12.0, 0.95))]
    assert recommend(rows) == [{"temperature": 0.0, "coupling": None, "proposer": None, "k": 2,
                                "tree_width": 1, "tree_nodes": 2, "by": "speedup.target-only", "tokens_per_second": 12.0,
                                "speedup": 0.95, "speedup_vs_target_only": 0.95, "faster_than_target_only": False,
                                "shape": "none"}]  # no row beat target-only: no speculation


def test_recommendation_and_the_speedup_column_use_one_statistic():
    """Median tok/s and the median of per-prompt ratios can rank two k differently (here k=2 has the
    higher median tok/s, k=1 the higher median ratio): the pick follows the ratio the table shows."""
    rows = [{"temperature": 0.0, "k": k, "tokens_per_second": {"median": tps},
             "speedup": {"target-only": {"median": s}, "hf": {"median": 3 * s}}}
            for k, tps, s in ((1, 10.0, 1.3), (2, 12.0, 1.2))]
    assert recommend(rows)[0]["k"] == 1
    assert recommend(rows, ("hf", "target-only"))[0]["by"] == "speedup.hf"
    no_baseline = [dict(r, speedup={"target-only": None}) for r in rows]
    assert recommend(no_baseline)[0] | {"tokens_per_second": None} == {
        "temperature": 0.0, "coupling": None, "proposer": None, "k": 2, "tree_width": 1, "tree_nodes": 2,
        "by": "tokens_per_second",
        "tokens_per_second": None,
        "speedup": None,
        "speedup_vs_target_only": None, "faster_than_target_only": None, "shape": "chain"}


def test_the_recommendation_names_its_shape():
    """A tree, a chain, or no speculation where no row beat target-only; with trees in the sweep
    the line names k and the shape."""
    from specgen.cli.bench import recommendation_lines

    def result(k, width, nodes, s):
        return {"temperature": 0.0, "coupling": None, "proposer": "draft", "k": k, "tree_width": width,
                "tree_nodes": nodes, "tokens_per_second": {"median": 100 * s}, "speedup": {"target-only": {"median": s}}}

    tree_wins = [result(4, 1, 4, 1.5), result(4, 2, 8, 1.7), result(4, 4, 16, 1.6)]
    (rec,) = recommend(tree_wins)
    assert (rec["shape"], rec["k"], rec["tree_width"], rec["tree_nodes"]) == ("tree", 4, 2, 8)
    (chain,) = recommend([result(4, 1, 4, 1.5), result(4, 2, 8, 1.2)])
    assert (chain["shape"], chain["tree_width"], chain["tree_nodes"]) == ("chain", 1, 4)
    (none,) = recommend([result(4, 1, 4, 0.9), result(4, 2, 8, 0.8)])
    assert none["shape"] == "none" and none["faster_than_target_only"] is False
    document = {"settings": {"proposers": ["draft"]}, "profile": {"proposer": "draft"}, "results": tree_wins,
                "recommendation": [rec], "recommendation_per_proposer": [rec],
                "auto": [{"temperature": 0.0, "coupling": None, "k": 4, "reason": "a tree of width 2, 8 nodes"}]}
    lines = [line.plain for line in recommendation_lines(document)]
    assert lines[0].startswith("recommended k and tree shape at temperature 0: k=4 w=2 n=8 (a tree)  (best median")
    assert lines[-1] == "tree_width auto at temperature 0, k=4: a tree of width 2, 8 nodes"
    document.update(results=[result(4, 1, 4, 0.9), result(4, 2, 8, 0.8)], recommendation=[none])
    (line, *_) = [line.plain for line in recommendation_lines(document)]
    assert line.startswith("recommended k and tree shape at temperature 0: k=4 (a chain)")
    assert line.endswith("speculation does not pay off here: use target-only, --proposer none)")


def test_a_note_when_plain_hf_beats_target_only():
    def base(method, tps, temperature=0.0, available=True):
        return {"method": method, "temperature": temperature, "available": available,
                "tokens_per_second": {"median": tps} if available else None}

    said = notes([base("target-only", 64.8), base("hf", 75.2), base("hf-static", 60.0), base("hf-assisted", 90.0),
                  base("target-only", 80.0, 0.8), base("hf", 75.0, 0.8)])
    assert said == ["hf is faster than target-only at temperature 0 (75.2 vs 64.8 tok/s): speedups against "
                    "target-only overstate the gain over plain Hugging Face generate here"]
    assert notes([base("target-only", 64.8), base("hf", None, available=False)]) == []

    from rich.console import Console

    from specgen.cli.bench import show

    console = Console(width=200, record=True, highlight=False)
    show(_document(["target-only"], cuda=False) | {"notes": said}, console)
    assert "note: hf is faster than target-only at temperature 0 (75.2 vs 64.8 tok/s)" in console.export_text()


def test_the_float32_checks_fallbacks_are_shown():
    """A float32 engine whose step kernels failed (on an H100, Llama 3.1 8B's bf16-tuned tiles once
    did) says so below the table, apart from the timed engine's notes."""
    from rich.console import Console

    from specgen.cli.bench import show

    check = {"dtype": "float32", "device": "cuda:0", "results": [],
             "fallbacks": ["target: the step kernels failed (OutOfResources); steps use SDPA and cuBLAS"]}
    console = Console(width=200, record=True, highlight=False)
    show(_document(["target-only"], cuda=False) | {"fp32_check": check}, console)
    assert "float32 check: target: the step kernels failed (OutOfResources)" in console.export_text()


def test_hf_baselines_refuse_what_transformers_cannot_do():
    with pytest.raises(Unavailable, match="presence or frequency"):
        hf_generation_config(SamplingSpec(presence_penalty=0.5), {0})
    with pytest.raises(Unavailable, match="stop strings"):
        hf_generation_config(SamplingSpec(stop=("\n",)), {0})
    config = hf_generation_config(SamplingSpec(temperature=0.8, top_k=-1, ignore_eos=True), {0})
    assert config.do_sample and config.top_k == 0 and config.eos_token_id is None


def test_hf_static_baseline_uses_a_static_cache_without_compile():
    config = hf_generation_config(SamplingSpec(), {0}, static=True)
    assert config.cache_implementation == "static" and config.disable_compile
    assert hf_generation_config(SamplingSpec(), {0}).cache_implementation is None


def test_every_contender_is_warmed_up_before_its_first_timed_run(tiny, monkeypatch):
    """Each method's first generation is an untimed run of prompt 0; its timed runs follow, prompt by
    prompt (a contender timed cold once read 0.76x target-only where warm runs read 1.9x)."""
    calls = []
    ours, hf = Bench._ours, Bench._hf
    monkeypatch.setattr(Bench, "_ours", lambda self, profile, i: calls.append((
        profile.proposer.kind, profile.speculation.k, i)) or ours(self, profile, i))
    monkeypatch.setattr(Bench, "_hf", lambda self, profile, i, assistant, static=False: calls.append((
        "hf", assistant is not None, static, i)) or hf(self, profile, i, assistant, static))
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--k", "1,2", "-n", "3", "--baseline",
                             ",".join(BASELINES), "--format", "json")
    assert code == 0, err
    methods = dict.fromkeys(call[:-1] for call in calls)
    assert len(methods) == 6  # target-only, hf, hf-static, hf-assisted, k=1, k=2
    for method in methods:
        assert [call[-1] for call in calls if call[:-1] == method] == [0, 0, 1], method
    first_timed = len(methods)  # every warm-up comes before any timed run
    assert all(call[-1] == 0 for call in calls[:first_timed])


def test_fp32_check_when_the_models_run_in_bf16(tiny, monkeypatch):
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--k", "1,2", "-n", "6", "--dtype", "bfloat16",
                             "-t", "0,0.8", "--coupling", "rejection,gumbel", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["environment"]["dtype"] == "bfloat16"
    check = document["fp32_check"]
    assert check["dtype"] == "float32"
    assert [(r["temperature"], r["coupling"], r["k"]) for r in check["results"]] == [
        (0.0, None, 1), (0.0, None, 2), (0.8, "gumbel", 1), (0.8, "gumbel", 2)]  # not rejection: its text differs
    assert {r["proposer"] for r in check["results"]} == {"draft"}  # the profile's
    for row in check["results"]:  # lossless greedy and Gumbel in float32: identical, prompt by prompt
        assert row["identical_fraction"] == 1.0 and row["first_divergence"] == [None] * len(PROMPTS)
    assert "greedy same as target-only in float32 (cpu): k=1 100%, k=2 100%" in err
    assert check["fallbacks"] == [] and "float32 check:" not in err  # the torch backend falls back from nothing
    assert "T=0.8 gumbel same as target-only in float32 (cpu): k=1 100%, k=2 100%" in err
    code, out, _ = bench_cli(monkeypatch, "bench", "-p", tiny, "--k", "1", "-n", "4", "--dtype", "bfloat16",
                           "-t", "0", "--no-fp32-check", "--format", "json", "-q")
    assert code == 0 and json.loads(out)["fp32_check"] is None


def test_tree_shapes_are_swept_beside_each_k(tiny, monkeypatch):
    """--tree-width and --tree-nodes are comma lists: every k runs with every shape (width 1 is the
    chain), each result row names its shape, and greedy and Gumbel trees give target-only's text."""
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--k", "2", "--tree-width", "1,2", "--tree-nodes",
                               "4", "-n", "6", "-t", "0,0.8", "--coupling", "gumbel", "--fp32-check", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert [(r["temperature"], r["k"], r["tree_width"], r["tree_nodes"]) for r in document["results"]] == [
        (0.0, 2, 1, 2), (0.0, 2, 2, 4), (0.8, 2, 1, 2), (0.8, 2, 2, 4)]
    assert all(r["sampled_agreement" if r["temperature"] else "greedy_agreement"]["target-only"]["identical_fraction"]
               == 1.0 for r in document["results"])
    assert [r["identical_fraction"] for r in document["fp32_check"]["results"]] == [1.0] * 4
    assert "k=2 w=2 n=4" in err and "greedy same as target-only in float32 (cpu): k=2 100%, k=2 w=2 n=4 100%" in err
    assert {"tree_width", "tree_nodes"} <= set(document["recommendation"][0])
    # the recommendation names its shape (a tree sweep: k and shape), and what auto would choose
    for rec in document["recommendation"]:
        assert rec["shape"] == ("none" if not rec["faster_than_target_only"] else
                                "chain" if rec["tree_width"] == 1 else "tree")
    assert "recommended k and tree shape at temperature 0: k=2" in err
    assert [(a["temperature"], a["k"]) for a in document["auto"]] == [(0.0, 2), (0.8, 2)]
    # (the choice itself follows this machine's timings: tests/core/test_tree_cost.py tests it with numbers)
    assert all(a["reason"] and a["tree_width"] in (1, 2) and 2 <= a["tree_nodes"] <= 4 for a in document["auto"])
    assert "tree_width auto at temperature 0, k=2: " in err
    # the rows are kept for later runs' auto (the session's own cache folder: tests/conftest.py)
    kept = document["measured"]
    assert kept["rows"] == 6 and kept["path"].endswith("measured.json") and f"{kept['path']} for tree_width auto" in err
    result = specgen(monkeypatch, "generate", "-p", tiny, "-n", "8", "--k", "2", "--tree-width", "auto",
                     "--tree-nodes", "auto", "-v", "--no-live", "def f(x):")
    assert result.code == 0, result.stderr
    shape = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in result.stderr.splitlines()
             if line.startswith("tree_")}
    assert re.fullmatch(r"a chain|a tree of width 2, [234] nodes|no speculation, target-only is faster",
                        shape["tree_auto"].split(" (bench's measurements, ")[0])
    assert "T=0)" in shape["tree_auto"] and {"tree_width", "tree_nodes"} <= set(shape)


def test_tree_shapes_that_do_not_fit_a_k_are_left_out_of_its_runs():
    """k = 2 holds at most 2 + 4 = 6 nodes at width 2: a 10-node shape runs at k = 3 (2 + 8) only."""
    from specgen.core.bench.bench_plan import Plan, tree_shapes

    plan = Plan(ks=(2, 3), temperatures=(0.0,), proposers=("draft",), trees=tree_shapes((1, 2), (6, 10)))
    assert plan.trees == ((1, 0), (2, 6), (2, 10))
    assert plan.shapes(2) == ((1, 0), (2, 6)) and plan.shapes(3) == plan.trees


def test_hybrid_trees_are_swept(tiny, monkeypatch):
    """--proposer hybrid takes --tree-width: its rounds are the lookup's trie merged with the
    draft's tree, or the draft's alone, and greedy text is target-only's."""
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--proposer", "hybrid", "--k", "2",
                               "--tree-width", "1,2", "--tree-nodes", "4", "-n", "4", "-t", "0", "--format", "json")
    assert code == 0, err
    results = json.loads(out)["results"]
    assert [(r["proposer"], r["k"], r["tree_width"]) for r in results] == [("hybrid", 2, 1), ("hybrid", 2, 2)]
    assert all(r["greedy_agreement"]["target-only"]["identical_fraction"] == 1.0 for r in results)


@pytest.mark.parametrize("args, message", [
    (("--tree-nodes", "4"), "--tree-nodes sizes a tree, and no --tree-width was given"),
    (("--tree-width", "2,4", "--tree-nodes", "30"), "--tree-nodes (30) must be 0 (= k) or from --k (2) to 6"),
])
def test_tree_sweeps_that_cannot_run_are_usage_errors(tiny, monkeypatch, args, message):
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--k", "2", "-n", "4", *args)
    assert code == 2 and out == "" and message in err


def test_ctrl_c_keeps_what_finished(tiny, tmp_path, monkeypatch):
    """Ctrl-C in the third prompt: the first two, finished by every method, are printed (JSON marked
    incomplete) and the exit code is 130."""
    from cli_helpers import wrap_forwards

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nclass Point:\nimport os\n")
    seen = []

    def counting(forward, self, *args, **kwargs):
        seen.append(1)
        if limit is not None and len(seen) == limit:
            raise KeyboardInterrupt
        return forward(self, *args, **kwargs)

    wrap_forwards(monkeypatch, counting)
    starts = []  # forward calls made before each generation began
    ours = Bench._ours
    monkeypatch.setattr(Bench, "_ours", lambda self, profile, i: starts.append(len(seen)) or ours(self, profile, i))
    argv = ("bench", "-p", tiny, "--prompts", prompts, "--k", "2", "-n", "4", "-t", "0", "--format", "json")
    limit = None
    code, _, err = bench_cli(monkeypatch, *argv)
    assert code == 0, err
    assert len(starts) == 8  # target-only and k=2: a warm-up each, then 3 prompts each, in turns
    limit = starts[6] + 2  # two forwards into the third prompt's first run
    seen.clear()
    code, out, err = bench_cli(monkeypatch, *argv)
    assert code == 130
    document = json.loads(out)
    assert document["incomplete"] is True
    assert [r["prompt"] for r in document["results"][0]["per_prompt"]] == [0, 1]
    assert [r["prompt"] for r in document["baselines"][0]["per_prompt"]] == [0, 1]
    assert document["recommendation"][0]["k"] == 2
    assert "INCOMPLETE" in err and "interrupted: the table holds only" in err
    assert err.rstrip().endswith("specgen: interrupted")


def test_a_too_long_prompt_is_skipped_not_fatal(tiny, tmp_path, monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n" + " ".join(str(i) for i in range(600)) + "\nclass Point:\n")
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--prompts", prompts, "--k", "2", "-n", "4",
                             "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert [p["index"] for p in document["prompts"]] == [0, 2]
    assert [r["prompt"] for r in document["results"][0]["per_prompt"]] == [0, 2]
    (skipped,) = document["skipped_prompts"]
    assert skipped["index"] == 1 and skipped["tokens"] > 512 and "context" in skipped["reason"]
    assert "specgen: warning: skipping prompt 2 of 3: the prompt has" in err
    prompts.write_text(" ".join(str(i) for i in range(600)) + "\n")
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--prompts", prompts, "--k", "2", "-n", "4")
    assert code == 2 and out == "" and "no prompt fits" in err


def bench_cli(monkeypatch, *args, **kwargs) -> tuple[int, str, str]:
    result = specgen(monkeypatch, *args, **kwargs)
    return result.code, result.stdout, result.stderr


def _document(names: list[str], cuda: bool, proposers: tuple[str, ...] = ("draft",)) -> dict:
    """A bench document with wide numbers, for rendering tests: one k=8 row per proposer."""
    tps = {"median": 12345.6, "p25": 10234.5, "p75": 15432.1, "min": 1.0, "max": 2.0}
    peak = 123456789012 if cuda else None
    decode = {"median": 13579.2}
    base = [{"method": n, "temperature": 0.0, "available": True, "reason": None, "tokens_per_second": tps,
             "decode_tokens_per_second": decode, "time_to_first_token_seconds": {"median": 1.2345},
             "peak_gpu_memory_bytes": peak} for n in names]
    result = {"k": 8, "temperature": 0.0, "tokens_per_second": tps, "decode_tokens_per_second": decode,
              "speedup": {n: {"median": 123.45} for n in names}, "acceptance_rate": 0.8765,
              "mean_accepted_length": 7.65, "per_position_acceptance": [0.9] * 8,
              "round_ms": {"draft": 10.25, "verify": 20.5, "sample": 30.75, "other": 40.5},
              "time_to_first_token_seconds": {"median": 1.2345}, "peak_gpu_memory_bytes": peak,
              "greedy_agreement": {"target-only": {"identical_fraction": 0.95, "first_divergence": [None, 103]}}}
    results = [result | {"proposer": proposer} for proposer in proposers]
    return {"settings": {"baselines": names, "temperatures": [0.0], "max_tokens": 128, "proposers": list(proposers)},
            "environment": {"device": "cuda:0", "device_name": "NVIDIA H200"},
            "profile": {"name": "bench", "proposer": proposers[0]},
            "prompts": [{}] * 20, "baselines": base, "results": results, "incomplete": False,
            "recommendation": [], "notes": [], "fp32_check": None, "skipped_prompts": []}


NUMBERS = ("12345.6", "10234.5–15432.1", "13579.2", "123.45×", "87.6%", "7.65", "10.2/20.5/30.8/40.5", "1234.5",
           "117738", "95% (tok 103)")


def rendered(document: dict, width: int, terminal: bool) -> str:
    """What `show` prints on a console of that width, a terminal or a file, without styles."""
    import io

    from rich.console import Console

    from specgen.cli.bench import show

    console = Console(file=io.StringIO(), width=width, record=True, highlight=False, force_terminal=terminal)
    show(document, console)
    return console.export_text()


@pytest.mark.parametrize("width, names, proposers", [
    (120, BASELINES, ("draft",)), (80, ("target-only",), ("draft",)), (100, ("target-only", "hf"), ("draft",)),
    (100, ("target-only",), ("draft", "ngram", "hybrid")), (60, BASELINES, ("draft",)),
])
def test_a_terminal_table_splits_to_fit_and_never_cuts_or_wraps_a_number(width, names, proposers):
    """On a terminal each number is whole on one line; where one table does not fit, the columns go
    to as few tables as fit, each with the rows' keys."""
    text = rendered(_document(list(names), cuda=True, proposers=proposers), width, terminal=True)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    for number in NUMBERS:
        assert number in text, (number, text)
    tables = sum(line.split()[:1] == ["T"] for line in text.splitlines())  # each table's header
    assert tables >= 1 and text.count("k=8") == tables * len(proposers)


def test_off_a_terminal_the_table_is_one_and_no_line_wraps():
    """A pipe or a log file gets one table as wide as its cells: every row on one line, whatever
    the width the console would have had."""
    document = _document(list(BASELINES), cuda=True, proposers=("draft",))
    text = rendered(document, 80, terminal=False)
    lines = text.splitlines()
    header = next(line for line in lines if "tok/s" in line)
    assert all(head in header for head in ("p25–p75", "× hf-assisted", "TTFT ms", "round ms d/v/s/o", "same text"))
    [row] = [line for line in lines if "k=8" in line]
    assert all(number in row for number in NUMBERS)
    assert len(row.rstrip()) > 80  # not wrapped at the console's width


def test_a_baseline_that_did_not_run_gets_n_a_cells_and_its_reason_below():
    document = _document(["target-only", "hf"], cuda=False)
    reason = "transformers generate has no presence or frequency penalty"
    document["baselines"][1] |= {"available": False, "reason": reason, "tokens_per_second": None,
                                 "decode_tokens_per_second": None, "time_to_first_token_seconds": None}
    document["results"][0]["speedup"]["hf"] = None
    text = rendered(document, 80, terminal=False)
    [row] = [line for line in text.splitlines() if line.split()[:2] == ["0", "hf"]]
    assert row.split()[2:] == ["n/a"] * 4  # tok/s, p25–p75, decode tok/s, TTFT ms
    assert f"n/a: hf at T=0: {reason}" in text.splitlines()
    assert reason not in row


def test_same_text_is_a_dash_under_rejection_coupling_with_a_legend():
    """A sampled row under rejection coupling follows the target's distribution, not its text: no
    percentage that would read as a losslessness failure."""
    document = _document(["target-only"], cuda=False)
    greedy = document["results"][0]
    sampled = {"temperature": 0.8, "greedy_agreement": None}
    agreement = {"target-only": {"identical_fraction": 0.0, "first_divergence": [0, 0]}}
    document["results"] = [greedy, greedy | sampled | {"coupling": "rejection", "sampled_agreement": agreement},
                           greedy | sampled | {"coupling": "gumbel", "sampled_agreement": {"target-only": {
                               "identical_fraction": 1.0, "first_divergence": [None, None]}}}]
    text = rendered(document, 80, terminal=False)
    rows = {line.split()[1]: line for line in text.splitlines() if "k=8" in line and line.split()[0] == "0.8"}
    assert rows["rejection"].rstrip().endswith(" –") and "0%" not in rows["rejection"]
    assert rows["gumbel"].rstrip().endswith(" 100%")
    assert "same text –: rejection coupling: same distribution, not the same text" in text
    assert "same text: the share of prompts whose tokens are all target-only's" in text


def test_the_recommendation_says_its_statistic_and_the_faster_row():
    """The pick follows the median per-prompt ratio; where another row has the higher median tok/s,
    a line says so, so that the table and the recommendation do not seem to disagree."""
    document = _document(["target-only"], cuda=False)
    one, two = (document["results"][0] | {"k": k, "tokens_per_second": {"median": tps, "p25": tps, "p75": tps},
                                          "speedup": {"target-only": {"median": ratio}}}
                for k, tps, ratio in ((4, 25.7, 1.29), (2, 28.1, 1.10)))
    document["results"] = [one, two]
    document["recommendation"] = recommend(document["results"])
    lines = rendered(document, 200, terminal=False).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("recommended k"))
    assert lines[at] == "recommended k at temperature 0: 4  (best median × target-only: 1.29×, at 25.7 tok/s)"
    assert lines[at + 1].startswith("k=2 has the highest median tok/s (28.1) but a lower median × target-only (1.10×)")


def doc_bench_tables() -> dict[str, list[str]]:
    """The bench output docs/cli.md shows, by the file name of its run's JSON: each fenced block
    that follows a `<!-- tests/data/NAME.json -->` line, without its `$ specgen ...` command lines."""
    found = re.findall(r"<!-- tests/data/([\w.-]+\.json) -->\n```\n(.*?)```", CLI_DOC.read_text(), re.S)
    return {name: re.sub(r"^\$ (.*\\\n)*.*\n", "", block, flags=re.M).splitlines() for name, block in found}


def test_docs_cli_md_shows_what_bench_prints_for_its_runs():
    """The bench examples of docs/cli.md are what `show` prints off a terminal for the JSON those
    runs wrote, line for line."""
    tables = doc_bench_tables()
    assert len(tables) == 2
    for name, lines in tables.items():
        document = json.loads((DOC_RUNS / name).read_text())
        text = rendered(document, 80, terminal=False)
        assert [line.rstrip() for line in text.splitlines()] == lines, name


def test_the_floor_column_appears_with_a_floor():
    """`× floor` shows round_over_floor where a result has one, `–` where another has none, and is
    absent from a bench without any (the CPU's)."""
    from rich.console import Console

    from specgen.cli.bench import show

    document = _document(["target-only"], cuda=True, proposers=("draft", "hybrid"))
    document["results"][0]["round_over_floor"] = 1.234
    document["results"][1]["round_over_floor"] = None
    console = Console(width=200, record=True, highlight=False)
    show(document, console)
    text = console.export_text()
    assert "× floor" in text and "1.23×" in text
    rows = {name: next(line for line in text.splitlines() if f" {name} " in line) for name in ("draft", "hybrid")}
    assert rows["hybrid"].count("–") == rows["draft"].count("–") + 1  # its floor cell (p25–p75 has one too)
    console = Console(width=200, record=True, highlight=False)
    show(_document(["target-only"], cuda=False), console)
    assert "× floor" not in console.export_text()


def test_progress_shows_an_eta_on_a_terminal(tiny, monkeypatch):
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--k", "1", "-n", "2", "--num-prompts", "1",
                             tty=True)
    assert code == 0, err
    assert "ETA" in err
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--k", "1", "-n", "2", "--num-prompts", "1")
    assert "ETA" not in err and err == ""


# ---------------------------------------------------------------- generate's options


@pytest.fixture(scope="module")
def chatty(tmp_path_factory):
    """A tiny pair whose tokenizer has a chat template."""
    from cli_helpers import add_chat_template

    root = tmp_path_factory.mktemp("chatty")
    target, draft = build_pair(root, noisy=0.1)
    add_chat_template(target, draft)
    return write_profile(root / "tiny.toml", target, draft)


def test_chat_system_threads_and_the_prompts_alias(chatty, tmp_path, monkeypatch):
    import torch
    from transformers import PreTrainedTokenizerFast

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n")
    tok = PreTrainedTokenizerFast.from_pretrained(chatty.parent / "target")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def add(a, b):"}]
    expected = len(tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"])
    before = torch.get_num_threads()
    try:
        for name in ("--prompts-file", "--prompts"):
            code, out, err = bench_cli(monkeypatch, "bench", "-p", chatty, name, prompts, "--system", "be brief",
                                       "--k", "1", "-n", "2", "--warmup", "0", "--threads", "2", "--format", "json",
                                       "-q")
            assert (code, err) == (0, ""), err
            document = json.loads(out)
            assert document["prompts"][0]["tokens"] == expected
            assert document["environment"]["cpu_threads"] == 2
    finally:
        torch.set_num_threads(before)


def test_truncate_prompt_keeps_a_long_prompts_end(tiny, tmp_path, monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(" ".join(str(i) for i in range(600)) + "\n")
    args = ("bench", "-p", tiny, "--prompts-file", prompts, "--k", "1,2", "-n", "4", "--warmup", "0")
    code, out, err = bench_cli(monkeypatch, *args)
    assert code == 2 and out == ""
    assert "no prompt fits" in err and "--truncate-prompt" in err.splitlines()[-1]
    code, out, err = bench_cli(monkeypatch, *args, "--truncate-prompt", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["skipped_prompts"] == []
    assert document["prompts"][0]["tokens"] == 512 - 4 - (2 + 1)  # context - max_tokens - the largest k's round


def test_a_high_temperature_in_the_sweep_warns_unless_quiet(tiny, monkeypatch):
    args = ("bench", "-p", tiny, "--k", "1", "-t", "0,8", "-n", "2", "--warmup", "0", "--num-prompts", "1")
    code, out, err = bench_cli(monkeypatch, *args)
    assert code == 0, err
    assert err.startswith("specgen: warning: temperature 8 is above 2")
    code, out, err = bench_cli(monkeypatch, *args, "--quiet")
    assert (code, err) == (0, "")


# ---------------------------------------------------------------- proposers side by side


@pytest.fixture(scope="module")
def ngram_profile(tiny):
    """The tiny pair with n-gram lookup as the profile's own proposer ([draft] still configured)."""
    target, draft = tiny.parent / "target", tiny.parent / "draft"
    return write_profile(tiny.parent / "ngram.toml", target, draft, proposer={"kind": "ngram"})


def test_proposers_are_measured_side_by_side(ngram_profile, monkeypatch):
    """--proposer ngram,draft,hybrid: every proposer with every k on the same prompts, one
    target-only baseline; the engine loads the draft although the profile's own proposer is ngram."""
    code, out, err = bench_cli(monkeypatch, "bench", "-p", ngram_profile, "--proposer", "ngram,draft,hybrid",
                               "--k", "1,2", "-n", "6", "--warmup", "0", "--baseline", "target-only,hf-assisted",
                               "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["settings"]["proposers"] == ["ngram", "draft", "hybrid"]
    assert document["profile"]["proposer"] == "ngram"
    assert [(r["proposer"], r["k"]) for r in document["results"]] == [
        (p, k) for p in ("ngram", "draft", "hybrid") for k in (1, 2)]
    assert [b["method"] for b in document["baselines"]] == ["target-only", "hf-assisted"]
    assert all(b["available"] for b in document["baselines"])  # the draft was loaded for hf-assisted too
    for result in document["results"]:
        assert result["greedy_agreement"]["target-only"]["identical_fraction"] == 1.0
        assert [row["prompt"] for row in result["per_prompt"]] == [0, 1]  # the same prompts for every proposer
    assert min(r["counts"]["drafted"] for r in document["results"] if r["proposer"] == "draft") > 0
    (overall,) = document["recommendation"]
    per = document["recommendation_per_proposer"]
    assert [r["proposer"] for r in per] == ["ngram", "draft", "hybrid"]
    best = max(per, key=lambda r: r["speedup"])
    assert (overall["proposer"], overall["k"], overall["speedup"]) == (best["proposer"], best["k"], best["speedup"])
    for rec in per:
        rows = [r for r in document["results"] if r["proposer"] == rec["proposer"]]
        assert rec["k"] == max(rows, key=lambda r: r["speedup"]["target-only"]["median"])["k"]
    lines = err.splitlines()
    header = next(line for line in lines if "method" in line)
    assert header.split()[:3] == ["T", "proposer", "method"]
    assert any(line.split()[1:3] == ["hybrid", "k=2"] for line in lines)
    assert f"recommended proposer and k at temperature 0: {overall['proposer']} k={overall['k']}" in err
    assert all(f"  best k for {p}: " in err for p in ("ngram", "draft", "hybrid"))


def test_one_proposer_keeps_the_table_without_a_proposer_column(tiny, monkeypatch):
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--proposer", "ngram", "--k", "2", "-n", "4",
                               "--warmup", "0", "--num-prompts", "1", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["settings"]["proposers"] == ["ngram"] and document["profile"]["proposer"] == "draft"
    assert [r["proposer"] for r in document["results"]] == ["ngram"]
    assert document["results"][0]["counts"]["drafted"] <= document["results"][0]["counts"]["rounds"] * 2
    assert "proposer" not in next(line for line in err.splitlines() if "method" in line)
    assert "recommended k at temperature 0: 2" in err


@pytest.mark.parametrize("option, value, example", [
    ("--k", "4,,5", "1,2,4"), ("--k", "4,", "1,2,4"), ("-t", "0,,1", "0,0.8"), ("--proposer", "draft,,ngram", "draft,ngram"),
    ("--coupling", "rejection,,gumbel", "rejection,gumbel"), ("--baseline", "target-only,,hf", "target-only,hf"),
])
def test_an_empty_entry_of_a_comma_list_is_refused(tiny, monkeypatch, option, value, example):
    """As tune-kernels refuses `--rows 1,,5`: an entry left out is more likely a typo than a wish."""
    from cli_helpers import assert_error

    name = {"-t": "--temperature"}.get(option, option)
    assert_error(specgen(monkeypatch, "bench", "-p", tiny, option, value), 2, f"{name} {value!r} has an empty entry",
                 f"hint: e.g. {name} {example}")


def test_proposer_list_is_checked_before_any_model_loads(tiny, tmp_path, monkeypatch):
    """Names the settings do not define, a proposer the profile cannot run and the target-only kind
    are usage errors (exit 2) found before loading: loading here would fail the test with exit 1."""
    from cli_helpers import assert_error
    from specgen.cli import loading

    def no_loading(*args, **kwargs):
        raise AssertionError("models were loaded before the proposers were checked")

    monkeypatch.setattr(loading, "load_engine", no_loading)
    target, _ = build_pair_paths(tiny)
    draftless = write_profile(tmp_path / "draftless.toml", target, None, proposer={"kind": "ngram"})
    cases = [
        ((tiny, "--proposer", "ngram,eagle2"), ("--proposer eagle2",)),
        ((tiny, "--proposer", " , "), ("--proposer is empty",)),
        ((tiny, "--proposer", "draft,,ngram"), ("--proposer 'draft,,ngram' has an empty entry",
                                                 "hint: e.g. --proposer draft,ngram")),

        ((tiny, "--proposer", "draft,none"), ("--proposer none drafts nothing", "--baseline target-only")),
        ((draftless, "--proposer", "ngram,draft"), ("the draft proposer needs a draft model",)),
        ((write_profile(tmp_path / "none.toml", target, None, proposer={"kind": "none"}),),
         ("the profile's proposer (none) drafts nothing", "--proposer")),
    ]
    for args, fragments in cases:
        result = specgen(monkeypatch, "bench", "-p", *args)
        assert_error(result, 2, *fragments)


def test_generate_and_bench_take_their_rates_from_one_function(tiny, monkeypatch):
    """The decode rate that generate reports and bench's decode tok/s (specgen's runs and the
    baselines') come from core/stats.decode_rate: with a stand-in for it, both report its value."""
    from specgen.core import stats

    monkeypatch.setattr(stats, "decode_rate", lambda *args: 4321.0)
    code, out, err = bench_cli(monkeypatch, "bench", "-p", tiny, "--k", "2", "-n", "4", "--warmup", "0",
                               "--num-prompts", "1", "--baseline", "target-only,hf", "--format", "json", "-q")
    assert code == 0, err
    document = json.loads(out)
    for entry in document["baselines"] + document["results"]:
        assert entry["decode_tokens_per_second"]["median"] == 4321.0, entry["method" if "method" in entry else "k"]
        assert [row["decode_tokens_per_second"] for row in entry["per_prompt"]] == [4321.0]
    generated = specgen(monkeypatch, "generate", "-p", tiny, "-n", "4", "--format", "json", "def add(a, b):")
    assert generated.code == 0, generated.stderr
    assert json.loads(generated.stdout)["stats"]["decode_tokens_per_second"] == 4321.0
    assert "then 4321.0 tok/s" in generated.stderr


def test_inspect_acceptance_reads_the_recommended_proposer_of_a_bench():
    """Without --k, `inspect-acceptance --bench` shows the recommended result: with several
    proposers, the recommended proposer's, not the first proposer's of that k."""
    from specgen.core.insight import runs_from_bench

    results = [{"proposer": p, "k": 2, "temperature": 0.0, "records": []} for p in ("draft", "ngram")]
    document = {"schema": "specgen.bench/1", "results": results,
                "recommendation": [{"temperature": 0.0, "proposer": "ngram", "k": 2}]}
    assert runs_from_bench(document, None, None)[0]["proposer"] == "ngram"
    assert runs_from_bench(document, 2, None)[0]["proposer"] == "draft"
