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


# -- batches: the weights once a step, and each row's keys and values (floors.batch_bytes) ---------

LLAMA_3_1_8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}
LLAMA_3_2_1B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True}
# by hand: a layer's q and o (H x H), k and v (H x kv heads x head dim), gate, up, down (3 x H x I), two norms
# (2 H); then the final norm (H) and the output projection (V x H); 2 bytes each (bfloat16)
LLAMA_3_1_8B_STREAMED = 2 * (32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
                             + 4096 + 128256 * 4096)
LLAMA_3_2_1B_STREAMED = 2 * (16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048)
                             + 2048 + 128256 * 2048)


def _owned(config: dict):
    from specgen.core.step import config as step_config
    from specgen.core.step.llama import LlamaModel
    from specgen.core.step.model import GenerationDefaults

    with torch.device("meta"):  # the shapes alone: nothing is allocated
        return LlamaModel(step_config.of(config), GenerationDefaults(None)).to(torch.bfloat16)


def test_the_llama_8b_and_1b_shapes_stream_what_a_hand_count_says():
    assert LLAMA_3_1_8B_STREAMED == 15_009_849_344 and LLAMA_3_2_1B_STREAMED == 2_471_628_800
    assert floors.streamed_bytes(_owned(LLAMA_3_1_8B)) == LLAMA_3_1_8B_STREAMED
    assert floors.streamed_bytes(_owned(LLAMA_3_2_1B)) == LLAMA_3_2_1B_STREAMED


def test_cache_bytes_per_position_of_the_llama_shapes():
    from specgen.core.step import config as step_config

    # 32 layers x 8 kv heads x 128 head dim x 2 (keys, values) x 2 bytes; 16 x 8 x 64 x 2 x 2
    assert floors.cache_bytes_per_position(step_config.of(LLAMA_3_1_8B), 2) == 131_072
    assert floors.cache_bytes_per_position(step_config.of(LLAMA_3_2_1B), 2) == 32_768
    assert floors.cache_bytes_per_position(step_config.of(LLAMA_3_2_1B), 4) == 65_536  # float32 caches
    model = _owned(LLAMA_3_1_8B)  # what batches.step_bytes reads: the model's config and dtype
    assert floors.cache_bytes_per_position(model.config, model.dtype.itemsize) == 131_072


def test_a_sliding_window_has_no_bytes_per_position():
    from specgen.core.step import config as step_config

    windowed = step_config.of({**LLAMA_3_1_8B, "model_type": "mistral", "sliding_window": 4096})
    assert any(w is not None for w in windowed.windows)
    assert floors.cache_bytes_per_position(windowed, 2) is None
    parts = floors.batch_bytes(floors.StepBytes(10, None), None, 0, rounds=1, rows=1, target_positions=5)
    assert parts == {"target": None, "draft": None}


def test_batch_bytes_of_8b_and_1b_rounds_by_hand():
    target = floors.StepBytes(LLAMA_3_1_8B_STREAMED, 131_072)
    draft = floors.StepBytes(LLAMA_3_2_1B_STREAMED, 32_768)
    # one target-only round of two rows at 400 and 600 cached positions: the weights once, 1,000 positions
    assert floors.batch_bytes(target, None, 0, rounds=1, rows=2, target_positions=1000) == {
        "target": 15_009_849_344 + 131_072 * 1000, "draft": None}
    assert 15_009_849_344 + 131_072 * 1000 == 15_140_921_344
    # a k=4 round of the same rows, the draft at 399 and 599: its four steps read 4 x 998 + 2 x (3 x 6 / 2)
    parts = floors.batch_bytes(target, draft, 4, rounds=1, rows=2, target_positions=1000, draft_positions=998)
    assert parts == {"target": 15_140_921_344, "draft": 4 * 2_471_628_800 + 32_768 * 4010}
    assert parts["draft"] == 10_017_914_880
    # rounds add up: 16 rounds of 16 rows, the same sums over them
    sixteen = floors.batch_bytes(target, draft, 4, rounds=16, rows=256, target_positions=16 * 8192,
                                 draft_positions=16 * 8176)
    assert sixteen["target"] == 16 * (15_009_849_344 + 131_072 * 8192)
    assert sixteen["draft"] == 16 * (4 * 2_471_628_800 + 32_768 * (4 * 8176 + 16 * 9))


def test_a_draft_step_reads_the_positions_before_it():
    """k steps of one row at P: P (two pending ids), then P + 2, P + 3, ..., P + k."""
    draft = floors.StepBytes(0, 1)
    for k in range(1, 7):
        expected = 10 + sum(10 + i + 1 for i in range(1, k))
        assert floors.batch_bytes(floors.StepBytes(0, 1), draft, k, rounds=1, rows=1, target_positions=0,
                                  draft_positions=10)["draft"] == expected
