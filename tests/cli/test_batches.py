"""`generate --prompts-file --batch-size B`: the same records and text as one prompt at a time, in
the file's order; what batches do not take yet is a one-line usage error."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_error, specgen
from tiny_models import build_pair, write_profile

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


def test_auto_says_it_resolves_to_one(monkeypatch, tiny):
    profile, prompts = tiny
    result = specgen(monkeypatch, "generate", "-p", profile, "--prompts-file", prompts, "--batch-size", "auto",
                     "--format", "jsonl")
    assert result.code == 0 and "batch_size auto resolves to 1" in result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--batch-size", "0"], "--batch-size 0 is not allowed: must be auto or from 1 to 256"),
    (["--batch-size", "2", "--proposer", "ngram"], "batches (batch_size 2) are drafted by the draft model only"),
    (["--batch-size", "2", "--format", "jsonl", "--logprobs", "1"], "do not take logprobs yet"),
])
def test_what_batches_do_not_take_is_a_usage_error(monkeypatch, tiny, args, fragment):
    assert_error(generate(monkeypatch, tiny, *args), 2, fragment)
