"""EAGLE-3 head checkpoints: the speculators format (written and read) and the original EAGLE-3
repository's format (read).

- speculators (vLLM's `speculators` library; vLLM loads it as is, with `--speculative-config
  '{"model": DIR}'`): config.json with `"architectures": ["Eagle3Speculator"]`,
  `"speculators_model_type": "eagle3"`, the layer's shape in `transformer_layer_config`, and
  `speculators_config` naming the verifier; weights `fc.weight`, `layers.0.*`, `norm.weight`,
  `lm_head.weight`, `d2t`, `t2d` (and optionally `embed_tokens.weight`).
- EAGLE-3 (SafeAILab/EAGLE, SpecForge, SGLang): a flat Llama-style config.json with
  `"architectures": ["LlamaForCausalLMEagle3"]`, `vocab_size` (the target's), `draft_vocab_size`,
  optional `target_hidden_size` and `eagle_config.eagle_aux_hidden_state_layer_ids`; the decoder
  layer's weights are named `midlayer.*`. Its layer ids count one lower than vLLM's (SGLang adds
  1 when it reads them): id i is the output of decoder layer i.

docs/models.md, "EAGLE-3 heads: checkpoint formats", has the table field by field and its sources.
Weights are read from and written to safetensors only, never pickle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

from specgen.core.models.checkpoints import HEAD_HINT, check_head_folder
from specgen.core.drafters.eagle import Eagle3Config, Eagle3Head
from specgen.core.errors import UsageError

SPECULATORS = "Eagle3Speculator"
# newer speculators releases name the same format's class Eagle3DraftModel
SPECULATORS_ARCHITECTURES = (SPECULATORS, "Eagle3DraftModel")
ORIGINAL = "LlamaForCausalLMEagle3"
EMBEDDING = "embed_tokens.weight"


def save_speculators(head: Eagle3Head, folder: Path | str, verifier_name: str,
                     verifier_architectures: Sequence[str] = (), speculative_tokens: int = 3) -> Path:
    """Write `config.json` + `model.safetensors` in the speculators format (the head's own
    embedding too when it has one; a head that shares the target's leaves it out, and vLLM then
    shares the target's as well). Returns the folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().cpu().contiguous() for name, t in head.state_dict().items()}
    if head.owns_embedding:
        tensors[EMBEDDING] = head.embedding.detach().cpu().contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    dtype = str(head.fc.weight.dtype).removeprefix("torch.")
    config = speculators_config(head.config, verifier_name, list(verifier_architectures), speculative_tokens, dtype)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def speculators_config(config: Eagle3Config, verifier_name: str, verifier_architectures: list[str],
                       speculative_tokens: int, dtype: str) -> dict[str, Any]:
    layer = {
        "model_type": "llama", "num_hidden_layers": 1, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling, "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.target_vocab_size,
    }
    out = {
        "architectures": [SPECULATORS],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "norm_before_residual": config.norm_before_residual,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier_name, "architectures": verifier_architectures},
        },
        "torch_dtype": dtype,
    }
    if config.aux_layer_ids is not None:  # absent: the reader takes EAGLE-3's default for the target
        out["eagle_aux_hidden_state_layer_ids"] = list(config.aux_layer_ids)
    return out


def load_head(folder: Path | str, embedding: torch.Tensor | None = None, capacity: int | None = None,
              device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Eagle3Head:
    """Load a head in either format. `embedding` is the target's `embed_tokens` weight; a
    checkpoint that carries its own copy uses that one instead. dtype: the checkpoint's by default;
    capacity: the KV cache's positions (default max_position_embeddings; `reserve` changes it)."""
    folder = Path(folder)
    kind, config = read_config(folder)
    tensors = read_weights(folder, kind)
    own = tensors.pop(EMBEDDING, None)
    if own is None and embedding is None:
        raise UsageError(f"{folder} carries no {EMBEDDING} and no target embedding was given",
                         hint="load the head together with its target, whose embedding it shares")
    if own is not None and tuple(own.shape) != (config.target_vocab_size, config.hidden_size):
        raise UsageError(f"{folder}: `{EMBEDDING}` has shape {list(own.shape)} but config.json implies "
                         f"[{config.target_vocab_size}, {config.hidden_size}]", hint=_REEXPORT)
    table = own if own is not None else embedding
    if tuple(table.shape) != (config.target_vocab_size, config.hidden_size):
        raise UsageError(f"head {folder} needs a [{config.target_vocab_size}, {config.hidden_size}] embedding but "
                         f"the target's is {list(table.shape)}: the head was made for another target",
                         hint="train a head for this target with `specgen train-head`")
    dtype = dtype or tensors["fc.weight"].dtype
    try:
        # a one-slot cache until the head has its device and dtype: a real head's
        # max_position_embeddings would allocate a float32 cache of that length first
        head = Eagle3Head(config, table.to(device=device, dtype=dtype), capacity=1, owns_embedding=own is not None)
    except ValueError as exc:  # what only building the head finds out (a rope_scaling type)
        raise UsageError(f"{folder / 'config.json'}: {exc}", hint=_REEXPORT) from None
    _check_shapes(folder, head, tensors)
    if "d2t" not in tensors:
        head.identity_vocab()
    head.load_state_dict(tensors, strict=False)  # every key was checked above; d2t/t2d may be absent
    _check_vocab_maps(folder, head)
    head.to(device=device, dtype=dtype).reserve(capacity or config.max_position_embeddings)
    return head


def read_config(folder: Path) -> tuple[str, Eagle3Config]:
    """(format, config): format is "speculators" or "eagle3"."""
    check_head_folder(folder)
    path = folder / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it as JSON ({exc})", hint=HEAD_HINT) from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: not a JSON object", hint=HEAD_HINT)
    kind = _format(path, raw)
    try:
        config = _speculators_fields(raw) if kind == "speculators" else _original_fields(raw)
    except KeyError as exc:
        raise UsageError(f"{path}: missing `{exc.args[0]}`", hint=_REEXPORT) from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{path}: {exc}", hint=_REEXPORT) from None
    return kind, config


_REEXPORT = "the checkpoint is incomplete or damaged: export the head again"


def _format(path: Path, raw: dict) -> str:
    archs = raw.get("architectures") or []
    model_type = raw.get("speculators_model_type")
    if model_type == "eagle3" or any(a in SPECULATORS_ARCHITECTURES for a in archs):
        if model_type != "eagle3":
            raise UsageError(f"{path}: speculators model type `{model_type}` is not an EAGLE-3 head (`eagle3`)",
                             hint=HEAD_HINT)
        return "speculators"
    if ORIGINAL in archs:
        return "eagle3"
    named = ", ".join(map(str, archs)) or "none"
    raise UsageError(f"{path}: architecture {named} is not an EAGLE-3 head; specgen reads "
                     f"{SPECULATORS} (speculators) and {ORIGINAL} (EAGLE-3)", hint=HEAD_HINT)


def _layer_fields(layer: dict) -> dict[str, Any]:
    """The decoder layer's shape, from a Llama-style config dict; refuses what the head lacks."""
    unsupported = {"num_hidden_layers": 1, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
    for key, wanted in unsupported.items():
        if layer.get(key, wanted) != wanted:
            raise ValueError(f"{key} = {json.dumps(layer[key])} is not supported: specgen's EAGLE-3 head "
                             f"is one Llama layer ({key} = {json.dumps(wanted)})")
    heads, hidden = layer["num_attention_heads"], layer["hidden_size"]
    whole = all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (heads, hidden))
    return {
        "hidden_size": hidden, "intermediate_size": layer["intermediate_size"],
        "num_attention_heads": heads, "num_key_value_heads": layer.get("num_key_value_heads", heads),
        # else Eagle3Config names the field that is not a positive integer
        "head_dim": layer.get("head_dim") or (hidden // heads if whole else None),
        "rms_norm_eps": float(layer.get("rms_norm_eps", 1e-6)), "rope_theta": float(layer.get("rope_theta", 10000.0)),
        "rope_scaling": layer.get("rope_scaling"),
        "max_position_embeddings": layer.get("max_position_embeddings", 2048),
        "target_vocab_size": layer["vocab_size"],
    }


def _speculators_fields(raw: dict) -> Eagle3Config:
    layer = raw["transformer_layer_config"]
    if not isinstance(layer, dict):
        raise TypeError("transformer_layer_config must be an object")
    if raw.get("norm_before_fc"):
        raise ValueError("norm_before_fc = true is not supported (an RMSNorm over the aux states)")
    try:
        fields = _layer_fields(layer)
    except KeyError as exc:
        raise KeyError(f"transformer_layer_config.{exc.args[0]}") from None
    ids = raw.get("eagle_aux_hidden_state_layer_ids")
    return Eagle3Config(**fields, draft_vocab_size=raw["draft_vocab_size"],
                        target_hidden_size=raw.get("target_hidden_size") or fields["hidden_size"],
                        aux_layer_ids=tuple(ids) if ids else None,
                        norm_before_residual=bool(raw.get("norm_before_residual", False)))


def _original_fields(raw: dict) -> Eagle3Config:
    fields = _layer_fields(raw)
    ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids and not all(isinstance(i, int) for i in ids):
        raise ValueError(f"eagle_config.eagle_aux_hidden_state_layer_ids = {ids} must be integers")
    return Eagle3Config(**fields, draft_vocab_size=raw.get("draft_vocab_size") or fields["target_vocab_size"],
                        target_hidden_size=raw.get("target_hidden_size") or fields["hidden_size"],
                        # this format names the layer whose output is taken: one less than the input's id
                        aux_layer_ids=tuple(i + 1 for i in ids) if ids else None)


def read_weights(folder: Path, kind: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's *.safetensors files, named as the speculators format names them."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        hint = (f"specgen reads safetensors only, not {pickled[0]}: convert it with safetensors' "
                "save_file on a machine you trust" if pickled else _REEXPORT)
        raise UsageError(f"{folder} contains no weights (*.safetensors)", hint=hint)
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            part = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise UsageError(f"{path}: not a readable safetensors file ({exc})", hint=_REEXPORT) from None
        for name, tensor in part.items():
            if kind == "eagle3" and name.startswith("midlayer."):
                name = "layers.0." + name.removeprefix("midlayer.")
            if name in tensors:
                raise UsageError(f"{folder}: weight `{name}` appears twice", hint=_REEXPORT)
            tensors[name] = tensor
    return tensors


def _check_shapes(folder: Path, head: Eagle3Head, tensors: dict[str, torch.Tensor]) -> None:
    wanted = head.state_dict()
    missing = [name for name in wanted if name not in tensors]
    maps = [name for name in ("d2t", "t2d") if name in missing]
    if len(maps) == 2 and head.config.draft_vocab_size == head.config.target_vocab_size:
        missing = [name for name in missing if name not in maps]  # the draft vocabulary is the target's
    if missing:
        raise UsageError(f"{folder}: missing weights {', '.join(missing)}", hint=_REEXPORT)
    unexpected = [name for name in tensors if name not in wanted]
    if unexpected:
        raise UsageError(f"{folder}: unexpected weights {', '.join(unexpected)} (parts specgen's EAGLE-3 head "
                         "does not have)", hint="the head has a variant of the EAGLE-3 layer that specgen cannot run")
    for name, tensor in tensors.items():
        if tensor.shape != wanted[name].shape:
            raise UsageError(f"{folder}: `{name}` has shape {list(tensor.shape)} but config.json implies "
                             f"{list(wanted[name].shape)}", hint=_REEXPORT)


def _check_vocab_maps(folder: Path, head: Eagle3Head) -> None:
    """d2t must send the draft vocabulary to distinct target ids, exactly those t2d marks."""
    targets = torch.arange(head.config.draft_vocab_size) + head.d2t
    inside = bool(((targets >= 0) & (targets < head.config.target_vocab_size)).all())
    marked = torch.zeros_like(head.t2d)
    if inside:
        marked[targets] = True
    if not inside or targets.unique().numel() != targets.numel() or not torch.equal(marked, head.t2d):
        raise UsageError(f"{folder}: d2t and t2d do not describe the same draft vocabulary "
                         "(target id = draft id + d2t[draft id], t2d marks exactly those ids)", hint=_REEXPORT)


def check_against(config: Eagle3Config, target_config: Any, where: str = "the head") -> Eagle3Config:
    """The head's config, with its aux layers resolved, if it fits the target; else a UsageError."""
    hint = "train a head for this target with `specgen train-head`"
    hidden, vocab = target_config.hidden_size, target_config.vocab_size
    if hidden != config.target_hidden_size:
        raise UsageError(f"{where} reads hidden states of width {config.target_hidden_size} but the target's "
                         f"hidden size is {hidden}: it was made for another target", hint=hint)
    if vocab != config.target_vocab_size:
        raise UsageError(f"{where} maps to a {config.target_vocab_size}-token vocabulary but the target has "
                         f"{vocab} tokens: it was made for another target", hint=hint)
    layers = target_config.num_hidden_layers
    ids = config.layers_for(layers)
    if any(not 0 <= i < layers for i in ids):
        raise UsageError(f"{where} reads the target's layers {list(ids)} but the target has {layers} "
                         f"(ids 0 to {layers - 1})", hint=hint)
    return config.replace(aux_layer_ids=ids)
