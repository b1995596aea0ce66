"""An owned causal LM: embeddings, decoder layers, final norm and head, with one `step` over rows.

The family files (core/step/llama.py, core/step/gemma2.py) give the decoder layer; this class is
the rest, named as transformers names it (`model.embed_tokens`, `model.layers`, `model.norm`,
`lm_head`), so weights load by name and code that reads a target's embeddings, layers or config
reads an owned model the same way. Decoder layers and the final norm are called as modules, so
forward hooks (core/drafters/heads.py's hidden-state tap) see them as on transformers' models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specgen.core.step import rows as rowsets
from specgen.core.step.cache import SlotCache
from specgen.core.step.config import StepConfig, inv_freq
from specgen.core.step.ops import TorchOps
from specgen.core.step.parts import RMSNorm, Table
from specgen.core.step.rows import Rows

REFERENCE = TorchOps()


@dataclass(frozen=True)
class GenerationDefaults:
    """What specgen reads of a transformers GenerationConfig."""

    eos_token_id: int | list[int] | None


@dataclass
class Output:
    logits: torch.Tensor  # [B, n or logits_to_keep, V]


class Body(nn.Module):
    def __init__(self, config: StepConfig, layer: type):
        super().__init__()
        self.embed_tokens = Table(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, offset=config.sandwich)


class OwnedModel(nn.Module):
    layer: type  # the family's decoder layer

    def __init__(self, config: StepConfig, generation: GenerationDefaults):
        super().__init__()
        self.config, self.generation_config = config, generation
        self.model = Body(config, self.layer)
        self.lm_head = Table(config.vocab_size, config.hidden_size)
        # Not a buffer: Module.to(dtype) would round it; transformers keeps it in float32 too.
        self.inv_freq = inv_freq(config)
        self.embed_scale = config.hidden_size ** 0.5 if config.sandwich else None
        self.windowed = any(w is not None for w in config.windows)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def new_cache(self, batch: int, capacity: int) -> SlotCache:
        c = self.config
        devices = [layer.input_layernorm.weight.device for layer in self.model.layers]
        return SlotCache(c.num_hidden_layers, batch, c.num_key_value_heads, c.head_dim, capacity, self.dtype,
                         devices)

    def step(self, rows: Rows, cache: SlotCache, ops=REFERENCE, keep: int = 0, carry=None) -> torch.Tensor:
        """The rows' logits [B, n (or the last `keep`), V] in the model's dtype; every row's key and
        value are written to the cache.

        carry(device, tree) -> tree: for a model whose layers lie on several devices (gpu/stages.py),
        brings the step's tensors (the residual stream, the rows, their rotary rows) to the device
        of the weights used next; None: every weight lies on one device."""
        move = carry or _stay
        rows = move(self.model.embed_tokens.weight.device, rows)
        h, rotary = ops.inputs(rows, self.model.embed_tokens.weight, self.embed_scale, self.inv_freq)  # [B, n, H]
        placed = set()
        for layer in self.model.layers:
            device = layer.input_layernorm.weight.device
            h, rows, rotary = move(device, (h, rows, rotary))
            if self.windowed and device not in placed:  # a sliding window compares the keys' positions
                cache.place(rows)
                placed.add(device)
            h = layer(h, rows, cache, ops, rotary)
        h = move(self.model.norm.weight.device, h)
        h = self.model.norm(h, ops)
        h = move(self.lm_head.weight.device, h)
        return ops.logits(h[:, -keep:] if keep else h, self.lm_head.weight, self.config.final_logit_softcapping)

    def forward(self, input_ids: torch.Tensor, past_key_values: "GrowingCache | None" = None,
                use_cache: bool = True, logits_to_keep: int = 0, **_) -> Output:
        """transformers' call for code that runs a model outside specgen's runners (training a head,
        measuring acceptance): input_ids [B, n] after the tokens `past_key_values` holds (a
        GrowingCache from new_cache in core/models/loading.py; None: no cache)."""
        cache = past_key_values if use_cache and past_key_values is not None else GrowingCache(self)
        start = cache.length
        cache.reserve(input_ids.shape[0], start + input_ids.shape[1])
        logits = self.step(rowsets.chain(input_ids, start), cache.slots, REFERENCE, logits_to_keep)
        cache.length = start + input_ids.shape[1]
        return Output(logits)


def _stay(device, tree):
    return tree


class GrowingCache:
    """A SlotCache that grows as a sequence does, and its length on the host: the cache of forward()."""

    def __init__(self, model: OwnedModel):
        self.model, self.slots, self.length = model, None, 0

    def reserve(self, batch: int, length: int) -> None:
        if self.slots is None:
            self.slots = self.model.new_cache(batch, max(length, 64))
        elif length > self.slots.capacity:
            self.slots = self.slots.grown(max(length, 2 * self.slots.capacity))

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        """Keep the first `length` positions; a negative length drops that many from the end."""
        self.length = length if length >= 0 else self.length + length
