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


def load(folder: Path, config: StepConfig, dtype: torch.dtype, device: torch.device,
         layout: dict[str, torch.device] | None = None) -> OwnedModel:
    """Raises ValueError for a tensor the checkpoint lacks, one no layer has a place for, or one of
    another shape than config.json says. layout: module name -> device, for a model over several
    GPUs (see `spread`); None: every weight on `device`."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
        "model.safetensors"]
    state = {}
    for name in files:
        state.update(load_file(folder / name, device="cpu" if layout else str(device)))
    state = {key: value.to(dtype) for key, value in state.items() if not key.endswith("rotary_emb.inv_freq")}
    if layout:
        state = {key: value.to(_device_of(key, layout)) for key, value in state.items()}
        device = _device_of("model.embed_tokens.weight", layout)  # where a step starts: the rotary tables
    return from_state(config, state, device, _generation(folder))


def from_state(config: StepConfig, state: dict, device: torch.device,
               generation: GenerationDefaults = GenerationDefaults(None)) -> OwnedModel:
    """An owned model over `state` (tensor name -> tensor, in the model's dtype, where they lie;
    the rotary table goes to `device`). Raises ValueError as `load` says."""
    state = {key: value for key, value in state.items() if not key.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):  # no memory for weights that the checkpoint's replace at once
        model = model_class(config)(config, generation)
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


def spread(config: StepConfig, dtype: torch.dtype, strategy: str, memory: dict | None) -> dict[str, torch.device]:
    """Module name -> device for a device_map strategy (auto, balanced, balanced_low_0, sequential)
    and a max_memory, as transformers places a model for those: accelerate's planner over the
    owned model's modules, a decoder layer never split. A module placed on the CPU or the disk
    comes back as such (the caller refuses: specgen steps models on GPUs only)."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    with torch.device("meta"):
        model = model_class(config)(config, GenerationDefaults(None)).to(dtype)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # planned as one tensor, as loaded
    keep = [model.layer.__name__]
    if strategy != "sequential":
        memory = get_balanced_memory(model, max_memory=memory, no_split_module_classes=keep, dtype=dtype,
                                     low_zero=strategy == "balanced_low_0")
    plan = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=keep, dtype=dtype)
    return {name: torch.device(f"cuda:{where}" if isinstance(where, int) else where) for name, where in plan.items()}


def _device_of(tensor: str, layout: dict[str, torch.device]) -> torch.device:
    """The device of the longest module name in `layout` that contains `tensor`."""
    parts = tensor.split(".")
    for end in range(len(parts), -1, -1):
        name = ".".join(parts[:end])
        if name in layout:
            return layout[name]
    return next(iter(layout.values()))  # a tensor of no module here: the name check below refuses it


def _generation(folder: Path) -> GenerationDefaults:
    """EOS ids where transformers finds them: generation_config.json if there is one, else config.json."""
    path = folder / "generation_config.json"
    path = path if path.is_file() else folder / "config.json"
    return GenerationDefaults(json.loads(path.read_text(encoding="utf-8")).get("eos_token_id"))
