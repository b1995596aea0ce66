"""benchmarks/make_pair.py at its micro size on the CPU, and the shipped demo pair on disk.

The micro run trains for ~30 steps on a sliver of this machine's standard library: the numbers it
reaches mean nothing, but every stage (corpus, held-out split, tokenizer, both models, saving,
prompts, profile, report) runs the same code as the GPU presets.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "make_pair.py"
DEMO = ROOT / "src" / "specgen" / "builtin" / "demo"
REPORT_KEYS = {
    "preset", "seed", "command", "python", "device", "corpus", "vocab", "target", "draft",
    "steps", "tokens_seen", "train_seconds", "train_loss", "heldout_loss", "greedy_agreement",
    "generated_agreement", "prompts", "wall_seconds",
}


def load_make_pair():
    spec = importlib.util.spec_from_file_location("make_pair", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_pair"] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pair")
    # One thread: the micro models are too small for a second one to help, and on a busy
    # 2-core machine OpenMP barriers make two threads several times slower.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(SCRIPT), "--preset", "micro", "--out", str(out),
               "--seed", "0", "--device", "cpu"]
    subprocess.run(command, check=True, env=env, cwd=ROOT, capture_output=True, timeout=300)
    return out


def test_heldout_split_is_a_fixed_function_of_the_path():
    make_pair = load_make_pair()
    # Pinned: sha1("test/test_uuid.py") % 25 == 0, sha1("json/__init__.py") % 25 == 11.
    assert make_pair.is_held_out("test/test_uuid.py", 25)
    assert not make_pair.is_held_out("json/__init__.py", 25)
    files = make_pair.list_files(make_pair.corpus_roots(False, None))
    train, held = make_pair.split(files, 25)
    again = make_pair.list_files(make_pair.corpus_roots(False, None))
    again_train, again_held = make_pair.split(again, 25)
    assert [f.rel for f in held] == [f.rel for f in again_held]
    assert [f.rel for f in train] == [f.rel for f in again_train]
    assert len(train) + len(held) == len(files)
    assert 0.02 < len(held) / len(files) < 0.06


def test_micro_pair_loads_as_ordinary_checkpoints(micro):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(micro / "target")
    assert tokenizer.eos_token == "<|endoftext|>"
    text = SCRIPT.read_text()
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level: lossless
    ids = tokenizer("def add(a, b):", return_tensors="pt")["input_ids"]
    for name in ("target", "draft"):
        model = AutoModelForCausalLM.from_pretrained(micro / name, dtype=torch.float32)
        assert model.config.eos_token_id == tokenizer.eos_token_id
        assert model.generation_config.eos_token_id == tokenizer.eos_token_id
        assert model.config.vocab_size == len(tokenizer)
        assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))
        draft_tokenizer = AutoTokenizer.from_pretrained(micro / name)
        assert draft_tokenizer.get_vocab() == tokenizer.get_vocab()


def test_micro_pair_prompts_report_and_profile(micro):
    make_pair = load_make_pair()
    prompts = [json.loads(line) for line in (micro / "prompts.jsonl").read_text().splitlines()]
    assert 1 <= len(prompts) <= make_pair.PRESETS["micro"].max_prompts
    for prompt in prompts:
        assert prompt["source"].startswith("stdlib/") and prompt["prompt"]
        assert make_pair.is_held_out(prompt["source"].removeprefix("stdlib/"), 100)

    report = json.loads((micro / "report.json").read_text())
    assert REPORT_KEYS <= report.keys()
    assert report["steps"] == make_pair.PRESETS["micro"].steps
    assert report["prompts"] == len(prompts)
    assert 0.0 <= report["greedy_agreement"] <= 1.0
    assert report["target"]["params"] > report["draft"]["params"]

    from specgen.core.profile import load_profile

    profile = load_profile(str(micro / "pair.toml"))
    assert Path(profile.target.path) == micro / "target"
    assert Path(profile.draft.path) == micro / "draft"


def test_shipped_demo_pair_fits_and_loads():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    size = sum(path.stat().st_size for path in DEMO.rglob("*") if path.is_file())
    assert size <= 25_000_000
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "target")
    for name in ("target", "draft"):
        model = AutoModelForCausalLM.from_pretrained(DEMO / name, dtype=torch.float32)
        assert model.config.vocab_size == len(tokenizer)
        assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    prompts = (DEMO / "prompts.jsonl").read_text().splitlines()
    assert len(prompts) >= 20
    report = json.loads((DEMO / "report.json").read_text())
    assert report["preset"] == "demo" and report["prompts"] == len(prompts)
