"""gpu/stages.py: a model over several devices, stepped and captured stretch by stretch.

The CPU tests cover what needs no second GPU: how a model is cut into units, the packed layout of
a transfer, the profile's max_memory and the draft's placement beside a spread target, and the
backend choice for offloaded models. The tests marked `cuda` need two GPUs: a spread pair decodes
the one-GPU pair's tokens (greedy and sampled) with its rounds captured as SegmentedGraphs, and a
target split over them gives bitwise the logits of the same target on one GPU (same kernels, same
reduction order: only where each layer runs differs).
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from decode_helpers import finish, make_profile, random_prompts
from specgen.core.models import loading as models
from specgen.core.backend import TorchBackend
from specgen.core.engine import make_backend
from specgen.core.settings import ModelSpec
from specgen.core.step.rows import Rows
from specgen.gpu import stages
from tiny_models import build_pair

two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("stages"), family="llama", noisy=0.1)


def load(path, layout=None, dtype=torch.float32):
    """specgen's own model of the checkpoint, on the CPU, or placed by `layout` (module name -> GPU
    index), as the loader places it for a device_map."""
    import json

    from specgen.core.step import config as step_config
    from specgen.core.step.load import load as load_owned

    config = step_config.of(json.loads((path / "config.json").read_text()))
    places = {name: torch.device("cuda", index) for name, index in layout.items()} if layout else None
    return load_owned(path, config, dtype, torch.device("cpu"), places)


# -- CPU ------------------------------------------------------------------------------------------


def test_units_are_the_largest_modules_on_one_device(pair):
    model = load(pair[0])
    assert stages.units(model) == [model]  # all on one device: the model is the unit
    model.model.layers[1].to("meta")
    model.model.norm.to("meta")
    model.lm_head.to("meta")
    inner = model.model
    assert stages.units(model) == [inner.embed_tokens, inner.layers[0], inner.layers[1], inner.norm, model.lm_head]
    assert stages.unit_device(inner.layers[1]) == torch.device("meta")


@pytest.mark.parametrize("devices, spread", [
    ({"cuda:0", "cuda:1"}, True),  # another GPU than home (cuda:1)
    ({"cuda:1"}, False),
    ({"cuda:1", "cpu"}, False),  # weights offloaded to the CPU: the torch backend's case, not Stages'
])
def test_a_model_is_spread_when_a_weight_lies_on_another_gpu(monkeypatch, devices, spread):
    monkeypatch.setattr(stages, "model_devices", lambda model: {torch.device(d) for d in devices})
    assert stages.spread(object(), torch.device("cuda", 1)) == spread


def test_stages_describe_where_each_unit_lies(pair):
    model = load(pair[0])
    for module in (model.model.layers[1], model.model.norm, model.lm_head):
        module.to("meta")
    described = stages.Stages(model, torch.device("meta")).describe()
    assert described == {"cpu": "Table, LlamaLayer", "meta": "LlamaLayer, RMSNorm, Table"}


def test_summary_counts_runs_of_one_kind():
    assert stages._summary(["A", "B", "B", "B", "C"]) == "A, 3 B, C"


def test_a_packed_transfer_gives_each_tensor_back_bit_for_bit():
    """Mixed dtypes and shapes, a non-contiguous source: each view of the buffer equals its tensor."""
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, 5, generator=generator).to(torch.bfloat16),
               torch.randint(0, 1000, (7,), generator=generator),
               torch.randn(4, 6, generator=generator)[:, ::2],  # strided
               torch.rand(2, 3, generator=generator) > 0.5,
               torch.tensor(41)]
    offsets, total = stages._layout(tensors)
    assert all(offset % stages.ALIGN == 0 for offset in offsets) and total % stages.ALIGN == 0
    buffer = torch.full((total,), 255, dtype=torch.uint8)
    for t, offset in zip(tensors, offsets):
        stages._view(buffer, offset, t).copy_(t)
    for t, offset in zip(tensors, offsets):
        view = stages._view(buffer, offset, t)
        assert view.dtype == t.dtype and view.shape == t.shape and torch.equal(view, t)


def test_a_segmented_graphs_summary_counts_graphs_copies_and_bytes():
    graph = stages.SegmentedGraph()
    a, b = torch.zeros(256, dtype=torch.uint8), torch.zeros(3, dtype=torch.int64)
    graph.parts = [stages._Part(torch.device("cuda", 1), None, [(a, a.clone()), (b, b.clone())]),
                   stages._Part(torch.device("cuda", 0), None, [(a, a.clone())]),
                   stages._Part(torch.device("cuda", 1), None, [])]
    assert graph.summary() == "3 graphs (cuda:1, cuda:0, cuda:1), 3 copies, 536 bytes"


def test_bring_maps_nested_arguments_and_leaves_others_alone():
    a, b = torch.zeros(2), torch.ones(2)
    moved = {(id(a), torch.device("cuda", 1)): b}
    rows = Rows(a, a, a, a, pending=True)  # a dataclass: every tensor field, the rest kept
    tree = ((a, "x", None), {"p": (a, 3), "q": [a]}, rows)
    out = stages._replace(tree, torch.device("cuda", 1), moved)
    assert out[0][0] is b and out[0][1] == "x" and out[1]["p"][0] is b and out[1]["q"][0] is b
    assert out[2].ids is b and out[2].start is b and out[2].tail is None and out[2].pending
    found = []
    stages._collect(rows, torch.device("cpu"), found)  # CUDA tensors only: CPU ones never cross
    assert found == []


def test_an_offloaded_model_runs_on_the_torch_backend(pair):
    """Weights on the CPU under a device_map (offload): the CUDA backend cannot capture them."""
    from transformers import AutoModelForCausalLM

    profile = make_profile(*pair)
    model = AutoModelForCausalLM.from_pretrained(str(pair[0]))
    backend = make_backend(torch.device("cuda", 0), profile, models=(model, None))
    assert isinstance(backend, TorchBackend)


def test_max_memory_reaches_from_pretrained_with_gpus_by_index():
    spec = ModelSpec("t", device_map="balanced", max_memory=(("0", "20GiB"), ("1", "1000"), ("cpu", "64GB")))
    assert models.placement(spec, torch.device("cuda", 0)) == {
        "device_map": "balanced", "max_memory": {0: "20GiB", 1: 1000, "cpu": "64GB"}}
    assert "max_memory" not in models.placement(ModelSpec("t", device_map="auto"), torch.device("cuda", 0))


def fake_target(device: str):
    weight = SimpleNamespace(device=torch.device(device))
    return SimpleNamespace(get_output_embeddings=lambda: SimpleNamespace(weight=weight))


def test_the_draft_goes_where_a_spread_targets_logits_come_out():
    target = ModelSpec("t", device_map="auto")
    draft = ModelSpec("d")
    assert models.beside(draft, target, fake_target("cuda:1")).device == "cuda:1"
    assert models.beside(replace(draft, device="cuda:0"), target, fake_target("cuda:1")).device == "cuda:0"
    assert models.beside(draft, ModelSpec("t"), fake_target("cuda:1")).device == "auto"  # no device_map
    assert models.beside(draft, target, fake_target("cpu")).device == "auto"  # offloaded to the CPU


# -- two GPUs ---------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def current_device():
    """The CUDA backend makes its device the current one: back to the one before for later tests."""
    saved = torch.cuda.current_device() if torch.cuda.is_available() else None
    yield
    if saved is not None:
        torch.cuda.set_device(saved)


SPLIT = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1, "lm_head": 1}


def backend_on(device, profile):
    from specgen.gpu.backend import CudaBackend

    return CudaBackend(device, profile)


@pytest.mark.cuda
@two_gpus
def test_a_capture_records_on_its_own_gpu_whichever_gpu_captured_first():
    """torch's default capture stream lies on the GPU of the process's first capture; a runner's
    capture for another GPU must not record there (the round's events would not wait for it)."""
    from specgen.gpu.capture import capturing

    for index in (1, 0):
        torch.cuda.set_device(index)
        x = torch.zeros(1024, device=torch.device("cuda", index))
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, x.device):
            assert torch.cuda.current_stream().device == x.device
            x.add_(1)
        graph.replay()
        torch.cuda.current_stream(x.device).synchronize()
        assert x.eq(1).all()


@pytest.mark.cuda
@two_gpus
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("graphs", [True, False])
def test_a_split_runner_steps_as_on_one_gpu_bit_for_bit(pair, dtype, graphs):
    """Prefill, then steps of 1 and 5 tokens: the split runner's logits equal the one-GPU runner's."""
    home = torch.device("cuda", 1)
    profile = make_profile(*pair, backend="cuda", speculation=dict(cuda_graphs=graphs))
    whole, split = load(pair[0], {"": 1}, dtype), load(pair[0], SPLIT, dtype)
    assert split.model.layers[1].input_layernorm.weight.device == torch.device("cuda", 1)
    width = whole.get_output_embeddings().weight.shape[0]
    outputs = []
    for model in (whole, split):
        backend = backend_on(home, profile)
        runner = backend.runner(model, width, 600, "target", shapes=(1, 5))
        if not graphs:
            runner.use_graphs = False
            runner.graphs = {}
        assert (runner.stages is not None) == (model is split)
        logits = [runner.forward(torch.tensor(list(range(3, 40)), device=home)).clone()]
        logits.append(runner.forward(torch.tensor([7], device=home)).clone())
        logits.append(runner.forward(torch.tensor([9, 4, 11, 2, 6], device=home)).clone())
        runner.truncate(runner.length - 3)  # a rollback, then a step over the rolled-back positions
        logits.append(runner.forward(torch.tensor([5, 8, 1], device=home)).clone())
        outputs.append(logits)
        if graphs and model is split:
            assert all(isinstance(g.graph, stages.SegmentedGraph) and len(g.graph.parts) >= 2
                       for g in runner.graphs.values())
    for mine, theirs in zip(*outputs):
        assert mine.device == home and torch.equal(mine, theirs)



@pytest.mark.cuda
@two_gpus
@pytest.mark.parametrize("settings", [dict(), dict(temperature=0.8, top_p=0.95, seed=3)])
def test_a_split_pair_decodes_the_one_gpu_pairs_tokens(pair, settings, monkeypatch):
    """The engine over a target split in two (its draft beside the target's output projection),
    rounds captured as SegmentedGraphs, against the same pair on GPU 1 alone."""
    from specgen.core.engine import Engine

    profile = make_profile(*pair, k=4, backend="cuda", max_tokens=40, **settings)
    profile = replace(profile, target=replace(profile.target, device="cuda:1"),
                      draft=replace(profile.draft, device="cuda:1"))
    results = []
    for split in (False, True):
        if split:  # the target's device_map: the planner's answer replaced by SPLIT
            profile = replace(profile, target=replace(profile.target, device_map="auto"))
            monkeypatch.setattr(models, "_layout", lambda spec, config, dtype: {
                name: torch.device("cuda", index) for name, index in SPLIT.items()})
        engine = Engine(profile)
        assert engine.backend.name == "cuda" and engine.pair.device == torch.device("cuda", 1)
        decoder = engine.decoder()
        program = next(iter(decoder.programs.values()))
        assert type(program).__name__ == "GraphProgram" and program.eager is None, engine.backend.notes
        graph = program.graphs[0][0]
        assert isinstance(graph, stages.SegmentedGraph) == split
        if split:
            placement = engine.describe()["placement"]["target"]
            assert set(placement["units"]) == {"cuda:0", "cuda:1"}
            assert placement["steps"]["64-token step"].startswith("3 graphs (cuda:1, cuda:0, cuda:1)")
            # a round: the draft's steps on GPU 1, the target's verification there and back
            assert placement["rounds"]["k=4 model"].startswith("3 graphs (cuda:1, cuda:0, cuda:1)")
        results.append([finish(decoder, prompt).token_ids for prompt in random_prompts(engine.pair.vocab_size, 4, 7)])
    assert results[0] == results[1]



@pytest.mark.cuda
@two_gpus
def test_a_draft_on_another_gpu_than_the_target_decodes_the_same_tokens(pair):
    """The profile puts the draft on GPU 0, the target on GPU 1: the draft's runner works from the
    round's GPU (Stages carries each of its steps there and back), and the pair decodes the tokens
    of the same pair on GPU 1 alone."""
    from specgen.core.engine import Engine

    profile = make_profile(*pair, k=4, backend="cuda", max_tokens=40)
    results = []
    for draft_device in ("cuda:1", "cuda:0"):
        placed = replace(profile, target=replace(profile.target, device="cuda:1"),
                         draft=replace(profile.draft, device=draft_device))
        engine = Engine(placed)
        assert engine.pair.device == torch.device("cuda", 1)
        decoder = engine.decoder()
        assert sorted(engine.backend.spread) == ([] if draft_device == "cuda:1" else ["draft"])
        results.append([finish(decoder, prompt).token_ids for prompt in random_prompts(engine.pair.vocab_size, 4, 7)])
    assert results[0] == results[1]
