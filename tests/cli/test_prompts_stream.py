"""`generate --prompts-file`: the file is read as the loop takes its prompts, never held whole; a bad
line stops the run before anything generates (every line is checked first), and a line that turns
bad while the run reads the file again stops it after the results before it were written."""

from __future__ import annotations

import json

import pytest

from cli_helpers import specgen
from tiny_models import build_pair, write_profile

BATCH = 4


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompts_stream")
    return write_profile(root / "tiny.toml", *build_pair(root, noisy=0.1), sampling={"max_tokens": 3, "ignore_eos": True})


def write(path, prompts: list[str]) -> None:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")


def prompts(count: int) -> list[str]:
    return [f"{i}: " + ("def f(x):" if i % 3 else "import os\nx = 'ü✓'") for i in range(count)]


@pytest.mark.slow
def test_many_prompts_stream_in_order_reading_the_file_only_as_far_as_the_batch_needs(monkeypatch, profile,
                                                                                         tmp_path):
    from specgen.core.batch_decode import WAITING, BatchDecoder

    texts = prompts(300)
    path = tmp_path / "many.jsonl"
    write(path, texts)
    ahead = []  # at each result: prompts the loop had read past those already written
    run = BatchDecoder.run

    def counted(self, jobs):
        taken = [0]

        def counting():
            for job in jobs:
                taken[0] += 1
                yield job

        for written, (index, finished) in enumerate(run(self, counting())):
            ahead.append(taken[0] - written)
            yield index, finished

    monkeypatch.setattr(BatchDecoder, "run", counted)
    result = specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", path, "-q", "--format", "jsonl",
                     "--batch-size", str(BATCH))
    assert result.code == 0, result
    records = result.json_lines()
    assert [r["prompt"] for r in records] == texts
    assert all(r["finish_reason"] == "length" and len(r["token_ids"]) == 3 for r in records)
    assert len(ahead) == 300 and max(ahead) <= BATCH + WAITING * BATCH + 1


def test_a_bad_line_late_in_the_file_stops_the_run_before_any_output(monkeypatch, profile, tmp_path):
    path = tmp_path / "bad.jsonl"
    write(path, prompts(40))
    with path.open("a", encoding="utf-8") as file:
        file.write('{"prompt": "x", "temperature": "hot"}\n')
    result = specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", path, "-q", "--format", "jsonl",
                     "--batch-size", str(BATCH))
    assert (result.code, result.stdout) == (2, "")
    assert result.stderr.startswith(f"specgen: error: {path}:41: ")


@pytest.mark.parametrize("batch", ["1", str(BATCH)])
def test_a_line_changed_while_the_run_reads_the_file_keeps_the_results_before_it(monkeypatch, profile, tmp_path,
                                                                                   batch):
    """The file is checked whole, then read again as the prompts run: a line that changed in between
    is reported with its number (exit 2) after every result before it was written."""
    from specgen.cli import generate

    path = tmp_path / "changing.jsonl"
    texts = prompts(12)
    write(path, texts)
    fit = generate.fit

    def then_spoiled(*args):
        checked = fit(*args)
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        lines[9] = "{not json\n"
        path.write_text("".join(lines), encoding="utf-8")
        return checked

    monkeypatch.setattr(generate, "fit", then_spoiled)
    result = specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", path, "-q", "--format", "jsonl",
                     "--batch-size", batch)
    assert result.code == 2 and result.stderr.startswith(f"specgen: error: {path}:10: invalid JSON")
    assert [r["prompt"] for r in result.json_lines()] == texts[:9]
