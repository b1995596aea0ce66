"""The Llama family's decoder layer: Llama 2 and 3.x, Mistral, Qwen2 (q/k/v biases) and Qwen3
(per-head q/k norms); config.py says which checkpoints and how their options map here."""

from __future__ import annotations

import torch
from torch import nn

from specgen.core.step.config import StepConfig
from specgen.core.step.model import OwnedModel
from specgen.core.step.parts import MLP, Attention, RMSNorm


class LlamaLayer(nn.Module):
    def __init__(self, config: StepConfig, index: int):
        super().__init__()
        self.self_attn = Attention(config, index)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, rows, cache, ops, rotary) -> torch.Tensor:
        """h: the residual stream [B, n, H] entering the layer -> the one leaving it."""
        attn = self.self_attn
        h = attn.project(attn(self.input_layernorm(h, ops), rows, cache, ops, rotary), ops, residual=h)
        return self.mlp(self.post_attention_layernorm(h, ops), ops, residual=h)


class LlamaModel(OwnedModel):
    layer = LlamaLayer
