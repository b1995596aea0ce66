"""Heads on the target's hidden states as proposers (core/drafters/heads.py, core/round/head.py): EAGLE-3 heads
and MTP layers drafting inside the one round.

Lossless: greedy output equals target-only token for token (float32), sampled output follows the
target's warped distribution (χ²), and Gumbel coupling gives target-only's text. Mechanics: the
drafts of every round equal what the head computes from scratch over the committed sequence with
the target's hidden states (so the tap, the extend over the previous round's rows and the steps
on the head's own states are right, not merely harmless).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from decode_helpers import BACKENDS, _chi2_pvalue, finish, make_profile, next_token_probs, random_prompts
from tiny_models import (AUX, build_head, build_mtp_target, build_pair, head_for, tiny_head_config,
                         write_profile)
from cli_helpers import assert_error, specgen

from specgen.core.engine import Engine, target_only
from specgen.core.events import RoundEvent
from specgen.core.drafters.head_formats import load_head, save_speculators
from specgen.core.drafters.heads import AuxTap
from specgen.core.settings import ProposerSpec

@pytest.fixture(scope="module")
def headed(tmp_path_factory):
    root = tmp_path_factory.mktemp("headed")
    target, draft = build_pair(root)
    return target, draft, head_for(target, root / "head"), head_for(target, root / "reduced", draft_vocab=150)


def eagle_profile(target, head, k=3, backend="torch", **sampling):
    return make_profile(target, None, k=k, backend=backend, proposer=ProposerSpec(kind="eagle", head=str(head)),
                        **sampling)


def rounds(decoder, prompt) -> list[RoundEvent]:
    return [e for e in decoder.run(prompt) if isinstance(e, RoundEvent)]


# -- the tap ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("modeling", ["auto", "transformers"])
def test_tap_copies_the_hidden_states_transformers_reports(headed, modeling):
    """Point i is output_hidden_states[i] (i < N: the stream entering layer i; N: after the final
    norm), on specgen's own Llama forward and on transformers'; nothing is copied while disarmed."""
    from transformers import AutoModelForCausalLM

    from specgen.core.models.loading import load_model
    from specgen.core.settings import ModelSpec

    target = headed[0]
    model = load_model(ModelSpec(str(target), dtype="float32", device="cpu"), modeling=modeling)
    reference = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 17, 33, 2, 8]])
    with torch.no_grad():
        states = reference(ids, output_hidden_states=True).hidden_states
    tap = AuxTap(model, (0, 1, 2), rows=8)
    with torch.no_grad():
        model(ids)
        assert tap.out.abs().sum() == 0, "a disarmed tap copied"
        with tap.armed():
            model(ids)
    got = tap.out[:6].view(6, 3, -1)
    for j, point in enumerate((0, 1, 2)):
        torch.testing.assert_close(got[:, j], states[point][0], rtol=1e-5, atol=1e-5)
    tap.remove()


# -- lossless ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("vocab", ["whole", "reduced"])
def test_eagle_greedy_equals_target_only(headed, backend, k, vocab):
    target, _, whole, reduced = headed
    profile = eagle_profile(target, whole if vocab == "whole" else reduced, k=k, backend=backend, max_tokens=30)
    engine, plain = Engine(profile), Engine(target_only(profile))
    # on CUDA the head's calls take the target's kernel table (gpu/ops.py), and the run says so
    assert engine.describe()["heads"] == {"eagle": "kernels" if backend == "cuda" else "torch"}
    for prompt in random_prompts(engine.pair.vocab_size, 5, seed=k):
        assert finish(engine.decoder(), prompt).token_ids == finish(plain.decoder(), prompt).token_ids


def reference_drafts(engine, head_folder: Path, committed: list[int], k: int) -> list[int]:
    """Greedy drafts from scratch: target states for committed[:-1] in one forward, a fresh head
    over rows t = 0 .. P-1 (id committed[t+1], features at t), then k - 1 steps on its own states."""
    from transformers import AutoModelForCausalLM

    target = engine.profile.target.path
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    head = load_head(head_folder, embedding=model.get_input_embeddings().weight, capacity=256)
    with torch.no_grad():
        states = model(torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states
        features = torch.cat([states[i][0] for i in AUX], dim=-1)
        P = len(committed) - 1
        logits, hidden = head(torch.tensor(committed[1:], dtype=torch.long), features, torch.arange(P))
        logits, hidden = logits[-1:], hidden[-1:]
        drafts = []
        for i in range(k):
            token = int(head.target_logits(logits, engine.width)[0].argmax())
            drafts.append(token)
            logits, hidden = head(torch.tensor([token]), hidden, torch.tensor([P + i]))
    return drafts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", ["whole", "reduced"])
def test_eagle_drafts_are_the_heads_own_from_scratch(headed, vocab, backend):
    """Every round's drafts equal the head run from scratch over the committed sequence (fp32):
    the extend over the last round's rows and the k - 1 steps reproduce it, round after round."""
    target, _, whole, reduced = headed
    folder = whole if vocab == "whole" else reduced
    k = 3
    engine = Engine(eagle_profile(target, folder, k=k, max_tokens=20, backend=backend))
    long = [(7 * i) % 300 + 3 for i in range(150)]  # three tap chunks of prefill
    for prompt in ([3, 14, 15, 92, 65], [7], [11, 12], long):
        committed = list(prompt)
        for event in rounds(engine.decoder(), prompt):
            if len(committed) > 1:  # a one-token prompt's first round has no target row to read
                want = reference_drafts(engine, folder, committed, event.k_used)
                assert event.drafted_ids == want[: len(event.drafted_ids)], (prompt, len(committed))
            committed += event.token_ids
        assert len(committed) == len(prompt) + 20


def test_hybrid_with_eagle_is_lossless_and_uses_both(headed):
    """hybrid_with = "eagle": lookup rounds and head rounds alternate; the head keeps following."""
    target, _, whole, _ = headed
    proposer = ProposerSpec(kind="hybrid", hybrid_with="eagle", head=str(whole), ngram_min=1)
    profile = make_profile(target, None, k=3, proposer=proposer, max_tokens=40)
    engine, plain = Engine(profile), Engine(target_only(profile))
    repeats = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    decoder = engine.decoder()
    assert finish(decoder, repeats).token_ids == finish(plain.decoder(), repeats).token_ids
    assert decoder.proposer_rounds["ngram"] > 0 and decoder.proposer_rounds["draft"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_eagle_gumbel_gives_target_only_text(headed, backend):
    target, _, _, reduced = headed
    profile = eagle_profile(target, reduced, k=4, backend=backend, temperature=0.9, top_p=0.95, seed=11,
                            coupling="gumbel", max_tokens=30)
    engine, plain = Engine(profile), Engine(target_only(profile))
    for prompt in random_prompts(engine.pair.vocab_size, 4, seed=5):
        assert finish(engine.decoder(), prompt).token_ids == finish(plain.decoder(), prompt).token_ids


WARPS = {
    "t1": dict(temperature=1.0),
    "t0.7-top_k": dict(temperature=0.7, top_k=20),
    "top_p": dict(temperature=1.0, top_p=0.8),
    "min_p": dict(temperature=1.0, min_p=0.05),
    "penalties": dict(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3),
}


@pytest.mark.slow
@pytest.mark.parametrize(("warp", "vocab"), [(warp, "reduced") for warp in WARPS] + [("t1", "whole")])
def test_eagle_sampled_tokens_follow_the_warped_target(headed, warp, vocab):
    """χ² of the first two tokens (one round, k = 3, drafted by the head) against the target's
    warped p, computed by the torch reference; α = 1e-4 per test, two tests each. Every warp runs
    with a reduced draft vocabulary (the head's q is -inf outside it); tests/core/sampling/test_lossless.py covers the
    verifier itself under every warp combination for any q."""
    from scipy.stats import chisquare

    from specgen.core.sampling.warp import WarpParams, warp as warp_logits
    from specgen.core.settings import SamplingSpec

    target, _, whole, reduced = headed
    settings = WARPS[warp]
    profile = eagle_profile(target, whole if vocab == "whole" else reduced, k=3, max_tokens=2, **settings)
    engine = Engine(profile)
    prompt = [7, 8, 9]
    spec = SamplingSpec(**settings)

    def warped(ids: list[int]) -> torch.Tensor:
        probs = next_token_probs(engine.pair.target, ids).clamp_min(1e-30).log()[None]
        penalties = None
        if spec.repetition_penalty != 1.0 or spec.presence_penalty or spec.frequency_penalty:
            from specgen.core.sampling.warp import PenaltyRows

            counts = torch.bincount(torch.tensor(ids[len(prompt):], dtype=torch.long), minlength=probs.shape[1])
            seen = torch.zeros(probs.shape[1], dtype=torch.bool)
            seen[torch.tensor(ids)] = True
            penalties = PenaltyRows(counts.int()[None], (seen | (counts > 0))[None])
        return warp_logits(probs, WarpParams.from_spec(spec, 1, torch.device("cpu")), penalties)[1][0]

    firsts, pairs, accepted = [], [], 0
    for seed in range(1000):
        run = replace(profile, sampling=replace(profile.sampling, seed=seed))
        decoder = engine.decoder(run)
        out = finish(decoder, prompt)
        accepted += decoder.stats.accepted
        firsts.append(out.token_ids[0])
        pairs.append(out.token_ids[:2])
    assert accepted > 10, "the head's drafts were (almost) never accepted: the test would not test acceptance"
    assert _chi2_pvalue(firsts, warped(prompt), chisquare) > 1e-4
    common = max(set(firsts), key=firsts.count)
    follow = [b for a, b in pairs if a == common]
    assert len(follow) > 60
    assert _chi2_pvalue(follow, warped(prompt + [common]), chisquare) > 1e-4


# -- settings and errors ---------------------------------------------------------------------------


def test_eagle_without_a_head_is_a_profile_error(headed, tmp_path, monkeypatch):
    target = headed[0]
    profile = write_profile(tmp_path / "p.toml", target, None, proposer={"kind": "eagle"})
    assert_error(specgen(monkeypatch, "generate", "-p", profile, "-n", "2", "hi"), 2, "needs an EAGLE-3 head",
                 "--head")


def test_head_path_is_relative_to_the_profile_and_generates(headed, tmp_path, monkeypatch):
    target, _, whole, _ = headed
    (tmp_path / "h").symlink_to(whole)
    profile = write_profile(tmp_path / "p.toml", target, None, proposer={"kind": "eagle", "head": "h"},
                            sampling={"max_tokens": 8, "ignore_eos": True})
    monkeypatch.chdir("/")
    result = specgen(monkeypatch, "generate", "-p", profile, "--format", "json", "def f(")
    assert result.code == 0, result.stderr
    record = json.loads(result.stdout)
    assert len(record["token_ids"]) == 8


def test_head_of_another_target_is_refused(headed, tmp_path, monkeypatch):
    target = headed[0]
    head = build_head(tiny_head_config(hidden_size=64, target_hidden_size=48, aux_layer_ids=AUX,
                                       max_position_embeddings=512))
    save_speculators(head, tmp_path / "wrong", "x")
    profile = write_profile(tmp_path / "p.toml", target, None,
                            proposer={"kind": "eagle", "head": str(tmp_path / "wrong")})
    assert_error(specgen(monkeypatch, "generate", "-p", profile, "-n", "2", "hi"), 2, "made for another target")


# -- MTP -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp")
    return folder, build_mtp_target(folder)


def test_mtp_greedy_equals_target_only_and_drafts_follow_the_layer(mtp_target):
    """The checkpoint's own MTP layer drafts (nothing else loaded): output is target-only's, and
    each round's first draft is the layer's argmax over (the new token, the target's last state)."""
    from transformers import AutoModelForCausalLM

    from specgen.core.drafters.mtp import load_mtp_layers

    folder, config = mtp_target
    profile = make_profile(folder, None, k=2, proposer=ProposerSpec(kind="mtp"), max_tokens=12)
    engine, plain = Engine(profile), Engine(target_only(profile))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    layer = load_mtp_layers(folder, config)[0]
    checked = 0
    for prompt in ([3, 14, 15, 92], [40, 41, 42, 43, 44, 45]):
        decoder = engine.decoder()
        events = rounds(decoder, prompt)
        committed = list(prompt)
        for event in events:
            with torch.no_grad():
                states = model(torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states[-1]
                logits, _ = layer(torch.tensor([committed[1:]]), states)
            if event.drafted_ids:  # the last round may draft nothing (max_tokens)
                assert event.drafted_ids[0] == int(logits[0, -1].argmax())
                checked += 1
            committed += event.token_ids
        assert committed[len(prompt):] == finish(plain.decoder(), prompt).token_ids
    assert checked >= 6


@pytest.mark.parametrize("modeling", ["auto", "transformers"], ids=["specgen's Llama", "transformers"])
def test_mtp_on_a_checkpoint_without_mtp_layers_is_refused(headed, tmp_path, monkeypatch, modeling):
    """The refusal names the checkpoint's model type and tells a count that is absent from one that
    is there, whichever code runs the target (specgen's own Llama keeps neither in its config)."""
    import shutil

    target = shutil.copytree(headed[0], tmp_path / "target")
    profile = write_profile(tmp_path / "p.toml", target, None, proposer={"kind": "mtp"},
                            runtime={"threads": 1, "modeling": modeling})
    assert_error(specgen(monkeypatch, "generate", "-p", profile, "-n", "2", "hi"), 2,
                 "num_nextn_predict_layers is missing in the llama config: this checkpoint ships no MTP layers")
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"num_nextn_predict_layers": 1}))
    result = specgen(monkeypatch, "generate", "-p", profile, "-n", "2", "hi")
    assert_error(result, 2, "MTP layers of model type 'llama' are not supported (known: deepseek_v3, glm4_moe)")
    assert "missing" not in result.stderr


def test_bench_measures_draft_and_eagle_side_by_side(headed, tmp_path, monkeypatch):
    """One engine loads the draft model and the head; every result names its proposer and greedy
    text equals target-only's for both."""
    target, draft, whole, _ = headed
    profile = write_profile(tmp_path / "p.toml", target, draft, proposer={"kind": "draft", "head": str(whole)})
    (tmp_path / "prompts.txt").write_text("def f(x):\nclass A:\n")
    result = specgen(monkeypatch, "bench", "-p", profile, "--proposer", "draft,eagle", "--k", "2", "-n", "6",
                     "--prompts-file", tmp_path / "prompts.txt", "--format", "json", "--quiet")
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    speculative = [r for r in document["results"] if r.get("proposer")]
    assert sorted(r["proposer"] for r in speculative) == ["draft", "eagle"]
    assert all(r["greedy_agreement"]["target-only"]["identical_fraction"] == 1.0 for r in speculative), speculative


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.9, top_p=0.9, seed=4)])
def test_heads_give_the_same_rounds_with_two_in_flight(headed, mtp_target, backend, sampling):
    """pipeline = "on" against "off" with a head drafting (its extend reads the round before's
    rows and emitted count on the device): the same rounds and tokens, for EAGLE-3 (whole and
    reduced vocabularies) and MTP."""
    from dataclasses import replace

    target, _, whole, reduced = headed
    profiles = [eagle_profile(target, folder, k=3, max_tokens=22, backend=backend, **sampling)
                for folder in (whole, reduced)]
    profiles.append(make_profile(mtp_target[0], None, k=2, proposer=ProposerSpec(kind="mtp"), max_tokens=22,
                                 backend=backend, **sampling))
    for profile in profiles:
        engine = Engine(profile)
        for prompt in ([3, 14, 15, 92, 65], [7]):
            runs = []
            for pipeline in ("on", "off"):
                chosen = replace(profile, speculation=replace(profile.speculation, pipeline=pipeline))
                decoder = engine.decoder(chosen)
                assert decoder.pipelined == (pipeline == "on")
                runs.append([(e.token_ids, e.drafted_ids, e.num_accepted) for e in rounds(decoder, prompt)])
            assert runs[0] == runs[1], (profile.proposer.kind, prompt)
