"""Gemma 2's decoder layer: a norm before and after both attention and the MLP ("sandwich"),
(1 + w) norm weights, tanh-capped attention scores and logits, scaled embeddings, alternating
sliding windows (the caps, the scale and the windows are set by core/step/model.py and parts.py)."""

from __future__ import annotations

import torch
from torch import nn

from specgen.core.step.config import StepConfig
from specgen.core.step.model import OwnedModel
from specgen.core.step.parts import MLP, Attention, RMSNorm


class Gemma2Layer(nn.Module):
    def __init__(self, config: StepConfig, index: int):
        super().__init__()
        self.self_attn = Attention(config, index)
        self.mlp = MLP(config)
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(size, eps, offset=True)
        self.post_attention_layernorm = RMSNorm(size, eps, offset=True)
        self.pre_feedforward_layernorm = RMSNorm(size, eps, offset=True)
        self.post_feedforward_layernorm = RMSNorm(size, eps, offset=True)

    def forward(self, h: torch.Tensor, rows, cache, ops, rotary) -> torch.Tensor:
        attn, post, pre = self.self_attn, self.post_attention_layernorm, self.pre_feedforward_layernorm
        a = attn.project(attn(self.input_layernorm(h, ops), rows, cache, ops, rotary), ops)
        h, x = ops.norm_add_norm(a, h, post.weight, post.eps, pre.weight, pre.eps)
        return h + self.post_feedforward_layernorm(self.mlp(x, ops), ops)


class Gemma2Model(OwnedModel):
    layer = Gemma2Layer
