"""`generate --prompts-file --batch-size B`: the same records and text as one prompt at a time, in
the file's order; what batches do not take yet is a one-line usage error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import assert_error, specgen
from tiny_models import build_pair, head_for, write_profile

LINES = [{"prompt": "def add(a, b):", "max_tokens": 9}, {"prompt": "import os", "temperature": 0.8, "seed": 3},
         {"prompt": "class A:", "max_tokens": 4}, {"prompt": "for i in x:", "top_k": 5, "temperature": 1.0, "seed": 1},
         {"prompt": "x = 1", "stop": ["e"]}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("batches_cli")
    profile = write_profile(root / "tiny.toml", *build_pair(root, noisy=0.1),
                            sampling={"max_tokens": 12, "ignore_eos": True})
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    return profile, prompts


def generate(monkeypatch, tiny, *args):
    profile, prompts = tiny
    return specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", prompts, "-q", *args)


def records(result) -> list[tuple]:
    assert result.code == 0, result
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return [(r["prompt"], r["token_ids"], r["text"], r["finish_reason"]) for r in lines]


@pytest.mark.parametrize("batch", ["2", "4"])
def test_jsonl_records_equal_one_prompt_at_a_time(monkeypatch, tiny, batch):
    alone = records(generate(monkeypatch, tiny, "--format", "jsonl"))
    assert [r[0] for r in alone] == [line["prompt"] for line in LINES]
    assert records(generate(monkeypatch, tiny, "--format", "jsonl", "--batch-size", batch)) == alone


def test_text_output_equals_one_prompt_at_a_time(monkeypatch, tiny):
    alone = generate(monkeypatch, tiny)
    batched = generate(monkeypatch, tiny, "--batch-size", "3")
    assert batched.code == 0 and batched.stdout == alone.stdout


def test_eagle_records_equal_one_prompt_at_a_time(monkeypatch, tiny, tmp_path):
    """--proposer eagle: an EAGLE-3 head drafts every row, each record the prompt's alone."""
    profile, prompts = tiny
    target = Path(pair_of(profile)[0])
    head = head_for(target, tmp_path / "head")
    own = write_profile(tmp_path / "eagle.toml", target, None, sampling={"max_tokens": 12, "ignore_eos": True},
                        proposer={"kind": "eagle", "head": str(head)})
    def run(*args):
        return specgen(monkeypatch, "generate", "-p", own, "--prompts-file", prompts, "-q", "--format", "jsonl", *args)

    assert records(run("--batch-size", "3")) == records(run())


@pytest.mark.parametrize("proposer", [["--proposer", "ngram"], ["--proposer", "ngram", "--tree-width", "2",
                                                                "--tree-nodes", "4"], ["--proposer", "hybrid"],
                                      ["--proposer", "hybrid", "--tree-width", "2", "--tree-nodes", "6"]],
                         ids=["ngram", "ngram-trees", "hybrid", "hybrid-trees"])
def test_lookup_records_equal_one_prompt_at_a_time(monkeypatch, tiny, proposer):
    """--proposer ngram and hybrid (chains or trees): each row's own prompt lookup drafts it (stop
    strings, seeds and max_tokens per line; hybrid: the draft model where it finds nothing), each
    record the prompt's alone, drafts and all."""
    def run(*args):
        result = generate(monkeypatch, tiny, "--format", "jsonl", *proposer, *args)
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        return records(result), [(r["stats"]["drafted"], r["stats"]["accepted"]) for r in lines]

    alone = run()
    assert sum(drafted for drafted, _ in alone[1]) > 0
    assert run("--batch-size", "3") == alone


def test_penalties_and_min_tokens_records_equal_one_prompt_at_a_time(monkeypatch, tiny):
    """The command line's penalties and min_tokens (a prompts file's lines name neither) hold for
    every row, sampled and greedy lines sharing the batch; each record the prompt's alone."""
    args = ["--format", "jsonl", "--repetition-penalty", "1.3", "--presence-penalty", "0.4", "--frequency-penalty",
            "0.3", "--min-tokens", "3", "--no-ignore-eos"]
    alone = records(generate(monkeypatch, tiny, *args))
    assert alone != records(generate(monkeypatch, tiny, "--format", "jsonl", "--no-ignore-eos"))
    assert records(generate(monkeypatch, tiny, *args, "--batch-size", "3")) == alone


def test_draft_p_min_records_equal_one_prompt_at_a_time(monkeypatch, tiny):
    """--draft-p-min: each row's drafting cut at its own first unsure step, sampled and greedy
    lines sharing the batch; each record the prompt's alone, its drafted count too."""
    def run(*args):
        result = generate(monkeypatch, tiny, "--format", "jsonl", "--draft-p-min", "0.3", *args)
        return records(result), [r["stats"]["drafted"] for r in map(json.loads, result.stdout.splitlines())]

    alone = run()
    assert run("--batch-size", "3") == alone


def test_a_tree_shape_auto_with_nothing_measured_runs_chains_and_says_so(monkeypatch, tiny, tmp_path):
    """--batch-size 3 --tree-width 2 --tree-nodes auto, nothing measured at batch: chains of k, as
    the records of the same run without trees, and one line on stderr says why."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty measured folder
    chains = generate(monkeypatch, tiny, "--format", "jsonl", "--batch-size", "3")
    profile, prompts = tiny
    auto = specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", prompts, "--format", "jsonl",
                   "--batch-size", "3", "--tree-width", "2", "--tree-nodes", "auto")
    assert records(auto) == records(chains)
    assert "tree shape auto at batch 3: nothing measured" in auto.stderr and "a chain" in auto.stderr


def test_auto_with_nothing_measured_is_batch_one_and_says_so(monkeypatch, tiny, tmp_path):
    profile, prompts = tiny
    own = write_profile(tmp_path / "own.toml", *pair_of(profile), sampling={"max_tokens": 12, "ignore_eos": True},
                        runtime={"threads": 1, "measured": str(tmp_path)})
    result = specgen(monkeypatch, "generate", "-p", own, "--prompts-file", prompts, "--batch-size", "auto",
                     "--format", "jsonl")
    assert result.code == 0 and "specgen: batch_size auto: nothing measured for " in result.stderr
    assert "greedy: batch 1 (specgen bench --batch-size 1,4,8,16 measures batches)" in result.stderr
    verbose = specgen(monkeypatch, "generate", "-p", own, "--batch-size", "auto", "-v", "--no-live", "def f(x):")
    assert verbose.code == 0 and "batch_size: 1\nbatch_auto: a single prompt: batch 1\n" in verbose.stderr


def pair_of(profile) -> tuple[str, str]:
    """The target and draft paths of a profile write_profile wrote."""
    import tomllib

    table = tomllib.loads(profile.read_text())
    return table["target"]["path"], table["draft"]["path"]


def auto_lines(stderr: str) -> dict:
    return {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in stderr.splitlines()
            if line.startswith(("batch_size: ", "batch_auto: "))}


GREEDY = [{"prompt": p} for p in ("def add(a, b):", "import os", "class A:", "for i in x:", "x = 1")]


@pytest.fixture
def measured_profile(tiny, tmp_path):
    """A profile whose [runtime] measured is a folder of this test's, and a file of greedy prompts
    (greedy fp32: the same tokens at any batch size, k or proposer)."""
    profile = write_profile(tmp_path / "own.toml", *pair_of(tiny[0]), sampling={"max_tokens": 8, "ignore_eos": True},
                            runtime={"threads": 1, "measured": str(tmp_path / "facts")})
    prompts = tmp_path / "greedy.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in GREEDY))
    return profile, prompts, str(tmp_path / "facts")


def test_auto_decodes_target_only_where_speculation_stops_paying(monkeypatch, measured_profile):
    """Synthetic facts for this pair on this machine: batch 2 is fastest and speculation stops
    paying there, so the run decodes 2 rows target-only (no drafts) and says so."""
    from specgen.core import measured
    from specgen.core.engine import device_name
    import torch

    profile, prompts, folder = measured_profile
    target, draft = pair_of(profile)
    document = {"pair": {"target": target, "draft": draft, "device_name": device_name(torch.device("cpu")),
                         "dtype": "float32"}, "temperature": 0.0, "coupling": None, "max_tokens": 8,
                "results": [{"batch_size": b, "k": k, "tokens_per_second": v}
                            for (b, k), v in {(1, 0): 10.0, (1, 3): 30.0, (2, 0): 80.0, (2, 3): 60.0}.items()]}
    measured.save_batches(folder, document)
    alone = specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", prompts, "-q", "--format", "jsonl")
    result = specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", prompts, "--batch-size", "auto",
                     "-v", "--format", "jsonl")
    assert result.code == 0, result.stderr
    lines = auto_lines(result.stderr)
    assert lines["batch_size"] == "2"
    assert lines["batch_auto"].startswith("batch 2, target-only (bench's measurements, target + draft on ")
    assert lines["batch_auto"].endswith("; speculation does not pay at batch 2: target-only was measured faster"
                                        "; memory not capped on cpu")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(r["stats"]["drafted"] == 0 for r in records)  # target-only: no draft ran
    assert [r["token_ids"] for r in records] == [json.loads(line)["token_ids"] for line in alone.stdout.splitlines()]
    # a prompts file of one line stays batch 1
    one = prompts.parent / "one.jsonl"
    one.write_text(json.dumps(GREEDY[0]) + "\n")
    single = specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", one, "--batch-size", "auto", "-v",
                     "--format", "jsonl")
    assert auto_lines(single.stderr) == {"batch_size": "1", "batch_auto": "a single prompt: batch 1"}


def test_bench_then_auto_takes_the_measured_choice(monkeypatch, measured_profile):
    """`bench --batch-size 1,2` keeps its rows; `generate --batch-size auto -v` then runs what
    core/batch_cost.py chooses from them (which one follows this machine's timings)."""
    from specgen.core import batch_cost, measured
    from specgen.core.tree_cost import regime

    profile, prompts, folder = measured_profile
    bench = specgen(monkeypatch, "bench", "-p", profile, "--prompts-file", prompts, "--batch-size", "1,2",
                    "--k", "2", "--max-tokens", "4", "--warmup", "0", "--format", "json", "-q")
    assert bench.code == 0, bench.stderr
    document = json.loads(bench.stdout)
    assert document["measured"]["rows"] == 4 and document["measured"]["path"].startswith(folder)
    (rows,) = measured.load_batches(folder).values()
    assert sorted((r["batch_size"], r["k"]) for r in rows) == [(1, 0), (1, 2), (2, 0), (2, 2)]
    expected = batch_cost.choose(regime(rows, 0.0, "rejection"), "draft", len(GREEDY), None)
    result = specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", prompts, "--batch-size", "auto",
                     "-v", "--format", "jsonl")
    assert result.code == 0, result.stderr
    lines = auto_lines(result.stderr)
    assert lines["batch_size"] == str(expected.batch) and expected.measured
    what = f"k={expected.k}" if expected.speculate else "target-only"
    assert lines["batch_auto"].startswith(f"batch {expected.batch}, {what}")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == len(GREEDY)
    assert all((r["stats"]["drafted"] > 0) == expected.speculate for r in records)


def test_jsonl_logprobs_equal_one_prompt_at_a_time(monkeypatch, tiny):
    """--logprobs 3 (warped and raw): the records at --batch-size 3 are --batch-size 2's and one
    prompt at a time's (the single decode loop's): the same tokens, alternatives and texts. On the
    CPU the values lie a few ulps apart (a reference step's matrix products, prompts prefilled
    together included, depend on their row count); on a GPU's kernels none:
    tests/gpu/test_batch_gpu.py and tests/gpu/test_batch_prefill_gpu.py."""
    for mode in ("warped", "raw"):
        def run(*args):
            result = generate(monkeypatch, tiny, "--format", "jsonl", "--logprobs", "3", "--logprobs-mode", mode, *args)
            assert result.code == 0, result
            return [(r["token_ids"], r["logprobs"]) for r in map(json.loads, result.stdout.splitlines())]

        three = run("--batch-size", "3")
        assert all(len(logprobs) == len(ids) and all(len(e["top_logprobs"]) <= 3 for e in logprobs)
                   for ids, logprobs in three)
        close(three, run("--batch-size", "2"))
        close(three, run())


def close(got, want, where="") -> None:
    """The same records (tokens, ids, texts, alternatives), each logprob within 1e-4."""
    if isinstance(got, (list, tuple)):
        assert isinstance(want, (list, tuple)) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            close(a, b, f"{where}[{i}]")
    elif isinstance(got, dict):
        assert got.keys() == want.keys(), where
        for key in got:
            close(got[key], want[key], f"{where}.{key}")
    elif isinstance(got, float):
        assert abs(got - want) <= 1e-4, (where, got, want)
    else:
        assert got == want, (where, got, want)


@pytest.mark.parametrize("args, fragment", [
    (["--batch-size", "0"], "--batch-size 0 is not allowed: must be auto or from 1 to 256"),
    (["--batch-size", "2", "--draft-p-min", "0.5", "--tree-width", "2", "--tree-nodes", "4"],
     "token trees (tree_width 2) do not take draft_p_min yet"),
])
def test_what_batches_do_not_take_is_a_usage_error(monkeypatch, tiny, args, fragment):
    assert_error(generate(monkeypatch, tiny, *args), 2, fragment)
