"""A causal LM over a static KV cache whose rollback is moving one position.

Why not transformers' StaticCache as it is: each of its layers keeps its own device counter and
advances it on every update (graph warm-ups and replays included), so captured steps would write
K/V where that counter points, not where the sequence is. SlotCache keeps ONE position tensor
for all layers, owned by the runner: a step writes at position + arange(n), the model derives
position ids and the causal mask from it, and the runner advances it. Rolling back is
`position.sub_(n)` on the device: no copy, no free, no host sync.

StaticRunner runs every step eagerly (the torch backend); gpu/runner.py's GraphRunner adds CUDA
graphs, compile and the Triton step kernels over the same cache.
"""

from __future__ import annotations

import contextlib
import functools
from typing import ContextManager, Protocol

import torch

SLACK = 64  # positions past the longest request: where padded steps and warm-ups may write


class Runner(Protocol):
    """What a round needs of a model: a static cache, a device position and fixed-shape steps."""

    device: torch.device
    position: torch.Tensor  # [] int64: where the next step writes
    capacity: int
    generation: int  # bumped when the cache is re-allocated (captured rounds must re-capture)

    def reset(self) -> None: ...

    def forward(self, ids: torch.Tensor, want_logits: bool = True) -> torch.Tensor | None: ...

    def step(self, ids: torch.Tensor, logits_out: torch.Tensor) -> torch.Tensor: ...

    def step_context(self, tokens: int) -> ContextManager: ...

    def reserve(self, positions: int) -> None: ...


@functools.cache
def _slot_layer_class():
    from transformers.cache_utils import StaticLayer

    class SlotLayer(StaticLayer):
        """A StaticLayer that writes at the shared position instead of its own counter."""

        def __init__(self, capacity: int, position: torch.Tensor, steps: torch.Tensor):
            super().__init__(max_cache_len=capacity)
            self.position = position  # [] int64, shared by every layer
            self.steps = steps  # [capacity] int64: 0, 1, 2, ...

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            index = self.steps[: key_states.shape[-2]] + self.position
            self.keys.index_copy_(2, index, key_states)
            self.values.index_copy_(2, index, value_states)
            return self.keys, self.values

        def get_seq_length(self):
            return self.position

    return SlotLayer


def slot_cache(config, capacity: int, position: torch.Tensor, steps: torch.Tensor):
    """A transformers Cache of full-length SlotLayers (sliding-window layers too: their window is
    applied by the model's mask on absolute positions, so a full layer is correct, only larger)."""
    from transformers.cache_utils import Cache

    layer = _slot_layer_class()
    layers = config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[layer(capacity, position, steps) for _ in range(layers)])


def fit_logits(logits: torch.Tensor, width: int) -> torch.Tensor:
    """[n, cols] -> [n, width] float32: cut extra (padding) columns, or pad with -inf."""
    cols = logits.shape[-1]
    if cols >= width:
        return logits[:, :width].float()
    pad = logits.new_full((logits.shape[0], width - cols), float("-inf"), dtype=torch.float32)
    return torch.cat([logits.float(), pad], dim=-1)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class StaticRunner:
    """Eager steps over a SlotCache. capacity grows by `grain` when reserve() asks for more."""

    def __init__(self, model, width: int, capacity: int, grain: int = 64):
        self.model = model
        self.width = width  # logits columns handed out: padded with -inf or cut to the target's width
        self.device = model.get_output_embeddings().weight.device
        self.grain = grain
        self.generation = 0
        self.capacity = 0
        self._allocate(round_up(capacity, grain))

    def _allocate(self, capacity: int) -> None:
        self.generation += 1
        self.capacity = capacity
        self.position = torch.zeros((), dtype=torch.long, device=self.device)
        self.steps = torch.arange(capacity, device=self.device)
        self.cache = slot_cache(self.model.config, capacity, self.position, self.steps)

    def reset(self) -> None:
        self.position.zero_()

    def reserve(self, positions: int) -> None:
        if positions + SLACK > self.capacity:
            self._allocate(round_up(positions + SLACK, self.grain))

    def step_context(self, tokens: int) -> ContextManager:
        return contextlib.nullcontext()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, want_logits: bool = True) -> torch.Tensor | None:
        """ids: [n] int64 -> logits [n, width] float32 (None when want_logits is False)."""
        if ids.shape[0] == 0:
            return None
        out = self.model(input_ids=ids.to(self.device).unsqueeze(0), past_key_values=self.cache, use_cache=True,
                         logits_to_keep=0 if want_logits else 1)
        self.position.add_(ids.shape[0])
        return fit_logits(out.logits[0], self.width) if want_logits else None

    def step(self, ids: torch.Tensor, logits_out: torch.Tensor) -> torch.Tensor:
        """A round's step: forward at the position, logits into logits_out [n, width], advance."""
        logits = self.model(input_ids=ids.unsqueeze(0), past_key_values=self.cache, use_cache=True).logits[0]
        cols = min(logits.shape[-1], self.width)
        logits_out[:, :cols].copy_(logits[:, :cols])
        self.position.add_(ids.shape[0])
        return logits
