"""The CUDA backend on a GPU: the captured round against the same round run eagerly, greedy
identity through the backend, runners against eager forwards, fallback when capture fails.

Skipped without CUDA. The backend-independent greedy-identity and χ² tests live in test_decode,
test_hybrid, test_ngram and test_adaptive, parametrized over BACKENDS. Thresholds: float32 steps
with the Triton step kernels differ from transformers' eager forward by rounding only (relative
error < 3e-4, the bound tests/gpu/kernels/test_attention.py's rotary checks use); bfloat16 < 6e-2 (the step kernels sum in another order than cuBLAS and SDPA; random weights
make large logits).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch

from decode_helpers import CUDA, finish, make_profile, random_prompts, relative_error
from specgen.core.backend import EagerProgram
from specgen.core.engine import Engine, target_only
from specgen.core.round import Mode
from specgen.core.runner import EagerRunner
from specgen.core.settings import ProposerSpec
from specgen.core.runner import PREFILL_CHUNK
from tiny_models import build_pair

pytestmark = CUDA


def cuda_profile(target, draft, k=4, dtype="float32", graphs=True, **sampling):
    profile = make_profile(target, draft, k=k, backend="cuda", speculation=dict(cuda_graphs=graphs),
                           **({"max_tokens": 32} | sampling))
    return replace(profile, target=replace(profile.target, dtype=dtype), draft=replace(profile.draft, dtype=dtype))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp(request.param), family=request.param, noisy=0.1)


def eager_twin(decoder):
    """The decoder with every program replaced by its round's body run eagerly: same Round, same
    buffers, kernels and runners, same draws; only the capture differs."""
    rnd = decoder.round
    decoder.programs = {mode: EagerProgram(lambda mark, mode=mode: rnd.body(mode, mark)) for mode in decoder.programs}
    return decoder


@pytest.mark.parametrize("settings", [
    dict(),  # greedy
    dict(temperature=0.8, top_p=0.95, seed=5),  # top-p alone: drafts at temperature only (auto)
    dict(temperature=0.8, top_k=20, top_p=0.9, seed=6),  # drafts warped with the request's cut
    dict(temperature=0.7, seed=12, min_tokens=9, repetition_penalty=1.2),  # device-built masks and penalty rows
])
def test_captured_round_equals_the_round_run_eagerly(pair, settings):
    engine = Engine(cuda_profile(*pair, max_tokens=40, **settings))
    assert engine.backend.name == "cuda"
    decoder = engine.decoder()
    assert all(type(p).__name__ == "GraphProgram" and p.graphs and p.eager is None
               for p in decoder.programs.values()), "the round was not captured"
    assert decoder.pipelined and all(sorted(p.graphs) == [0, 1] for p in decoder.programs.values())
    for prompt in random_prompts(engine.pair.vocab_size, 4, seed=3) + [[7]]:  # [7]: a one-token prompt
        captured = finish(decoder, prompt)
        eager = finish(eager_twin(engine.decoder()), prompt)
        assert captured.token_ids == eager.token_ids, f"prompt={prompt}"
        assert (captured.stats.rounds, captured.stats.accepted, captured.stats.drafted) == \
               (eager.stats.rounds, eager.stats.accepted, eager.stats.drafted)
    seconds = captured.stats.seconds
    assert seconds["verify"] > 0


def test_captured_host_rounds_equal_eager_ones(pair):
    """Hybrid: both modes captured; n-gram and draft-model rounds give the eager round's tokens."""
    profile = replace(cuda_profile(*pair, k=3, temperature=0.8, seed=4), proposer=ProposerSpec(kind="hybrid"))
    engine = Engine(profile)
    decoder = engine.decoder()
    assert set(decoder.programs) == {Mode.MODEL, Mode.HOST}
    for prompt in ([5, 6, 7, 5, 6], [9, 3, 9, 3, 9]):
        captured = finish(decoder, prompt)
        assert finish(eager_twin(engine.decoder()), prompt).token_ids == captured.token_ids
        assert min(decoder.proposer_rounds.values()) > 0


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_target_only_float32(pair, k):
    engine = Engine(cuda_profile(*pair, k=k))
    assert engine.backend.name == "cuda"
    described = engine.describe()["kernels"]
    tables = {name: kernels["linear_table"] for name, kernels in described.items()}
    assert tables["draft"].endswith("draft picks") and not tables["target"].endswith("draft picks")
    for kernels in described.values():  # launches apply to 16-bit calls only
        expected = "none (float32 weights)" if kernels["linear"] == "kernel" else None
        assert kernels.get("linear_launches") == expected
    for prompt in random_prompts(engine.pair.vocab_size, 8):
        spec = finish(engine.decoder(), prompt)
        base = finish(engine.decoder(target_only(engine.profile)), prompt)
        assert spec.token_ids == base.token_ids, f"prompt={prompt}"
        assert spec.stats.drafted > 0


def test_captured_round_equals_the_torch_backend_on_the_gpu(pair):
    """cuda_graphs = false: the torch backend on the same GPU; greedy float32 output is the same."""
    fast = Engine(cuda_profile(*pair))
    slow = Engine(cuda_profile(*pair, graphs=False))
    assert (fast.backend.name, slow.backend.name) == ("cuda", "torch")
    for prompt in random_prompts(fast.pair.vocab_size, 4, seed=1):
        assert finish(fast.decoder(), prompt).token_ids == finish(slow.decoder(), prompt).token_ids


@pytest.mark.parametrize("dtype, bound", [("float32", 3e-4), ("bfloat16", 6e-2)])
def test_runner_steps_and_rollback_match_eager_forwards(pair, dtype, bound):
    """The CUDA backend's target runner: verification steps at a moving position, rolled back by
    moving it, against transformers' eager forward over a static cache (core/runner.EagerRunner)."""
    engine = Engine(cuda_profile(*pair, dtype=dtype))
    runner = engine.target_runner
    eager = EagerRunner(engine.pair.target, engine.width, runner.capacity)
    prompt = torch.tensor([3, 4, 5, 6, 7, 8, 9], device="cuda")
    for r in (runner, eager):
        r.reset()
        r.forward(prompt, want_logits=False)
    gen = torch.Generator(device="cuda").manual_seed(0)  # the bound is empirical: the same feeds every run
    for step in range(6):  # 5-token verification steps then a rollback, six times over
        feed = torch.randint(0, engine.pair.vocab_size, (5,), device="cuda", generator=gen)
        out = torch.full((5, engine.width), float("-inf"), device="cuda")
        with runner.step_context(5):
            runner.step(feed, out)
        want = eager.forward(feed)
        assert relative_error(out, want) < bound, f"step {step}"
        for r in (runner, eager):
            r.position.sub_(5 - step % 5)
    assert int(runner.position) == int(eager.position)


def test_a_decoder_built_after_a_re_allocation_captures_before_its_run(pair, monkeypatch):
    """A cache that grew (room for a long prompt, as `specgen bench` takes before its warm-ups)
    leaves the captured rounds over it stale: the next decoder re-captures both slots as it is
    built, and its run captures nothing (core/bench/run.py times runs, not decoders' set-up)."""
    from specgen.gpu import backend

    engine = Engine(cuda_profile(*pair, max_tokens=16))
    program = engine.decoder().programs[Mode.MODEL]
    generation = engine.target_runner.generation
    engine.decoder().reserve(engine.target_runner.capacity)  # a prompt as long as the cache: it grows
    assert engine.target_runner.generation > generation and program.generation != program._generations()
    decoder = engine.decoder()
    assert decoder.pipelined and sorted(program.graphs) == [0, 1] and program.generation == program._generations()
    captures = []
    real = backend.capture
    monkeypatch.setattr(backend, "capture", lambda *a, **k: captures.append(1) or real(*a, **k))
    prompt = [3, 4, 5, 6, 7]
    captured = finish(decoder, prompt)
    assert captures == []
    assert captured.token_ids == finish(eager_twin(engine.decoder()), prompt).token_ids


def test_sampling_runs_and_stays_in_vocab(pair):
    engine = Engine(cuda_profile(*pair, temperature=0.8, top_p=0.95, seed=1, max_tokens=40))
    result = finish(engine.decoder(), [1, 2, 3])
    assert len(result.token_ids) == 40 and all(t < engine.pair.vocab_size for t in result.token_ids)
    assert 0 < result.stats.rounds <= 40


def test_a_round_that_cannot_be_captured_falls_back_with_one_warning(pair, monkeypatch):
    """A model whose forward syncs while a round with several steps is captured (as `.item()` in a
    model would): the runners' own captures of the prefill chunk still work, the round's capture
    fails, one warning says so, and rounds run eagerly with the same output."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    from specgen.core.step.model import OwnedModel

    engine = Engine(cuda_profile(*pair))
    reference = finish(engine.decoder(target_only(engine.profile)), [4, 5, 6]).token_ids
    for cls in (LlamaForCausalLM, Qwen2ForCausalLM):
        forward = cls.forward

        def refusing(self, *args, _forward=forward, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                ids = kwargs.get("inputs_embeds")  # gpu/kernels/step_io.py's steps: [1, n, hidden]
            if torch.cuda.is_current_stream_capturing() and ids is not None and ids.shape[1] < PREFILL_CHUNK:
                raise RuntimeError("operation not permitted when stream is capturing")
            return _forward(self, *args, **kwargs)

        monkeypatch.setattr(cls, "forward", refusing)
    step = OwnedModel.step

    def refusing_step(self, rows, *args, **kwargs):  # specgen's own model step: its rows' ids
        if torch.cuda.is_current_stream_capturing() and rows.count < PREFILL_CHUNK:
            raise RuntimeError("operation not permitted when stream is capturing")
        return step(self, rows, *args, **kwargs)

    monkeypatch.setattr(OwnedModel, "step", refusing_step)
    profile = replace(engine.profile, speculation=replace(engine.profile.speculation, k=5))  # a new round shape
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decoder = engine.decoder(profile)
    messages = [str(w.message) for w in caught if "could not capture" in str(w.message)]
    assert len(messages) == 1 and "round" in messages[0], messages
    assert all(isinstance(p, EagerProgram) or getattr(p, "eager", None) is not None for p in decoder.programs.values())
    assert finish(decoder, [4, 5, 6]).token_ids == reference


