"""Start-up: how the pair is placed on its device (docs/benchmarks.md, "Start-up of real pairs"),
and what loading prints."""

from __future__ import annotations

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from specgen.core import models
from specgen.core.settings import ModelSpec
from tiny_models import build_family


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The tiny Llama 3.1 pair (llama3 rope scaling: transformers runs it, not core/llama.py)."""
    return build_family(tmp_path_factory.mktemp("startup"), "llama-3.1")


def _placements(monkeypatch, device: torch.device, **spec) -> dict:
    """The keyword arguments load_model hands to from_pretrained for a checkpoint on `device`."""
    seen = {}

    def from_pretrained(loader, name, spec, **kwargs):
        seen.update(kwargs)
        return torch.nn.Module()

    monkeypatch.setattr(models, "_locate", lambda spec, allow_pickle, download: ("/checkpoint", True))
    monkeypatch.setattr(models, "resolve_device", lambda spec: device)
    monkeypatch.setattr(models, "_from_pretrained", from_pretrained)
    models.load_model(ModelSpec(path="/checkpoint", **spec), modeling="transformers")
    return seen


def test_a_cuda_load_reads_the_weights_onto_the_device(monkeypatch):
    """Without a device_map transformers builds the model on the CPU (over the file's pages) and
    `.to(device)` then copies tensor after tensor: the placement goes to from_pretrained."""
    cuda = torch.device("cuda", 1)
    assert _placements(monkeypatch, cuda)["device_map"] == {"": cuda}


def test_a_profiles_device_map_and_the_cpu_keep_their_placement(monkeypatch):
    assert _placements(monkeypatch, torch.device("cuda", 0), device_map="balanced")["device_map"] == "balanced"
    assert "device_map" not in _placements(monkeypatch, torch.device("cpu"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_model_placed_by_from_pretrained_computes_what_a_moved_one_does(pair):
    """Rotary frequencies (llama3 scaling) and other buffers built at load time land on the device
    with the weights."""
    from transformers import AutoModelForCausalLM

    spec = ModelSpec(path=str(pair / "target"), dtype="float32", device=str(DEVICE))
    placed = models.load_model(spec, modeling="transformers")
    moved = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch.float32).to(DEVICE).eval()
    ids = torch.tensor([[1, 5, 9, 40, 7, 3]], device=DEVICE)
    with torch.no_grad():
        assert torch.equal(placed(ids).logits, moved(ids).logits)
    assert {p.device for p in placed.parameters()} | {b.device for b in placed.buffers()} == {moved.device}


def test_loading_through_transformers_prints_no_progress_bars(pair, capsys):
    """stderr is specgen's: transformers' "Loading weights" bars stay off even when the tokenizer
    loaded without transformers (which used to be what turned them off)."""
    from transformers.utils import logging

    logging.enable_progress_bar()
    models.load_model(ModelSpec(path=str(pair / "target"), dtype="float32", device="cpu"), modeling="transformers")
    assert capsys.readouterr().err == ""
