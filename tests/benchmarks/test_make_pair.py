"""benchmarks/make_pair.py at its micro size on the CPU, and the shipped demo pair on disk.

The micro run trains for ~30 steps on a sliver of this machine's standard library: the numbers it
reaches mean nothing, but every stage (corpus, held-out split, tokenizer, both models, saving,
prompts, profile, report) runs the same code as the GPU presets.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from repo_paths import REPO, script

SCRIPT = REPO / "benchmarks" / "make_pair.py"
DEMO = REPO / "src" / "specgen" / "builtin" / "demo"
REPORT_KEYS = {
    "preset", "seed", "command", "python", "device", "corpus", "vocab", "target", "draft",
    "steps", "tokens_seen", "train_seconds", "train_loss", "heldout_loss", "greedy_agreement",
    "generated_agreement", "prompts", "wall_seconds", "polish",
}


def load_make_pair():
    return script(SCRIPT)


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pair")
    # One thread: the micro models are too small for a second one to help, and on a busy
    # 2-core machine OpenMP barriers make two threads several times slower.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(SCRIPT), "--preset", "micro", "--out", str(out),
               "--seed", "0", "--device", "cpu"]
    subprocess.run(command, check=True, env=env, cwd=REPO, capture_output=True, timeout=300)
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
    micro_preset = make_pair.PRESETS["micro"]
    assert report["steps"] == micro_preset.steps
    polish_steps = round(micro_preset.polish * micro_preset.steps)
    assert polish_steps > 0  # so that this run goes through the polish phase
    assert report["polish"]["fraction"] == micro_preset.polish
    assert report["polish"]["steps"] == polish_steps
    assert report["polish"]["after_step"] == micro_preset.steps - polish_steps
    log = (micro / "train.log").read_text()
    assert f"polish step {polish_steps}/{polish_steps}" in log
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


def test_polish_trains_the_draft_alone(tmp_path):
    """Steps S with the last P polishing: the target ends exactly as after S - P joint steps
    (the polish never touches it, and the joint schedule ends where the polish begins), while
    the draft moves on."""
    from types import SimpleNamespace

    make_pair = load_make_pair()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        preset = make_pair.PRESETS["micro"]
        stream = np.random.default_rng(0).integers(1, preset.vocab, 40_000).astype(np.int32)
        runs = {}
        for steps, polish in ((10, 0.3), (7, 0.0)):
            run = dataclasses.replace(preset, polish=polish)
            pair = [make_pair.build_model(arch, run, 0, i)
                    for i, arch in enumerate((run.target, run.draft))]
            batches = make_pair.Batches(stream, run.seq_len, run.batch, 0, torch.device("cpu"))
            log = make_pair.Log(tmp_path / f"train-{polish}.log")
            args = SimpleNamespace(steps=steps, minutes=5.0)
            runs[polish] = pair, make_pair.train(pair, batches, stream, run, args, log)
    finally:
        torch.set_num_threads(threads)

    (target, draft), report = runs[0.3]
    (target_joint, draft_joint), report_joint = runs[0.0]
    assert report["steps"] == 10 and report_joint["steps"] == 7
    assert report["polish"] | {"seconds": 0} == {
        "fraction": 0.3, "after_step": 7, "steps": 3, "planned_steps": 3, "seconds": 0,
        "train_kl": report["polish"]["train_kl"],
        "train_loss_draft": report["polish"]["train_loss_draft"]}
    assert report["polish"]["train_kl"] > 0
    assert report_joint["polish"]["steps"] == 0
    assert report["train_loss"] == report_joint["train_loss"]  # the joint phases are the same
    for mine, joint_only in zip(target.state_dict().values(), target_joint.state_dict().values()):
        assert torch.equal(mine, joint_only)
    assert all(p.requires_grad for p in target.parameters())
    assert not all(torch.equal(a, b) for a, b in
                   zip(draft.state_dict().values(), draft_joint.state_dict().values()))
    text = (tmp_path / "train-0.3.log").read_text()
    assert "polish: target frozen after step 7" in text and "polish step 3/3" in text
