"""Multi-token-prediction (MTP) layers read straight from a checkpoint's safetensors files.

DeepSeek-V3 and GLM-4.5 ship MTP modules inside their checkpoints, stored as extra decoder layers
after the last one; transformers drops those tensors when it loads the model. This module reads
them (and nothing else but the embedding and lm head they may share) and runs them as a drafter.

One MTP step at position t reads h_t, the target's last hidden state at t (after its final norm:
what its lm head reads), and the id x_{t+1}, and predicts x_{t+2} (DeepSeek-V3 report, §2.2):

    h'_t   = eh_proj(concat(enorm(embed(x_{t+1})), hnorm(h_t)))
    o_t    = the family's own decoder layer (MLA/MoE for DeepSeek-V3) over h', causal
    logits = head(shared_head.norm(o_t))

It returns (logits, o_t): a second step chains on o_t at position t+1 with the drafted id, as
the report's depth k+1 reads depth k's output. Entry t of an `MtpCache` belongs to the pair
(x_{t+1}, h_t) at rotary position t, so rolling back to a length drops the pairs past it.
"""

from __future__ import annotations

import copy
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from specgen.core.errors import UsageError

MAIN_EMBED = "model.embed_tokens.weight"
MAIN_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class MtpLayout:
    """Where one family keeps its MTP tensors. Names take {n} = num_hidden_layers + MTP index."""

    module: str   # transformers.models.<module>.modeling_<module>
    decoder: str  # that module's decoder-layer class
    rotary: str   # and its rotary embedding class
    count: str = "num_nextn_predict_layers"
    enorm: str = "model.layers.{n}.enorm.weight"
    hnorm: str = "model.layers.{n}.hnorm.weight"
    proj: str = "model.layers.{n}.eh_proj.weight"
    norm: str = "model.layers.{n}.shared_head.norm.weight"
    block: str = "model.layers.{n}."  # the decoder layer's own tensors: the rest under this prefix
    # the module's own copies, read when present, else the main model's (vLLM keeps the first)
    head: tuple[str, ...] = ("model.layers.{n}.shared_head.head.weight",)
    embed: tuple[str, ...] = ("model.layers.{n}.embed_tokens.weight",)

    def names(self, n: int) -> dict[str, str]:
        return {part: getattr(self, part).format(n=n) for part in ("enorm", "hnorm", "proj", "norm")}


# model_type -> layout. DeepSeek-V3 and GLM-4.5 (glm4_moe) share the layer-N layout.
LAYOUTS = {
    "deepseek_v3": MtpLayout("deepseek_v3", "DeepseekV3DecoderLayer", "DeepseekV3RotaryEmbedding"),
    "glm4_moe": MtpLayout("glm4_moe", "Glm4MoeDecoderLayer", "Glm4MoeRotaryEmbedding"),
}


@dataclass
class MtpWeights:
    """One MTP layer's tensors as stored; `block` is keyed relative to the layout's block prefix."""

    index: int
    names: dict[str, str]  # part -> the checkpoint name it was read from
    enorm: torch.Tensor
    hnorm: torch.Tensor
    proj: torch.Tensor
    norm: torch.Tensor
    embed: torch.Tensor
    head: torch.Tensor
    block: dict[str, torch.Tensor] = field(default_factory=dict)


def _layout(config) -> MtpLayout:
    layout = LAYOUTS.get(getattr(config, "model_type", None))
    if layout is None:
        raise UsageError(f"MTP layers of model type {getattr(config, 'model_type', '?')!r} are not supported "
                         f"(known: {', '.join(sorted(LAYOUTS))}); use another proposer")
    return layout


def mtp_layers(config) -> int:
    """How many MTP layers the config declares; a UsageError when it declares none."""
    count_key = LAYOUTS[config.model_type].count if getattr(config, "model_type", None) in LAYOUTS \
        else "num_nextn_predict_layers"
    count = getattr(config, count_key, None)
    if not count:
        state = "is 0" if count == 0 else "is missing"
        raise UsageError(f"{count_key} {state} in the {getattr(config, 'model_type', '?')} config: "
                         "this checkpoint ships no MTP layers; use another proposer")
    _layout(config)
    return int(count)


def declared(folder) -> SimpleNamespace:
    """The checkpoint's config.json as attributes (what mtp_layers reads: its model type and MTP
    layer count), whichever code runs the target: specgen's own Llama keeps neither."""
    return SimpleNamespace(**json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))


class _Checkpoint:
    """The safetensors files of one folder, opened lazily, one file at a time as names need them."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        self.folder, self._open, self._handles = folder, safe_open, {}
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            self.where = {name: folder / file for name, file in json.loads(index.read_text())["weight_map"].items()}
        elif (folder / "model.safetensors").is_file():
            self.where = {name: folder / "model.safetensors" for name in self._file(folder / "model.safetensors").keys()}
        else:
            raise UsageError(f"{folder} holds neither model.safetensors nor model.safetensors.index.json: "
                             "MTP layers are read from safetensors checkpoints only")

    def _file(self, path: Path):
        if path not in self._handles:
            self._handles[path] = self._open(str(path), framework="pt", device="cpu")
        return self._handles[path]

    def get(self, name: str) -> torch.Tensor:
        return self._file(self.where[name]).get_tensor(name)

    def first(self, names: list[str], what: str) -> tuple[str, torch.Tensor]:
        for name in names:
            if name in self.where:
                return name, self.get(name)
        raise UsageError(f"{self.folder}: MTP {what} missing from the safetensors files "
                         f"(looked for {', '.join(names)})")


def find_mtp_weights(folder, config) -> list[MtpWeights]:
    """Every MTP layer's tensors, read from the checkpoint's safetensors files without the rest."""
    count, layout, ckpt = mtp_layers(config), _layout(config), _Checkpoint(Path(folder))
    main_head = [MAIN_HEAD] + ([MAIN_EMBED] if getattr(config, "tie_word_embeddings", False) else [])
    found = []
    for index in range(count):
        n = config.num_hidden_layers + index
        names = layout.names(n)
        missing = [name for name in names.values() if name not in ckpt.where]
        if missing:
            raise UsageError(f"{folder}: MTP layer {index} weights missing from the safetensors files "
                             f"(looked for {', '.join(missing)})")
        parts = {part: ckpt.get(name) for part, name in names.items()}
        names["embed"], parts["embed"] = ckpt.first([p.format(n=n) for p in layout.embed] + [MAIN_EMBED], "embedding")
        names["head"], parts["head"] = ckpt.first([p.format(n=n) for p in layout.head] + main_head, "lm head")
        prefix, own = layout.block.format(n=n), set(names.values())
        block = {name[len(prefix):]: ckpt.get(name) for name in ckpt.where
                 if name.startswith(prefix) and name not in own}
        names["block"] = prefix
        if not block:
            raise UsageError(f"{folder}: MTP layer {index} has no decoder-layer tensors (looked for {prefix}*)")
        found.append(MtpWeights(index, names, block=block, **parts))
    return found


def _layer_config(config, n: int):
    """The config one MTP decoder layer is built from, as layer 0 of a one-layer model.

    Layer 0 so that its cache index is 0; the MLP kind is kept from its true index n (dense
    below first_k_dense_replace, MoE from there, as vLLM builds it from the layer-N prefix).
    """
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "first_k_dense_replace", None) is not None:
        cfg.first_k_dense_replace = 1 if n < config.first_k_dense_replace else 0
    cfg._attn_implementation = "sdpa"
    return cfg


class MtpCache:
    """The MTP layer's own KV cache: entry t belongs to the pair (x_{t+1}, h_t)."""

    def __init__(self):
        from transformers import DynamicCache

        self._new = DynamicCache
        self.kv = DynamicCache()

    @property
    def length(self) -> int:
        return self.kv.get_seq_length()

    def rollback(self, length: int) -> None:
        """Drop every entry from `length` on (rejected drafts)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll the MTP cache back to {length}: it holds {self.length}")
        self.kv.crop(length - self.length)  # negative: drop that many

    def reset(self) -> None:
        self.kv = self._new()


class MtpLayer(nn.Module):
    """One MTP layer: enorm/hnorm/eh_proj, the family's decoder layer, shared_head.norm, the head."""

    def __init__(self, config, index: int = 0):
        super().__init__()
        layout, n = _layout(config), config.num_hidden_layers + index
        cfg = _layer_config(config, n)
        modeling = importlib.import_module(f"transformers.models.{layout.module}.modeling_{layout.module}")
        hidden, vocab = cfg.hidden_size, cfg.vocab_size
        self.config, self.index = cfg, index
        self.block = getattr(modeling, layout.decoder)(cfg, 0)
        from specgen.core.models.loading import cache_keyword

        self.cache_keyword = cache_keyword(type(self.block).forward)
        norm = type(self.block.input_layernorm)  # the family's own RMSNorm
        self.enorm, self.hnorm, self.norm = (norm(hidden, eps=cfg.rms_norm_eps) for _ in range(3))
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.rotary = getattr(modeling, layout.rotary)(config=cfg)

    def new_cache(self) -> MtpCache:
        return MtpCache()

    def forward(self, ids: torch.Tensor, hidden: torch.Tensor, cache: MtpCache | None = None,
                positions: torch.Tensor | None = None, seen: torch.Tensor | None = None):
        """ids [B, T] (x_{t+1}), hidden [B, T, H] (h_t) -> logits [B, T, V], output [B, T, H].

        Without positions and seen: a chain appended to the cache, entry past + i at position
        past + i, causal. A token tree's rows give both: positions [B, T] each row's rotary
        position, seen [B, T, past + T] bool the cache entries (the rows' own included, appended
        after the cached ones in order) each row attends to (MtpDrafter.step_rows)."""
        batch, steps = ids.shape
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + steps, device=ids.device).expand(batch, steps)  # [B, T]
        x = self.proj(torch.cat([self.enorm(self.embed(ids)), self.hnorm(hidden.to(self.proj.weight.dtype))], -1))
        mask = self._mask(past, steps, x) if seen is None else self._additive(seen, x)[:, None]
        out = self.block(x, attention_mask=mask, position_ids=positions,
                         **{self.cache_keyword: cache.kv if cache is not None else None}, use_cache=cache is not None,
                         position_embeddings=self.rotary(x, positions))
        return self.head(self.norm(out)), out

    @staticmethod
    def _mask(past: int, steps: int, x: torch.Tensor) -> torch.Tensor:
        """Additive causal mask over the cached and new keys: [1, 1, T, past+T]."""
        rows = torch.arange(steps, device=x.device)[:, None] + past
        keys = torch.arange(past + steps, device=x.device)[None, :]
        return MtpLayer._additive(keys <= rows, x)[None, None]

    @staticmethod
    def _additive(seen: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """seen (bool) as an additive mask in x's dtype: 0 where seen, the dtype's min elsewhere."""
        blocked = torch.full((), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device)
        return torch.where(seen, torch.zeros((), dtype=x.dtype, device=x.device), blocked)

    def load(self, weights: MtpWeights, folder="the checkpoint") -> MtpLayer:
        """Copy the stored tensors in, exactly (cast to the module's dtype); one-line errors."""
        for part in ("enorm", "hnorm", "proj", "norm", "embed", "head"):
            target = getattr(self, part).weight
            _copy(target, getattr(weights, part), weights.names[part], folder)
        _load_block(self.block, weights, folder)
        return self


def _copy(target: torch.Tensor, tensor: torch.Tensor, name: str, folder) -> None:
    if tuple(tensor.shape) != tuple(target.shape):
        raise UsageError(f"{folder}: MTP tensor {name} has shape {list(tensor.shape)}, "
                         f"the config needs {list(target.shape)}: does config.json belong to these weights?")
    with torch.no_grad():
        target.copy_(tensor)


def _stored_experts(name: str, count: int, stored: dict, used: set) -> torch.Tensor | None:
    """transformers fuses experts into 3-D tensors; checkpoints keep one tensor per expert."""
    prefix, _, fused = name.rpartition(".")
    parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}.get(fused)
    if parts is None or not prefix.endswith("experts"):
        return None
    names = [[f"{prefix}.{e}.{p}.weight" for p in parts] for e in range(count)]
    if not all(n in stored for row in names for n in row):
        return None
    used.update(n for row in names for n in row)
    return torch.stack([torch.cat([stored[n] for n in row]) for row in names])


def _load_block(block: nn.Module, weights: MtpWeights, folder) -> None:
    stored, used, missing, prefix = weights.block, set(), [], weights.names["block"]
    for name, target in block.state_dict(keep_vars=True).items():
        tensor = stored.get(name)
        if tensor is not None:
            used.add(name)
        else:
            tensor = _stored_experts(name, target.shape[0], stored, used)
        if tensor is None:
            missing.append(prefix + name)
            continue
        _copy(target, tensor, prefix + name, folder)
    if missing:
        raise UsageError(f"{folder}: MTP layer {weights.index} weights missing from the safetensors files "
                         f"(looked for {', '.join(missing)})")
    extra = sorted(set(stored) - used)
    if extra:
        raise UsageError(f"{folder}: MTP layer {weights.index} has tensors the decoder layer does not take "
                         f"({', '.join(prefix + n for n in extra[:4])}{' ...' if len(extra) > 4 else ''}); "
                         "quantized checkpoints are not supported")


def _to_dtype(layer: MtpLayer, dtype: torch.dtype) -> MtpLayer:
    """Cast, keeping in float32 what the family's model keeps there (DeepSeek-V3's router bias:
    in bfloat16 its rounding changes which experts tokens go to)."""
    layout = _layout(layer.config)
    modeling = importlib.import_module(f"transformers.models.{layout.module}.modeling_{layout.module}")
    pretrained = getattr(modeling, layout.decoder.replace("DecoderLayer", "PreTrainedModel"), None)
    keep = getattr(pretrained, "_keep_in_fp32_modules_strict", None) or []
    layer.to(dtype)
    for module in layer.modules():
        for key, tensor in {**module._parameters, **module._buffers}.items():
            if tensor is not None and key in keep:
                tensor.data = tensor.data.float()
    return layer


def load_mtp_layers(folder, config, dtype: torch.dtype = torch.float32) -> list[MtpLayer]:
    """Every MTP layer of a checkpoint, loaded in `dtype` (cast from what is stored), in eval mode."""
    return [_to_dtype(MtpLayer(config, w.index), dtype).load(w, folder).eval()
            for w in find_mtp_weights(folder, config)]
