"""Shared builders and checks for the decode tests (test_decode, test_round, test_hybrid, ...).

`BACKENDS` parametrizes a test over the backends that can run here: the torch backend always (on
the CPU), the CUDA backend (marked `cuda`) only where a GPU exists. Both run float32, so greedy
output must equal target-only token for token on either.
"""

from __future__ import annotations

import random

import pytest
import torch

from specgen.core.events import Finished
from specgen.core.runner import EagerRunner
from specgen.core.settings import ModelSpec, Profile, ProposerSpec, SamplingSpec, SpeculationSpec

CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def on_cuda(test):
    """Marked `cuda`, skipped without a GPU (CUDA)."""
    for mark in CUDA:
        test = mark(test)
    return test


def cuda_engine(target, draft, k: int = 4, dtype: str = "bfloat16", max_tokens: int = 32, **sampling):
    """An Engine of the pair on the CUDA backend, both models in `dtype`."""
    from dataclasses import replace

    from specgen.core.engine import Engine

    profile = make_profile(target, draft, k=k, backend="cuda", max_tokens=max_tokens, **sampling)
    profile = replace(profile, target=replace(profile.target, dtype=dtype), draft=replace(profile.draft, dtype=dtype))
    engine = Engine(profile)
    assert engine.backend.name == "cuda"
    return engine


BACKENDS = ["torch", pytest.param("cuda", marks=CUDA)]


def model_spec(path, backend: str = "torch") -> ModelSpec:
    """float32 on the backend's device: the torch backend on the CPU, the CUDA backend on the GPU."""
    return ModelSpec(str(path), dtype="float32", device="cpu" if backend == "torch" else "cuda")


def make_profile(target, draft, k=3, backend: str = "torch", proposer: ProposerSpec | None = None,
                 speculation: dict | None = None, **sampling) -> Profile:
    sampling.setdefault("max_tokens", 24)
    sampling.setdefault("ignore_eos", True)
    return Profile("test", "<test>", model_spec(target, backend),
                   model_spec(draft, backend) if draft is not None else None,
                   proposer=proposer or ProposerSpec(),
                   speculation=SpeculationSpec(k=k, **(speculation or {})), sampling=SamplingSpec(**sampling))


def finish(decoder, ids) -> Finished:
    events = list(decoder.run(ids))
    assert isinstance(events[-1], Finished)
    return events[-1]


def random_prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    """Prompts of 1 to 12 ids (one-token prompts included: the draft sees that id twice)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for _ in range(count)]


def next_token_probs(model, ids: list[int]) -> torch.Tensor:
    """softmax of the model's last logits for one sequence: [V] float32 on the CPU, wherever the model is."""
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0, -1]
    return torch.softmax(logits.float(), -1).cpu()


def _chi2_pvalue(samples: list[int], probs: torch.Tensor, chisquare) -> float:
    """χ² p-value of samples against probs [V]; bins with expected count < 5 are pooled into one."""
    n = len(samples)
    counts = torch.bincount(torch.tensor(samples), minlength=probs.shape[0]).double()
    expected = probs.double() * n
    big = expected >= 5
    assert counts[probs == 0].sum() == 0, "a token of probability 0 was emitted"
    observed = torch.cat([counts[big], counts[~big].sum().unsqueeze(0)])
    wanted = torch.cat([expected[big], expected[~big].sum().unsqueeze(0)])
    if wanted[-1] == 0:  # a cut (top-k / top-p) left nothing below 5: no pooled bin
        observed, wanted = observed[:-1], wanted[:-1]
    wanted = wanted * observed.sum() / wanted.sum()
    return float(chisquare(observed.numpy(), wanted.numpy()).pvalue)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


def draft_sequence(prompt: list[int], token_ids: list[int]) -> list[int]:
    """What the draft has seen of a run: the committed sequence, the first id twice for a one-token
    prompt (its cache needs two committed ids to start from)."""
    return (prompt * 2 if len(prompt) == 1 else list(prompt)) + list(token_ids)


def draft_follows(engine, decoder, prompt: list[int], token_ids: list[int]) -> None:
    """After a finished run (no round in flight): the target cache holds the committed sequence but
    its last id (feed[0, 0]); the draft cache all but its last two (rnd.drafter.pending), and feeding those
    gives the logits a fresh EagerRunner gives for the whole sequence (float32 rounding only).
    Call it only after runs that stopped on length: a round cut by a stop id or a stop string
    committed the whole round on the device, and a stop string may leave the next round queued."""
    rnd = decoder.round
    committed = list(prompt) + list(token_ids)
    assert int(rnd.target.position) == len(committed) - 1, "target cache is not the committed sequence minus one"
    assert int(rnd.feed[0, 0]) == committed[-1]
    seen = draft_sequence(prompt, token_ids)
    assert int(rnd.draft.position) == len(seen) - 2, (
        f"draft position {int(rnd.draft.position)}, committed {len(committed)} (prompt {len(prompt)})")
    assert rnd.drafter.pending[0].tolist() == seen[-2:]
    got = rnd.draft.forward(rnd.drafter.pending[0].clone())[-1]
    fresh = EagerRunner(engine.pair.draft, engine.width, len(seen) + 8)
    want = fresh.forward(torch.tensor(seen, dtype=torch.long))[-1]
    assert relative_error(got, want) < 1e-4, "the draft's logits after the run are not a fresh forward's"


def warped_next(model, ids: list[int], spec) -> torch.Tensor:
    """The target's warped p [V] after ids, as the sampler warps it (spec: a SamplingSpec)."""
    from specgen.core.sampling.warp import WarpParams, warp

    logits = torch.log(next_token_probs(model, ids))[None]
    return warp(logits, WarpParams.from_spec(spec, 1))[1][0]


def assert_first_two_follow_p(engine, profile, prompt: list[int], model, runs: int = 1500) -> None:
    """Decode prompt `runs` times with seeds 0.. : χ² of the first emitted token against the
    target's warped p, and of the next after the most common first (over 100 samples), at α = 1e-4."""
    from dataclasses import replace

    outputs = []
    for seed in range(runs):
        seeded = replace(profile, sampling=replace(profile.sampling, seed=seed))
        outputs.append(finish(engine.decoder(seeded), prompt).token_ids)
    assert_first_two_tokens_follow_p(outputs, model, prompt, profile.sampling)


def assert_sampled_trees_follow_p(engine, profile, prompt: list[int], drafter: str) -> None:
    """A sampled tree profile's rounds (children drawn from the drafter's q, the recursive walk):
    its drafts are accepted in the first 100 seeds' runs (else the χ² below would not test
    acceptance), then assert_first_two_follow_p. drafter: who drafts, for the message."""
    from dataclasses import replace

    from specgen.core.events import RoundEvent

    assert engine.decoder(profile).round.tree.sampled
    seeded = [replace(profile, sampling=replace(profile.sampling, seed=seed)) for seed in range(100)]
    accepted = sum(e.num_accepted for run in seeded for e in engine.decoder(run).run(prompt)
                   if isinstance(e, RoundEvent))
    assert accepted > 5, f"{drafter}'s trees were (almost) never accepted: the test would not test acceptance"
    assert_first_two_follow_p(engine, profile, prompt, engine.pair.target)


def assert_first_two_tokens_follow_p(outputs: list[list[int]], model, prompt: list[int], sampling) -> None:
    """χ² of the outputs' first tokens against the target's warped p after prompt, and of the
    next after the most common first (over 100 samples), at α = 1e-4 each."""
    from scipy.stats import chisquare

    firsts = [ids[0] for ids in outputs]
    assert _chi2_pvalue(firsts, warped_next(model, prompt, sampling), chisquare) > 1e-4
    common = max(set(firsts), key=firsts.count)
    follow = [ids[1] for ids in outputs if ids[0] == common]
    assert len(follow) > 100
    assert _chi2_pvalue(follow, warped_next(model, prompt + [common], sampling), chisquare) > 1e-4
