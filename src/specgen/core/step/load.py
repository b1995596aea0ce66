"""An owned model from a checkpoint folder: config.json read by core/step/config.py, safetensors
weights placed by name (one file, or shards listed by an index), nothing from transformers."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specgen.core.step.config import StepConfig
from specgen.core.step.gemma2 import Gemma2Model
from specgen.core.step.llama import LlamaModel
from specgen.core.step.model import GenerationDefaults, OwnedModel


def model_class(config: StepConfig) -> type[OwnedModel]:
    return Gemma2Model if config.model_type == "gemma2" else LlamaModel


def load(folder: Path, config: StepConfig, dtype: torch.dtype, device: torch.device) -> OwnedModel:
    """Raises ValueError for a tensor the checkpoint lacks, one no layer has a place for, or one of
    another shape than config.json says."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
        "model.safetensors"]
    state = {}
    for name in files:
        state.update(load_file(folder / name, device=str(device)))
    state = {key: value.to(dtype) for key, value in state.items() if not key.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):  # no memory for weights that the checkpoint's replace at once
        model = model_class(config)(config, _generation(folder))
    model.inv_freq = model.inv_freq.to(device)
    expected = {name: p.shape for name, p in model.named_parameters()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing, unknown = set(expected) - set(state), set(state) - set(expected)
    if missing or unknown:
        raise ValueError(f"{len(missing)} tensors missing, e.g. {sorted(missing)[0]}" if missing else
                         f"{len(unknown)} tensors of no {config.model_type} layer, e.g. {sorted(unknown)[0]}")
    for name, shape in expected.items():
        if state[name].shape != shape:
            raise ValueError(f"`{name}` has shape {list(state[name].shape)} in the files but config.json implies "
                             f"{list(shape)}")
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def _generation(folder: Path) -> GenerationDefaults:
    """EOS ids where transformers finds them: generation_config.json if there is one, else config.json."""
    path = folder / "generation_config.json"
    path = path if path.is_file() else folder / "config.json"
    return GenerationDefaults(json.loads(path.read_text(encoding="utf-8")).get("eos_token_id"))
