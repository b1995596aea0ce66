"""Running a causal LM step by step over a KV cache that can roll back.

`EagerRunner` is the CPU (and fallback) path: a Hugging Face DynamicCache, rolled back with crop().
gpu/ provides a runner with the same three methods over static caches and CUDA graphs.
"""

from __future__ import annotations

import torch


class EagerRunner:
    """forward(ids) feeds tokens after the cached ones; truncate(n) keeps the first n cached tokens."""

    def __init__(self, model: torch.nn.Module, width: int):
        self.model = model
        self.width = width  # logits columns handed out: padded with -inf or cut to the target's width
        self.device = model.get_output_embeddings().weight.device
        self.cache = None
        self.length = 0

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.length = 0

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, want_logits: bool = True) -> torch.Tensor | None:
        """ids: [n] int64 -> logits [n, width] float32 (None when want_logits is False)."""
        n = ids.shape[0]
        if n == 0:
            return None
        positions = torch.arange(self.length, self.length + n, device=self.device)
        out = self.model(
            input_ids=ids.to(self.device).unsqueeze(0),
            past_key_values=self.cache,
            position_ids=positions.unsqueeze(0),
            cache_position=positions,
            use_cache=True,
            logits_to_keep=n if want_logits else 1,
        )
        self.length += n
        if not want_logits:
            return None
        return self._fit(out.logits[0].float())

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        cols = logits.shape[-1]
        if cols == self.width:
            return logits
        if cols > self.width:
            return logits[:, : self.width]
        pad = logits.new_full((logits.shape[0], self.width - cols), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def truncate(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)  # negative: drop that many (works across versions)
            self.length = length
