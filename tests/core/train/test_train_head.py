"""`specgen train-head` (core/train/train_head.py, cli/train_head.py): hidden states from hooks, the
training-time-test unroll against the head's own cached drafting, the simulated acceptance, the
output folder, and the command's errors."""

from __future__ import annotations

import errno
import json
import math
import os
import time
from pathlib import Path

import pytest
import tomllib
import torch
from cli_helpers import assert_error, specgen
from tiny_models import CORPUS, build_head, build_pair, tiny_head_config, write_profile

from specgen.core.train import head_data as hd
from specgen.core.drafters import head_folder
from specgen.core.train import train_head as th
from specgen.core.drafters.head_folder import FILES
from specgen.core.step.model import OwnedModel
from specgen.core.train.train_plan import TrainPlan


def plan(**changes) -> TrainPlan:
    fields = dict(minutes=5.0, steps=0, batch_size=2, seq_len=32, lr=1e-3, warmup_steps=50, ttt_steps=3, layers=None,
                  draft_vocab=None, seed=0, regenerate=False, init_from_target=True, eval_prompts=2)
    return TrainPlan(**{**fields, **changes})


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, draft = build_pair(tmp_path_factory.mktemp("pair"))
    return target, draft


def load_target(folder: Path, modeling: str):
    from specgen.core.models import loading as models
    from specgen.core.settings import ModelSpec

    model = models.load_model(ModelSpec(path=str(folder), device="cpu", dtype="float32"), modeling=modeling)
    return model.requires_grad_(False)


# ---------------------------------------------------------------- hooks


@pytest.mark.parametrize("modeling", ["transformers", "auto"])
def test_hooks_capture_exactly_the_hidden_states_entering_each_layer(pair, modeling):
    """`aux_layer_ids` id i is transformers' output_hidden_states[i]: bit-equal on transformers'
    model, equal to float32 rounding on specgen's own model step (core/step/, "auto")."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()
    model = load_target(pair[0], modeling)
    assert isinstance(model, OwnedModel) == (modeling == "auto")
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(0))
    capture = th.AuxCapture(model, (0, 1, 1))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
        expected = reference(input_ids=ids, output_hidden_states=True).hidden_states
    capture.remove()
    for i in (0, 1):
        if modeling == "transformers":
            assert torch.equal(capture.states[i], expected[i])
        else:
            torch.testing.assert_close(capture.states[i], expected[i], rtol=1e-5, atol=1e-5)
    assert torch.equal(capture.aux(), torch.cat([capture.states[0], capture.states[1], capture.states[1]], -1))
    with torch.no_grad():
        model(input_ids=ids[:, :3], use_cache=False)
    assert capture.states[0].shape[1] == 11  # removed: the hooks no longer run


# ---------------------------------------------------------------- TTT against inference


def drafted_by_the_cache(head, ids, aux, start: int, steps: int) -> list[torch.Tensor]:
    """Inference's drafting, through Eagle3Head's cached forward: the target rows 0..start, then
    `steps - 1` steps on the head's own hidden states, each at the next position (the ids are the
    sequence's, as the unroll's are)."""
    head.reserve(ids.shape[0] + steps)
    logits, out = head(ids[1:start + 2], aux[:start + 1])
    rows = [logits[-1]]
    for s in range(1, steps):
        position = torch.tensor([start + s])
        logits, out = head(ids[start + 1 + s:start + 2 + s], out[-1:], position)
        rows.append(logits[-1])
    return rows


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_ttt_unroll_gives_the_logits_of_cached_drafting(norm_before_residual):
    """Step s of the chain at row c equals the head's cached forward drafting step s from target
    row c: the same mask (target rows <= c, the chain's own rows), positions and features."""
    config = tiny_head_config(norm_before_residual=norm_before_residual)
    head = build_head(config, seed=3).eval()
    t, steps = 12, 4
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, config.target_vocab_size, (2, t), generator=generator)
    aux = torch.randn(2, t, 3 * config.target_hidden_size, generator=generator)
    with torch.no_grad():
        unrolled = th.unroll(head, ids, aux, steps)  # steps x [B, T, Vd]
        for b in range(2):
            for start in range(t - steps):
                for s, row in enumerate(drafted_by_the_cache(head, ids[b], aux[b], start, steps)):
                    torch.testing.assert_close(unrolled[s][b, start], row, rtol=1e-5, atol=1e-5)


def test_ttt_step_does_not_see_other_chains_or_the_future():
    """Changing the id of a row the chain's step s must not see leaves its logits unchanged, and
    changing one it sees changes them: the mask is neither too wide nor too narrow."""
    config = tiny_head_config()
    head = build_head(config, seed=4).eval()
    generator = torch.Generator().manual_seed(6)
    ids = torch.randint(0, config.target_vocab_size, (1, 10), generator=generator)
    aux = torch.randn(1, 10, 3 * config.target_hidden_size, generator=generator)
    other = ids.clone()
    other[0, 7] = (other[0, 7] + 1) % config.target_vocab_size  # the id row 6 embeds at step 0
    with torch.no_grad():
        before, after = th.unroll(head, ids, aux, 3), th.unroll(head, other, aux, 3)
    # chain 3, step 2 sits at position 5 and embeds id 6: it sees target rows <= 3 and its own rows
    assert torch.equal(before[2][0, 3], after[2][0, 3])
    # chain 5, step 1 embeds id 7 itself; chain 6, step 0 too; chain 7, step 0 sees row 6
    assert not torch.equal(before[1][0, 5], after[1][0, 5])
    assert not torch.equal(before[0][0, 7], after[0][0, 7])


# ---------------------------------------------------------------- simulated acceptance


def test_acceptance_lengths_on_a_hand_built_case():
    """1 + sum over j <= k of prod over i <= j of match_i, averaged over the chains."""
    matches = torch.tensor([[1, 1, 0, 1],   # 1 + 1 + 1 + 0 + 0
                            [0, 1, 1, 1],   # 1 + 0 ...
                            [1, 1, 1, 1],   # 1 + 1 + 1 + 1 + 1
                            [1, 0, 1, 1]],  # 1 + 1 + 0 ...
                           dtype=torch.bool)
    lengths = th.acceptance_lengths(matches).tolist()
    assert lengths == pytest.approx([1 + 3 / 4, 1 + 5 / 4, 1 + 6 / 4, 1 + 7 / 4])


def test_a_draft_that_is_the_target_is_accepted_at_every_step(pair):
    """The simulation's indices line up: the target as its own draft model gets k + 1 at every k."""
    target = load_target(pair[0], "auto")
    prompts = torch.randint(0, 300, (2, th.EVAL_PROMPT_TOKENS), generator=torch.Generator().manual_seed(1))
    capture = th.AuxCapture(target, (0, 1, 1))
    ids = th.continue_greedily(target, prompts, 20)
    evalset = th.EvalSet(th.run_target(target, capture, ids, torch.arange(target.config.vocab_size)),
                         th.EVAL_PROMPT_TOKENS)
    capture.remove()
    assert th.model_acceptance(target, evalset) == pytest.approx([k + 1 for k in range(1, th.EVAL_K + 1)])


def test_the_head_simulation_counts_what_cached_drafting_would_accept():
    """head_acceptance against a count made with Eagle3Head's cached drafting (greedy, each step
    fed the previous step's guess) on a sequence whose tokens are the 'target's choices'."""
    config = tiny_head_config(draft_vocab_size=40)
    head = build_head(config, seed=7).eval()
    head.identity_vocab()
    generator = torch.Generator().manual_seed(8)
    length, prompt = 30, 6
    aux = torch.randn(1, length, 3 * config.target_hidden_size, generator=generator)
    # make the head right most of the time: the sequence follows its own step-0 guesses, with a few changed
    ids = torch.randint(0, 40, (1, length), generator=generator)
    with torch.no_grad():
        for c in range(length - 2):
            ids[0, c + 2] = th.unroll(head, ids, aux, 1)[0][0, c].argmax()
        ids[0, [12, 19]] = (ids[0, [12, 19]] + 1) % 40
        choice = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # position t's choice is x[t+1]
        batch = th.TargetBatch(ids, aux, torch.zeros(1, length, 40), choice)
        evalset = th.EvalSet(batch, prompt)
        simulated = th.head_acceptance(head, evalset, torch.autocast("cpu", enabled=False))
        totals = [0.0] * th.EVAL_K
        for c in evalset.starts:
            accepted, feed = 0, ids[0].clone()
            for s, row in enumerate(drafted_by_the_cache(head, feed, aux[0], c, th.EVAL_K)):
                if row.argmax() != ids[0, c + 2 + s]:
                    break
                accepted += 1
            for k in range(th.EVAL_K):
                totals[k] += 1 + min(accepted, k + 1)
    assert simulated == pytest.approx([total / len(evalset.starts) for total in totals])
    assert 1.5 < simulated[-1] < th.EVAL_K + 1  # neither all rejected nor all accepted


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("modeling", ["transformers", "auto"])
def test_a_few_steps_lower_the_loss(pair, modeling):
    """A tiny random Llama target, through transformers and through core/step/: the TTT loss
    on a fixed batch falls over a few steps."""
    target = load_target(pair[0], modeling)
    from specgen.core.models.loading import load_tokenizer
    from specgen.core.settings import ModelSpec

    tokenizer = load_tokenizer(ModelSpec(path=str(pair[0])))
    texts = CORPUS * 4
    draft_ids = hd.draft_vocabulary(tokenizer, texts, tokenizer.eos_token_id, 200, target.config.vocab_size)
    assert len(draft_ids) == 200 and torch.equal(draft_ids, draft_ids.sort().values)
    layers = plan().resolved_layers(target.config.num_hidden_layers)
    assert layers == (0, 1, 1)  # two layers: EAGLE-3's default made valid
    head = th.build_head(target, layers, draft_ids, True, 0, torch.device("cpu"))
    capture = th.AuxCapture(target, layers)
    windows = hd.Windows(tokenizer, texts, tokenizer.eos_token_id, 32, 4, 0)
    batch = th.run_target(target, capture, windows.next(), draft_ids)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss = th.ttt_loss(head, batch, 3)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    capture.remove()
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("modeling", ["transformers", "auto"])
def test_greedy_continuation_is_transformers_generate(pair, modeling):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()
    prompts = torch.randint(1, 300, (3, 7), generator=torch.Generator().manual_seed(2))
    expected = reference.generate(prompts, max_new_tokens=9, do_sample=False, min_new_tokens=9,
                                  attention_mask=torch.ones_like(prompts))
    assert torch.equal(th.continue_greedily(load_target(pair[0], modeling), prompts, 9), expected)


def test_regenerated_batches_keep_the_datas_first_quarter(pair, profile_file, corpus_file):
    from specgen.core.models.loading import load_tokenizer
    from specgen.core.settings import ModelSpec

    target = load_target(pair[0], "auto")
    tokenizer = load_tokenizer(ModelSpec(path=str(pair[0])))
    texts = CORPUS * 20
    layers, draft_ids = (0, 1, 1), torch.arange(target.config.vocab_size)
    head = th.build_head(target, layers, draft_ids, True, 0, torch.device("cpu"))
    windows = hd.Windows(tokenizer, texts, tokenizer.eos_token_id, 32, 2, seed=1)
    data = hd.Windows(tokenizer, texts, tokenizer.eos_token_id, 32, 2, seed=1)
    trainer = th.Trainer(target, head, plan(regenerate=True), windows, None, th.AuxCapture(target, layers),
                         torch.device("cpu"))
    batches = [trainer.regenerated_batch() for _ in range(th.REGEN_POOL)]
    assert trainer.regenerated == th.REGEN_POOL * 2 * 24  # 8 of each 32 tokens are the data's
    for batch in batches:
        assert torch.equal(batch[:, :8], data.next()[:, :8]) and batch.shape == (2, 32)
    trainer.capture.remove()


def test_draft_vocabulary_takes_the_most_frequent_ids():
    class Tok:  # a list of texts in, a list of id lists out, as transformers' tokenizers answer
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[int(c) for c in text] for text in texts]}

    ids = hd.draft_vocabulary(Tok(), ["1112223", "22"], eos_id=9, size=3, vocab=10)
    assert ids.tolist() == [1, 2, 9]  # 2 (x5), 1 (x3), 9 (EOS, x2) before 3 (x1)
    assert hd.draft_vocabulary(Tok(), ["1"], eos_id=9, size=10, vocab=10).tolist() == list(range(10))


def test_the_stream_is_the_documents_tokens_with_eos_between(pair):
    """encode() hands the tokenizer lists; specgen's PlainTokenizer encodes a list as transformers'
    tokenizer does, and as it encodes each text alone."""
    from transformers import AutoTokenizer

    from specgen.core.models.loading import load_tokenizer
    from specgen.core.settings import ModelSpec
    from specgen.core.models.tokenizer import PlainTokenizer

    plain = load_tokenizer(ModelSpec(path=str(pair[0])))
    assert isinstance(plain, PlainTokenizer)
    reference = AutoTokenizer.from_pretrained(pair[0])
    texts = CORPUS * 3
    expected = reference(texts, add_special_tokens=False)["input_ids"]
    assert plain(texts, add_special_tokens=False)["input_ids"] == expected
    stream = hd.encode(plain, texts, eos_id=0, group=2)
    expected = [i for text in texts for i in plain(text, add_special_tokens=False)["input_ids"] + [0]]
    assert stream.tolist() == expected


def test_windows_are_pieces_of_the_packed_stream_in_a_shuffled_order():
    class Tok:
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[int(c) for c in text] for text in texts]}

    texts = ["1" * 40, "2" * 40, "3" * 40, "4" * 40]
    windows = hd.Windows(Tok(), texts, eos_id=0, seq_len=5, batch=4, seed=0, pool=4)
    rows = [row for _ in range(6) for row in windows.next().tolist()]
    # pieces of the documents packed with EOS (0) between them: a document changes only at an EOS
    assert all(a == b or 0 in (a, b) for row in rows for a, b in zip(row, row[1:]))
    first = [row[0] for row in rows[:8]]
    assert first != sorted(first) and len(set(first)) > 1  # not one file's consecutive pieces


def test_batch_and_sequence_defaults_follow_the_device_and_the_context():
    auto = plan(batch_size=None, seq_len=None)
    assert (auto.for_device(True, 2048).batch_size, auto.for_device(True, 2048).seq_len) == (16, 1024)
    assert (auto.for_device(False, 2048).batch_size, auto.for_device(False, 2048).seq_len) == (4, 256)
    assert auto.for_device(True, 512).seq_len == 512 and auto.for_device(True, None).seq_len == 1024
    assert plan(batch_size=3, seq_len=40).for_device(True, 512).batch_size == 3


def test_default_layers_are_eagle3s_where_they_fit():
    assert plan().resolved_layers(32) == (2, 16, 29)
    assert plan().resolved_layers(12) == (2, 6, 9)
    assert plan().resolved_layers(6) == (0, 3, 5)
    assert plan().resolved_layers(1) == (0, 0, 0)
    assert plan(layers=(1, 2, 3)).resolved_layers(32) == (1, 2, 3)


# ---------------------------------------------------------------- the schedule, divergence, time left


def test_warmup_is_a_number_of_steps_not_a_share_of_the_run():
    """A run of a few slow steps (a time budget 20% spent at step 2) still warms up: step 1 runs
    at 2/50 of the peak, not at the peak as a warmup of 5% of the run had it."""
    assert th.lr_factor(1, 0.2, warmup_steps=50) == pytest.approx(2 / 50 * (0.1 + 0.45 * (1 + math.cos(0.2 * math.pi))))
    assert [th.lr_factor(s, 0.0, warmup_steps=4) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert th.lr_factor(500, 1.0, warmup_steps=50) == pytest.approx(0.1)  # cosine down to 10%
    assert th.lr_factor(0, 0.5, warmup_steps=0) == pytest.approx(0.55)  # no warmup


def test_a_diverging_loss_halves_the_rate_then_stops():
    watch = th.Divergence(ratio=2.0, cooldown=3, max_drops=2)
    assert all(watch.observe(step, loss) for step, loss in [(1, 18.5), (2, 12.0), (3, 20.0)])
    assert watch.scale == 1.0 and not watch.drops  # under twice the lowest: noise, not divergence
    assert watch.observe(4, 35.0) and watch.scale == 0.5
    assert watch.observe(5, 40.0) and watch.scale == 0.5  # the lower rate gets `cooldown` steps
    assert watch.observe(7, 30.0) and watch.scale == 0.25
    assert not watch.observe(10, 26.0) and "after 2 halvings" in watch.stopped
    assert watch.as_dict(1e-3) == {"lr_drops": [{"step": 4, "loss": 35.0, "lowest": 12.0, "lr": 5e-4},
                                                {"step": 7, "loss": 30.0, "lowest": 12.0, "lr": 2.5e-4}],
                                   "stopped": watch.stopped}
    nan = th.Divergence()
    assert nan.observe(1, 3.0) and not nan.observe(2, math.nan) and nan.stopped == "the loss became nan at step 2"


def test_a_nan_loss_stops_training_with_the_weights_of_before(pair, corpus_file, monkeypatch):
    """A step whose loss and gradient are NaN moves no weight, and the loop stops at its read."""
    from specgen.core.models.loading import load_tokenizer
    from specgen.core.settings import ModelSpec

    target = load_target(pair[0], "auto")
    tokenizer = load_tokenizer(ModelSpec(path=str(pair[0])))
    layers, draft_ids = (0, 1, 1), torch.arange(target.config.vocab_size)
    head = th.build_head(target, layers, draft_ids, True, 0, torch.device("cpu"))
    windows = hd.Windows(tokenizer, CORPUS * 20, tokenizer.eos_token_id, 32, 2, seed=1)
    trainer = th.Trainer(target, head, plan(steps=3), windows, None, th.AuxCapture(target, layers),
                         torch.device("cpu"))
    monkeypatch.setattr(th.Trainer, "evaluate", lambda self: [1.0] * 8)
    monkeypatch.setattr(th, "ttt_loss", lambda head, batch, steps: head.fc.weight.sum() * math.nan)
    before = {name: p.clone() for name, p in head.named_parameters()}
    outcome = trainer.run(time.perf_counter() + 60, lambda progress: None)
    trainer.capture.remove()
    assert outcome.steps == 1 and outcome.divergence.stopped == "the loss became nan at step 1"
    assert outcome.losses == []  # report.json's curve holds numbers only
    assert all(torch.equal(p, before[name]) for name, p in head.named_parameters())


def test_time_left_comes_from_measured_steps():
    assert th.remaining_seconds(step=0, steps=10, elapsed=5.0, budget=600.0) is None  # nothing measured yet
    assert th.remaining_seconds(step=2, steps=10, elapsed=94.0, budget=600.0) == pytest.approx(8 * 47.0)
    assert th.remaining_seconds(step=2, steps=100, elapsed=94.0, budget=600.0) == pytest.approx(506.0)  # the cap
    assert th.remaining_seconds(step=0, steps=0, elapsed=30.0, budget=600.0) == 570.0  # a time budget
    from specgen.cli.train_head import time_left

    assert time_left(None) == "estimating the time left" and time_left(3725.4) == "~1:02:05 left"


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text("".join(CORPUS) * 30)
    return path


@pytest.fixture(scope="module")
def profile_file(pair, tmp_path_factory) -> Path:
    return write_profile(tmp_path_factory.mktemp("profile") / "pair.toml", *pair, sampling={"max_tokens": 16})


FAST = ("--steps", "2", "--seq-len", "32", "--batch-size", "2", "--eval-prompts", "2")


@pytest.fixture(scope="module")
def trained(pair, profile_file, corpus_file, tmp_path_factory):
    """One run of the command on the tiny pair, shared by the tests that read its output."""
    monkeypatch = pytest.MonkeyPatch()
    out = tmp_path_factory.mktemp("run") / "heads" / "demo"  # a missing parent is created, as mkdir -p does
    result = specgen(monkeypatch, "train-head", "-p", profile_file, "--out", out, "--data", corpus_file, *FAST,
                     "--draft-vocab", "100", "--format", "json")
    monkeypatch.undo()
    return out, result


def test_the_command_writes_a_head_that_loads_back(pair, trained):
    from specgen.core.drafters.head_formats import load_head

    out, result = trained
    assert result.code == 0, result
    report = json.loads(result.stdout)
    assert report == json.loads((out / "report.json").read_text())
    assert report["complete"] and report["steps"] == 2 and report["aux_layer_ids"] == [0, 1, 1]
    assert set(report["simulated_acceptance"]) == {str(k) for k in range(1, 9)}
    assert all(1 <= v <= k + 1 for k, v in zip(range(1, 9), report["simulated_acceptance"].values()))
    assert report["plan"]["warmup_steps"] == 50 and report["divergence"] == {"lr_drops": [], "stopped": None}
    assert "draft_model_simulated_acceptance" in report and report["loss"]["first"] > 0
    assert report["command"] is None or report["command"].startswith("specgen train-head")
    target = load_target(pair[0], "auto")
    head = load_head(out, embedding=target.model.embed_tokens.weight)
    assert head.config.draft_vocab_size == 100 and head.config.aux_layer_ids == (0, 1, 1)
    assert int(head.t2d.sum()) == 100
    assert result.stderr.startswith("trained 2 steps") and len(result.stderr.splitlines()) == 1
    mask = os.umask(0)
    os.umask(mask)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == dict.fromkeys(FILES, 0o666 & ~mask)


def test_the_ready_profile_names_the_target_the_draft_and_the_head(pair, trained, profile_file):
    import dataclasses

    from specgen.core.profile import load_profile
    from specgen.core.settings import ProposerSpec

    out, _ = trained
    text = (out / "profile.toml").read_text()
    data = tomllib.loads(text)
    assert data["proposer"] == {"kind": "eagle", "head": "."}
    assert (out / data["target"]["path"]).resolve() == pair[0].resolve()
    assert (out / data["draft"]["path"]).resolve() == pair[1].resolve()
    assert data["sampling"]["max_tokens"] == 16 and data["runtime"]["threads"] == 1  # the source's settings
    if "head" in {f.name for f in dataclasses.fields(ProposerSpec)}:  # once the eagle proposer exists
        profile = load_profile(str(out / "profile.toml"))
        assert profile.proposer.kind == "eagle" and Path(profile.target.path) == pair[0]


def test_quiet_and_a_terminal(pair, profile_file, corpus_file, tmp_path, monkeypatch):
    quiet = specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "q", "--data", corpus_file,
                    *FAST, "--steps", "1", "--quiet")
    assert quiet.code == 0 and quiet.stderr == "" and "head: " in quiet.stdout
    shown = specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "t", "--data", corpus_file,
                    *FAST, "--steps", "1", tty=True)
    assert shown.code == 0 and "accept@4" in shown.stderr and "trained 1 steps" in shown.stderr
    assert " left" in shown.stderr and "-:--:--" not in shown.stderr


def test_ctrl_c_in_the_final_evaluation_still_saves(pair, profile_file, corpus_file, tmp_path, monkeypatch):
    calls = []
    original = th.Trainer.evaluate

    def evaluate(self):
        calls.append(1)
        if len(calls) == 2:  # the first is before training, the second the final one
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(th.Trainer, "evaluate", evaluate)
    result = specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "h", "--data", corpus_file,
                     *FAST, "--steps", "1")
    assert result.code == 130, result
    report = json.loads((tmp_path / "h" / "report.json").read_text())
    assert report["complete"] is False and report["steps"] == 1 and report["simulated_acceptance"]["1"] >= 1
    assert (tmp_path / "h" / "model.safetensors").is_file() and (tmp_path / "h" / "profile.toml").is_file()


def test_ctrl_c_keeps_a_usable_head(pair, profile_file, corpus_file, tmp_path, monkeypatch):
    from specgen.core.drafters.head_formats import load_head

    calls = []
    original = th.Trainer.step

    def interrupted(self, factor):
        calls.append(factor)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, factor)

    monkeypatch.setattr(th.Trainer, "step", interrupted)
    result = specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "h", "--data", corpus_file,
                     *FAST, "--steps", "5")
    assert result.code == 130, result
    report = json.loads((tmp_path / "h" / "report.json").read_text())
    assert report["complete"] is False and report["steps"] == 1
    assert "interrupted" in result.stderr
    load_head(tmp_path / "h", embedding=load_target(pair[0], "auto").model.embed_tokens.weight)


@pytest.mark.parametrize("args, fragment", [
    (("--minutes", "0"), "--minutes 0 is not allowed: must be > 0"),
    (("--steps", "-1"), "--steps -1 is not allowed"),
    (("--batch-size", "0"), "--batch-size 0 is not allowed"),
    (("--ttt-steps", "0"), "--ttt-steps 0 is not allowed"),
    (("--seq-len", "8", "--ttt-steps", "9"), "must exceed --ttt-steps + 1"),
    (("--lr", "2"), "--lr 2 is not allowed"),
    (("--warmup-steps", "-1"), "--warmup-steps -1 is not allowed"),
    (("--layers", "1,2"), "--layers takes three comma-separated layer ids"),
    (("--layers", "1,x,2"), "--layers takes three comma-separated layer ids"),
    (("--layers", "0,1,2"), "the target has 2 layers"),
    (("--draft-vocab", "100000"), "larger than the target's vocabulary"),
    (("--seq-len", "1000"), "--seq-len 1000 is longer than the target's context (512 tokens)"),
    (("--draft-vocab", "0"), "--draft-vocab 0 is not allowed"),
    (("--seed", "-1"), "--seed -1 is not allowed"),
    (("--eval-prompts", "0"), "--eval-prompts 0 is not allowed"),
    (("--device", "tpu"), "--device"),
])
def test_bad_options_exit_2_with_one_line_before_torch(args, fragment, profile_file, corpus_file, tmp_path,
                                                        monkeypatch):
    result = specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "h", "--data", corpus_file,
                     *args)
    assert_error(result, 2, fragment)
    assert not (tmp_path / "h").exists()


def test_data_errors(profile_file, tmp_path, monkeypatch):
    def error(*args):
        return specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "h", *args)

    assert_error(error(), 2, "--data is needed", "give --data")
    assert_error(error("--data", tmp_path / "none.txt"), 2, "none.txt not found")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    assert_error(error("--data", tmp_path / "bad.jsonl"), 2, "bad.jsonl:2: a JSON line needs a string field")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9")
    assert_error(error("--data", tmp_path / "latin.txt"), 2, "is not UTF-8")
    (tmp_path / "empty").mkdir()
    assert_error(error("--data", tmp_path / "empty"), 2, "holds no text")
    (tmp_path / "file").write_text("x")
    assert_error(specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "file"), 2, "is a file")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("x")
    assert_error(specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "used"), 2,
                 "holds other files (notes.txt, ...)")
    assert_error(specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "file" / "h"), 2,
                 "cannot be reached (Not a directory)")


def test_usage_errors_answer_before_torch_is_imported(profile_file, tmp_path):
    """Options, the profile, --out and --data are all checked before torch loads (as fast as --help)."""
    import subprocess
    import sys

    from cli_helpers import subprocess_env

    (tmp_path / "bad.jsonl").write_text('{"body": 1}\n')
    code = (
        "import sys\n"
        "from specgen.cli import errors\n"
        "from specgen.cli.main import app\n"
        f"base = ['train-head', '-p', {str(profile_file)!r}, '--out', {str(tmp_path / 'h')!r}]\n"
        f"for extra in (['--minutes', '0'], ['--layers', '0,1,5'], ['--data', {str(tmp_path / 'bad.jsonl')!r}]):\n"
        "    assert errors.run(app, base + extra) == 2, extra\n"
        "sys.exit(sorted({'torch', 'transformers', 'numpy'} & set(sys.modules)) or None)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("specgen: error: ") == 3


def test_data_folder_and_jsonl_hold_out_by_name(tmp_path):
    from specgen.core.train.corpus import DATA_HOLDOUT_MOD, is_held_out, read_data

    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    names = [f"sub/{i}.txt" for i in range(40)]
    for name in names:
        (folder / name).write_text(f"text {name}")
    (folder / "blob.bin").write_bytes(b"\xff\xfe")
    train, held, description = read_data(folder)
    assert sorted(held) == sorted(f"text {n}" for n in names if is_held_out(n, DATA_HOLDOUT_MOD))
    assert len(train) + len(held) == 40 and held and "40 text files" in description
    lines = [json.dumps({"prompt" if i % 2 else "text": f"record {i}"}) for i in range(30)]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    train, held, description = read_data(tmp_path / "d.jsonl")
    assert not any(is_held_out(str(n), DATA_HOLDOUT_MOD) for n in range(1, 31))  # so the tail is held out:
    assert train[:-1] == [f"record {i}" for i in range(29)] and train[-1] + held[0] == "record 29"
    assert held == ["9"] and "the last 5% held out" in description


def test_a_make_pair_target_trains_on_its_own_corpus_without_the_held_out_files(tmp_path):
    from specgen.core.train.corpus import (
        PAIR_CORPORA,
        corpus_roots,
        list_files,
        pair_corpus,
        pair_texts,
        split,
    )

    (tmp_path / "target").mkdir()
    assert pair_corpus(str(tmp_path / "target")) is None
    report = {"preset": "micro", "corpus": {}, "command": f"python make_pair.py --stdlib {tmp_path / 'absent'}"}
    (tmp_path / "report.json").write_text(json.dumps(report))
    spec, stdlib = pair_corpus(str(tmp_path / "target"))
    assert spec == PAIR_CORPORA["micro"] and stdlib is None  # the named stdlib is not on this machine
    train, held, description = pair_texts(spec)
    _, held_files = split(list_files(corpus_roots(False, None)), spec.holdout_mod)
    held_texts = {f.path.read_text(encoding="utf-8", errors="replace") for f in held_files}
    assert held and not held_texts & set(train)
    assert sum(map(len, train)) < spec.train_bytes + 512_000 and "held out by sha1" in description


def test_a_trained_head_proposes_the_same_through_both_formats(pair, trained, tmp_path):
    """The head train-head wrote, re-written in the EAGLE-3 repository's format (midlayer.*), loads
    through that format's reader and drafts the same tokens, round for round, as the original."""
    from decode_helpers import make_profile
    from tiny_models import write_eagle3_original

    from specgen.core.engine import Engine
    from specgen.core.events import RoundEvent
    from specgen.core.drafters.head_formats import load_head
    from specgen.core.settings import ProposerSpec

    out, _ = trained
    target = load_target(pair[0], "auto")
    original = write_eagle3_original(load_head(out, embedding=target.model.embed_tokens.weight), tmp_path / "orig")
    drafted = []
    for folder in (out, original):
        engine = Engine(make_profile(pair[0], None, k=3, proposer=ProposerSpec(kind="eagle", head=str(folder)),
                                     max_tokens=16))
        events = [e for e in engine.decoder().run([5, 6, 7, 8, 9]) if isinstance(e, RoundEvent)]
        drafted.append([e.drafted_ids for e in events])
    assert drafted[0] == drafted[1] and sum(map(len, drafted[0])) > 0


# ---------------------------------------------------------------- the output folder


def test_out_is_checked_before_training(profile_file, corpus_file, tmp_path, monkeypatch):
    """What would stop the head from being saved stops the command before any training."""
    def error(out):
        return specgen(monkeypatch, "train-head", "-p", profile_file, "--out", out, "--data", corpus_file, *FAST)

    (tmp_path / "old" / "config.json").mkdir(parents=True)
    assert_error(error(tmp_path / "old"), 2, "config.json is not a file, and train-head writes a file of that name")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert_error(error(tmp_path / "loop"), 2, "--out", "loop cannot be reached (Too many levels of symbolic links)")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert_error(error(tmp_path / "dangling" / "h"), 2, "is a link to", "which does not exist")
    assert not (tmp_path / "nowhere").exists()


def test_a_run_that_fails_leaves_no_folder_behind(profile_file, tmp_path, monkeypatch):
    """The folder is created when the head is saved: an error once the target has loaded (here:
    too little held-out text) leaves none."""
    (tmp_path / "short.txt").write_text("x = 1\n" * 20)
    result = specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "h", "--data",
                     tmp_path / "short.txt", *FAST)
    assert_error(result, 2, "the held-out data has")
    assert not (tmp_path / "h").exists()


def old_head(folder: Path) -> dict:
    folder.mkdir(parents=True)
    for name in FILES:
        (folder / name).write_text(f"earlier {name}")
    return {name: f"earlier {name}" for name in FILES}


def contents(folder: Path) -> dict:
    return {p.name: p.read_text() for p in folder.iterdir()}


def full_disk(writes: int):
    """A stand-in writer: `writes` files written, then the disk is full."""
    def writer(folder: Path) -> None:
        for name in FILES[:writes]:
            (folder / name).write_text("new")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return writer


@pytest.mark.parametrize("writes", [0, 2])
def test_a_full_disk_keeps_the_earlier_head(tmp_path, writes):
    earlier = old_head(tmp_path / "h")
    with pytest.raises(head_folder.SpecgenError, match=f"^no space left on {tmp_path / 'h'}: "):
        head_folder.write(tmp_path / "h", full_disk(writes))
    assert contents(tmp_path / "h") == earlier  # and no hidden folder of the failed write


def test_a_failed_write_removes_the_folders_it_created(tmp_path):
    with pytest.raises(head_folder.SpecgenError, match="no space left on"):
        head_folder.write(tmp_path / "a" / "b" / "h", full_disk(1))
    assert list(tmp_path.iterdir()) == []


def test_the_files_replace_the_earlier_ones_with_the_usual_mode(tmp_path):
    """Written privately (0600, as safetensors and tempfile do), published as any new file is."""
    old_head(tmp_path / "h")

    def writer(folder: Path) -> None:
        for name in FILES:
            (folder / name).write_text("new")
            (folder / name).chmod(0o600)

    head_folder.write(tmp_path / "h", writer)
    mask = os.umask(0)
    os.umask(mask)
    assert contents(tmp_path / "h") == dict.fromkeys(FILES, "new")
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "h").iterdir()} == {0o666 & ~mask}


def test_a_full_disk_after_training_is_one_line(profile_file, corpus_file, tmp_path, monkeypatch):
    """safetensors reports a full disk as SafetensorError naming the OS error: one line, exit 1,
    and the earlier head stays."""
    from safetensors import SafetensorError

    from specgen.core.drafters import head_formats

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    earlier = old_head(tmp_path / "h")
    monkeypatch.setattr(head_formats, "save_speculators", full)
    result = specgen(monkeypatch, "train-head", "-p", profile_file, "--out", tmp_path / "h", "--data", corpus_file,
                     *FAST, "--steps", "1")
    assert_error(result, 1, f"no space left on {tmp_path / 'h'}")
    assert contents(tmp_path / "h") == earlier


def test_data_without_end_is_bounded(tmp_path):
    """--data /dev/zero stops at the limit (as stdin does) instead of filling memory; a regular
    file over it is refused by its size."""
    from specgen.core.train.corpus import read_data
    from specgen.core.errors import UsageError

    with pytest.raises(UsageError, match="--data /dev/zero holds more than 4 KiB"):
        read_data(Path("/dev/zero"), limit=4096)
    (tmp_path / "big.txt").write_text("a" * 5000)
    with pytest.raises(UsageError, match="big.txt holds more than 4 KiB"):
        read_data(tmp_path / "big.txt", limit=4096)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "big.txt").write_text("a" * 5000)
    with pytest.raises(UsageError, match="big.txt holds more than 4 KiB"):
        read_data(tmp_path / "docs", limit=4096)
