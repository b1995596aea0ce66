"""Start-up: how the pair is placed on its device, what is loaded once instead of twice, what
loading prints, and the compile cache folder's checks (docs/benchmarks.md, "Start-up of real
pairs"; docs/errors.md for the compile cache's usage error)."""

from __future__ import annotations

import json
import os

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from specgen.core.models import loading as models
from specgen.core.settings import ModelSpec, Profile, ProposerSpec
from tiny_models import build_family, write_profile


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The tiny Llama 3.1 pair (llama3 rope scaling); its
    target and draft have the same tokenizer files."""
    return build_family(tmp_path_factory.mktemp("startup"), "llama-3.1")


def _placements(monkeypatch, device: torch.device, **spec) -> dict:
    """The keyword arguments load_model hands to from_pretrained for a checkpoint on `device`."""
    seen = {}

    def from_pretrained(loader, name, spec, **kwargs):
        seen.update(kwargs)
        return torch.nn.Module(), {}  # the model and its loading report (output_loading_info)

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


@pytest.mark.parametrize("asked, expected", [("auto", "cuda:1"), ("cuda", "cuda:1"), ("cuda:0", "cuda:0"), ("cpu", "cpu")])
def test_a_gpu_left_unnamed_is_the_current_one_named(monkeypatch, asked, expected):
    """'cuda' resolved at load: a device compared with the weights' own (always indexed) is the
    same GPU, and a backend that later makes another GPU current cannot move the pair."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert models.resolve_device(ModelSpec(path="/checkpoint", device=asked)) == torch.device(expected)


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


def _profile(pair, draft: str = "draft") -> Profile:
    spec = lambda role: ModelSpec(path=str(pair / role), dtype="float32", device="cpu")  # noqa: E731
    return Profile("startup", "<test>", spec("target"), spec(draft), proposer=ProposerSpec())


def _tokenizer_loads(monkeypatch) -> list[str]:
    loaded = []
    load = models.load_tokenizer

    def counting(spec, *args, **kwargs):
        loaded.append(spec.path)
        return load(spec, *args, **kwargs)

    monkeypatch.setattr(models, "load_tokenizer", counting)
    return loaded


def test_a_draft_with_the_targets_tokenizer_files_loads_no_tokenizer_of_its_own(pair, monkeypatch):
    loaded = _tokenizer_loads(monkeypatch)
    loaded_pair = models.load_pair(_profile(pair))
    assert loaded == [str(pair / "target")] and loaded_pair.draft is not None


def test_a_draft_whose_tokenizer_files_differ_is_loaded_and_checked(pair, tmp_path, monkeypatch):
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(pair / "draft", draft)
    config = json.loads((draft / "tokenizer_config.json").read_text())
    (draft / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    loaded = _tokenizer_loads(monkeypatch)
    models.load_pair(_profile(pair, draft=str(draft)))
    assert loaded == [str(pair / "target"), str(draft)]

    vocab = json.loads((draft / "tokenizer.json").read_text())
    first, second = sorted(vocab["model"]["vocab"], key=vocab["model"]["vocab"].get)[300:302]
    vocab["model"]["vocab"][first], vocab["model"]["vocab"][second] = (vocab["model"]["vocab"][second],
                                                                       vocab["model"]["vocab"][first])
    (draft / "tokenizer.json").write_text(json.dumps(vocab))
    with pytest.raises(models.ModelError, match="draft and target tokenizers differ"):
        models.load_pair(_profile(pair, draft=str(draft)))


# -- retired keys -----------------------------------------------------------------------------------


def test_compile_is_retired_with_a_one_line_error_naming_what_to_do(cli, tmp_path):
    """`compile = true` (or --compile) was an option; now a usage error that says it is gone,
    before any model loads. A profile written before, holding the default `compile = false`, loads."""
    profile = write_profile(tmp_path / "p.toml", tmp_path / "missing-target", None,
                            speculation={"compile": True}, proposer={"kind": "none"})
    code, out, err = cli("generate", "-p", profile, "hello")
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and "compile" in err and "remove it" in err
    quiet = write_profile(tmp_path / "q.toml", tmp_path / "missing-target", None,
                          speculation={"compile": False, "autotune": False, "compile_cache": ""},
                          proposer={"kind": "none"})
    code, _, err = cli("generate", "-p", quiet, "hello")  # the defaults: loads, then misses the model
    assert code == 1 and "missing-target not found" in err
    code, out, err = cli("generate", "-p", quiet, "--compile", "hello")
    assert (code, out) == (2, "") and err.startswith("specgen: error: --compile: torch.compile was removed")
    code, _, err = cli("generate", "-p", quiet, "--autotune", "hello")
    assert code == 2 and "--autotune" in err
