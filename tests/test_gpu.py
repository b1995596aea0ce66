"""The CUDA fast path on a GPU: captured graphs against eager forwards, greedy equality, rollback.

Skipped without CUDA. Thresholds: float32 graph replay runs the same kernels as the eager step of
the same shape, so it matches to float32 rounding (relative error < 1e-5); bfloat16 < 2e-2.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import replace

import pytest
import torch

from specgen.core.decode import Finished
from specgen.core.engine import Engine, target_only
from specgen.core.settings import ModelSpec, Profile, SamplingSpec, SpeculationSpec
from tiny_models import build_pair

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def make_profile(target, draft, k=4, dtype="float32", graphs=True, compile=False, **sampling) -> Profile:
    sampling.setdefault("max_tokens", 32)
    sampling.setdefault("ignore_eos", True)
    return Profile("test", "<test>", ModelSpec(str(target), dtype=dtype, device="cuda"),
                   ModelSpec(str(draft), dtype=dtype, device="cuda"),
                   speculation=SpeculationSpec(k=k, cuda_graphs=graphs, compile=compile),
                   sampling=SamplingSpec(**sampling))


def finish(decoder, ids) -> Finished:
    events = list(decoder.run(ids))
    return events[-1]


def random_prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(2, 12))] for _ in range(count)]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp(request.param), family=request.param, noisy=0.1)


@pytest.mark.parametrize("dtype, bound", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_graph_logits_match_eager(pair, dtype, bound):
    from specgen.gpu.runner import GraphRunner

    engine = Engine(make_profile(*pair, dtype=dtype))
    graph = engine.target_runner
    assert graph.graphs, "the target's steps were not captured"
    eager = GraphRunner(engine.pair.target, engine.width, graph.capacity, use_graphs=False)
    prompt = torch.tensor([3, 4, 5, 6, 7, 8, 9], device="cuda")
    for runner in (graph, eager):
        runner.reset()
        runner.forward(prompt, want_logits=False)
    for step in range(6):  # 5-token verification steps then a rollback, six times over
        feed = torch.randint(0, engine.pair.vocab_size, (5,), device="cuda")
        got, want = graph.forward(feed).clone(), eager.forward(feed)
        assert relative_error(got, want) < bound, f"step {step}"
        for runner in (graph, eager):
            runner.truncate(runner.length - 5 + step % 5)


def test_rollback_then_replay_matches_a_fresh_eager_forward(pair):
    from specgen.gpu.runner import GraphRunner

    engine = Engine(make_profile(*pair))
    runner = engine.target_runner
    runner.reset()
    runner.forward(torch.tensor([5, 6, 7]), want_logits=False)
    runner.forward(torch.tensor([8, 40, 41, 42, 43], device="cuda"))  # a 5-token graph
    runner.truncate(3 + 2)
    got = runner.forward(torch.tensor([50], device="cuda")).clone()  # a 1-token graph
    fresh = GraphRunner(engine.pair.target, engine.width, 64, use_graphs=False)
    fresh.reset()
    want = fresh.forward(torch.tensor([5, 6, 7, 8, 40, 50]))[-1:]
    assert relative_error(got, want) < 1e-5


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_target_only_float32(pair, k):
    engine = Engine(make_profile(*pair, k=k))
    assert type(engine.decoder()).__name__ == "GraphDecoder"
    for prompt in random_prompts(engine.pair.vocab_size, 8):
        spec = finish(engine.decoder(), prompt)
        base = finish(engine.decoder(target_only(engine.profile)), prompt)
        assert spec.token_ids == base.token_ids, f"prompt={prompt}"
        assert spec.stats.drafted > 0


def test_fast_path_matches_the_eager_gpu_loop(pair):
    fast = Engine(make_profile(*pair))
    slow = Engine(make_profile(*pair, graphs=False))
    assert slow.fast_path is None
    for prompt in random_prompts(fast.pair.vocab_size, 4, seed=1):
        assert finish(fast.decoder(), prompt).token_ids == finish(slow.decoder(), prompt).token_ids


def test_sampling_runs_and_stays_in_vocab(pair):
    engine = Engine(make_profile(*pair, temperature=0.8, top_p=0.95, seed=1, max_tokens=40))
    result = finish(engine.decoder(), [1, 2, 3])
    assert len(result.token_ids) == 40 and all(t < engine.pair.vocab_size for t in result.token_ids)
    assert 0 < result.stats.rounds <= 40


def test_a_model_that_cannot_be_captured_falls_back_with_one_warning(pair, monkeypatch):
    from specgen.gpu.runner import GraphRunner

    def refuse(self, n):
        raise RuntimeError("capture refused")

    monkeypatch.setattr(GraphRunner, "_capture", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = Engine(make_profile(*pair))
    assert len([w for w in caught if "CUDA graphs" in str(w.message)]) == 1
    assert not engine.target_runner.graphs
    base = finish(engine.decoder(target_only(engine.profile)), [4, 5, 6])
    assert finish(engine.decoder(), [4, 5, 6]).token_ids == base.token_ids


@pytest.mark.slow
def test_compiled_graphs_match_eager(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    engine = Engine(make_profile(*pair, compile=True))
    assert engine.target_runner.attention and engine.draft_runner.attention  # the kernel compiled, no fallback
    plain = Engine(make_profile(*pair, graphs=False))
    for prompt in random_prompts(engine.pair.vocab_size, 3, seed=2):
        assert finish(engine.decoder(), prompt).token_ids == finish(plain.decoder(), prompt).token_ids
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, max_tokens=5))
    assert len(finish(engine.decoder(profile), [1, 2]).token_ids) == 5


@pytest.mark.parametrize("settings", [
    dict(),
    dict(temperature=0.8, top_p=0.95, seed=5),  # top-p alone: drafts at temperature only (auto)
    dict(temperature=0.8, top_k=20, top_p=0.9, seed=6),  # drafts warped with the request's cut
])
def test_fused_round_graph_matches_phase_by_phase_rounds(pair, monkeypatch, settings):
    """The whole round captured as one graph: same tokens as per-phase rounds (same kernels, same
    draws in the same order), captured once per decoder, and its phases timed from inside. Its
    steps take gpu/linear.py's kernel like the runners' own captures."""
    from specgen.gpu import fused as fused_module
    from specgen.gpu import linear, loop

    launches, in_capture = [], []
    real_launch, real_capture = linear._launch, fused_module.FusedRound._capture
    monkeypatch.setattr(linear, "_launch", lambda *a: launches.append(1) or real_launch(*a))

    def counted_capture(self):
        before = len(launches)
        real_capture(self)
        in_capture.append(len(launches) - before)

    monkeypatch.setattr(fused_module.FusedRound, "_capture", counted_capture)
    engine = Engine(make_profile(*pair, max_tokens=48, **settings))
    prompts = random_prompts(engine.pair.vocab_size, 4, seed=3)
    decoder = engine.decoder()
    fused = [finish(decoder, p) for p in prompts]
    assert decoder.fused is not None and decoder.fused.graph is not None, "the fused round was not captured"
    assert in_capture and all(n > 0 for n in in_capture), "the fused round's steps did not take the linear kernel"
    monkeypatch.setattr(loop, "FUSED", False)
    phased = [finish(engine.decoder(), p) for p in prompts]
    for a, b in zip(fused, phased):
        assert a.token_ids == b.token_ids
        assert a.stats.accepted == b.stats.accepted and a.stats.rounds == b.stats.rounds
    seconds = fused[-1].stats.seconds
    assert seconds["verify"] > 0
    if decoder.fused.events:  # timing events captured inside the graph: a real split
        assert seconds["draft"] > 0 and seconds["sample"] > 0
