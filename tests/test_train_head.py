"""`specgen train-head` (core/train_head.py, cli/train_head.py): hidden states from hooks, the
training-time-test unroll against the head's own cached drafting, the simulated acceptance, the
output folder, and the command's errors."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_error, specgen
from tiny_models import CORPUS, build_head, build_pair, tiny_head_config, write_profile

from specgen.core import train_head as th
from specgen.core.train_plan import TrainPlan


def plan(**changes) -> TrainPlan:
    fields = dict(minutes=5.0, steps=0, batch_size=2, seq_len=32, lr=1e-3, ttt_steps=3, layers=None,
                  draft_vocab=None, seed=0, regenerate=False, init_from_target=True, eval_prompts=2)
    return TrainPlan(**{**fields, **changes})


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, draft = build_pair(tmp_path_factory.mktemp("pair"))
    return target, draft


def load_target(folder: Path, modeling: str):
    from specgen.core import models
    from specgen.core.settings import ModelSpec

    model = models.load_model(ModelSpec(path=str(folder), device="cpu", dtype="float32"), modeling=modeling)
    return model.requires_grad_(False)


# ---------------------------------------------------------------- hooks


@pytest.mark.parametrize("modeling", ["transformers", "auto"])
def test_hooks_capture_exactly_the_hidden_states_entering_each_layer(pair, modeling):
    """`aux_layer_ids` id i is transformers' output_hidden_states[i]: bit-equal on transformers'
    model, equal to float32 rounding on specgen's own Llama (core/llama.py, "auto")."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()
    model = load_target(pair[0], modeling)
    assert (type(model).__module__ == "specgen.core.llama") == (modeling == "auto")
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


@pytest.mark.slow
@pytest.mark.parametrize("modeling", ["transformers", "auto"])
def test_a_few_steps_lower_the_loss(pair, modeling):
    """A tiny random Llama target, through transformers and through core/llama.py: the TTT loss
    on a fixed batch falls over a few steps."""
    target = load_target(pair[0], modeling)
    from specgen.core.models import load_tokenizer
    from specgen.core.settings import ModelSpec

    tokenizer = load_tokenizer(ModelSpec(path=str(pair[0])))
    texts = CORPUS * 4
    draft_ids = th.draft_vocabulary(tokenizer, texts, tokenizer.eos_token_id, 200, target.config.vocab_size)
    assert len(draft_ids) == 200 and torch.equal(draft_ids, draft_ids.sort().values)
    layers = plan().resolved_layers(target.config.num_hidden_layers)
    assert layers == (0, 1, 1)  # two layers: EAGLE-3's default made valid
    head = th.build_head(target, layers, draft_ids, True, 0, torch.device("cpu"))
    capture = th.AuxCapture(target, layers)
    windows = th.Windows(tokenizer, texts, tokenizer.eos_token_id, 32, 4, 0)
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


def test_draft_vocabulary_takes_the_most_frequent_ids():
    class Tok:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [int(c) for c in text]}

    ids = th.draft_vocabulary(Tok(), ["1112223", "22"], eos_id=9, size=3, vocab=10)
    assert ids.tolist() == [1, 2, 9]  # 2 (x5), 1 (x3), 9 (EOS, x2) before 3 (x1)
    assert th.draft_vocabulary(Tok(), ["1"], eos_id=9, size=10, vocab=10).tolist() == list(range(10))


def test_default_layers_are_eagle3s_where_they_fit():
    assert plan().resolved_layers(32) == (2, 16, 29)
    assert plan().resolved_layers(12) == (2, 6, 9)
    assert plan().resolved_layers(6) == (0, 3, 5)
    assert plan().resolved_layers(1) == (0, 0, 0)
    assert plan(layers=(1, 2, 3)).resolved_layers(32) == (1, 2, 3)
