"""core/bench/floors.py: the weight bytes a step streams, the floor of a round, and how `specgen bench`
reports it (the copy bandwidth is measured on CUDA only, so a stand-in bandwidth drives the CPU
cases; the GPU case measures it)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specgen.core.bench import floors
from specgen.core.bench.run import Bench
from specgen.core.bench.bench_plan import Plan
from specgen.core.engine import Engine
from decode_helpers import make_profile
from tiny_models import build_head, build_pair

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _llama(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(config).to(torch.bfloat16)


def test_an_untied_model_streams_every_weight_but_its_input_embedding():
    model = _llama(tied=False)
    embedding = model.get_input_embeddings().weight
    everything = _bytes(model.parameters())
    assert floors.streamed_bytes(model) == everything - _bytes([embedding])
    assert floors.streamed_bytes(model) == _bytes(p for n, p in model.named_parameters() if "embed_tokens" not in n)


def test_a_tied_model_streams_its_embedding_once_as_the_output_projection():
    model = _llama(tied=True)
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert floors.streamed_bytes(model) == _bytes(model.parameters())  # parameters() holds it once
    untied_twin = _llama(tied=False)  # the same shapes: a step streams the same bytes either way
    assert floors.streamed_bytes(model) == floors.streamed_bytes(untied_twin)


def test_an_eagle_head_streams_its_own_weights_not_the_targets_embedding():
    head = build_head()
    assert floors.streamed_bytes(head) == _bytes(head.parameters())
    assert all(t.data_ptr() != head.embedding.data_ptr() for t in head.parameters())  # a buffer, gathered


def test_floor_arithmetic():
    assert floors.floor_ms(4_000, 1_000, 4, 1e6) == pytest.approx(8.0)  # (4,000 + 4 x 1,000) B / 1 MB/s
    assert floors.floor_ms(4_000, 0, 0, 2e6) == pytest.approx(2.0)


def test_no_bandwidth_off_cuda():
    assert floors.copy_bandwidth(torch.device("cpu")) is None


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    target, draft = build_pair(tmp_path_factory.mktemp("floors"), noisy=0.1)
    return Engine(make_profile(target, draft, k=2, max_tokens=6))


def _bench(engine, proposers=("draft", "ngram", "hybrid")) -> Bench:
    profile = engine.profile

    def settings_for(k, temperature, proposer=None, tree=None):  # tree: the profile's chain, as the plan sweeps none
        return replace(profile, proposer=replace(profile.proposer, kind=proposer or profile.proposer.kind),
                       speculation=replace(profile.speculation, k=k),
                       sampling=replace(profile.sampling, temperature=temperature))

    plan = Plan(proposers=proposers, ks=(2,), temperatures=(0.0,), baselines=(), warmup=0)
    return Bench(engine, ["def f(x):"], settings_for, plan)


def test_bench_reports_each_rounds_floor_from_the_measured_bandwidth(engine, monkeypatch):
    monkeypatch.setattr(floors, "copy_bandwidth", lambda device: 5e8)  # a stand-in: the CPU has none
    document = _bench(engine).run()
    env = document["environment"]
    target = floors.streamed_bytes(engine.pair.target)
    draft = floors.streamed_bytes(engine.pair.draft)
    assert env["copy_bandwidth_bytes_per_s"] == 5e8
    assert env["streamed_bytes"] == {"target": target, "draft": draft, "hybrid": None}
    by = {r["proposer"]: r for r in document["results"]}
    assert by["draft"]["round_floor_ms"] == pytest.approx((target + 2 * draft) / 5e8 * 1e3)
    assert by["ngram"]["round_floor_ms"] == pytest.approx(target / 5e8 * 1e3)
    assert by["hybrid"]["round_floor_ms"] is None and by["hybrid"]["round_over_floor"] is None
    for proposer in ("draft", "ngram"):
        row = by[proposer]
        assert row["round_over_floor"] == pytest.approx(row["round_ms"]["total"] / row["round_floor_ms"])


def test_bench_reports_no_floor_where_there_is_no_bandwidth(engine):
    document = _bench(engine, ("draft",)).run()
    assert document["environment"]["copy_bandwidth_bytes_per_s"] is None
    assert document["results"][0]["round_floor_ms"] is None and document["results"][0]["round_over_floor"] is None


@GPU
def test_the_copy_bandwidth_on_the_gpu():
    bandwidth = floors.copy_bandwidth(torch.device("cuda"))
    assert bandwidth is not None and 1e11 < bandwidth < 2e13  # bytes/s: between 0.1 and 20 TB/s


def test_offloaded_weights_count_as_loaded_ones():
    """Weights on the meta device (offloaded by accelerate) all have data_ptr 0: the count goes by
    the parameter objects, so they are not mistaken for the embedding."""
    for tied in (False, True):
        with torch.device("meta"):
            meta = _llama(tied)
        assert floors.streamed_bytes(meta) == floors.streamed_bytes(_llama(tied)) > 0
