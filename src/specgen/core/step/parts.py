"""The modules an owned model is built of, named as in the checkpoints so weights load by name.

Each holds parameters only; its `forward` computes through the kernel table it is handed
(core/step/ops.py), so the same module runs on the torch reference and on a faster table.
Parameters are created empty: the checkpoint's tensors replace them at once (core/step/load.py),
and random initialisation would only cost time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specgen.core.step.config import StepConfig


@dataclass(frozen=True)
class Fused:
    weight: torch.Tensor  # [sum(widths), H]
    bias: torch.Tensor | None
    widths: list


def weight(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Linear(nn.Module):
    def __init__(self, inputs: int, outputs: int, bias: bool):
        super().__init__()
        self.weight = weight(outputs, inputs)
        self.bias = weight(outputs) if bias else None


class Table(nn.Module):
    """A [vocabulary, hidden] weight: the token embedding, or the output projection (lm_head)."""

    def __init__(self, rows: int, width: int):
        super().__init__()
        self.weight = weight(rows, width)


class RMSNorm(nn.Module):
    """offset: Gemma's (1 + w) weights, computed in float32."""

    def __init__(self, size: int, eps: float, offset: bool = False):
        super().__init__()
        self.weight = weight(size)
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor, ops) -> torch.Tensor:
        return ops.norm(x, self.weight, self.eps, self.offset)


class Attention(nn.Module):
    def __init__(self, config: StepConfig, index: int):
        super().__init__()
        self.index, self.head_dim = index, config.head_dim
        self.window = config.windows[index]
        self.softcap = config.attn_logit_softcapping
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        q_width, kv_width = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
        self.q_proj = Linear(config.hidden_size, q_width, config.qkv_bias)
        self.k_proj = Linear(config.hidden_size, kv_width, config.qkv_bias)
        self.v_proj = Linear(config.hidden_size, kv_width, config.qkv_bias)
        self.o_proj = Linear(q_width, config.hidden_size, config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rows, cache, ops, rotary) -> torch.Tensor:
        """x [B, n, H] -> the attention's output [B, n, h * d], before o_proj (which the layer
        applies, so that its residual add can be the projection's epilogue)."""
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, -1, self.head_dim) for t in ops.qkv(x, self))  # [B, n, h or g, d]
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q, ops), self.k_norm(k, ops)
        return ops.attention(q, k, v, cache, self.index, rows, rotary, self.scale, self.window, self.softcap)

    def project(self, x: torch.Tensor, ops, residual: torch.Tensor | None = None) -> torch.Tensor:
        return ops.linear(x, self.o_proj.weight, self.o_proj.bias, residual)

    def fuse(self) -> None:
        """Lay q, k and v's weights out as one [q + 2 kv widths, H] tensor (the three projections'
        parameters become views of it), so that a kernel table streams them in one launch."""
        parts = (self.q_proj, self.k_proj, self.v_proj)
        if getattr(self, "fused", None) is not None:
            return
        weight = torch.cat([p.weight.detach() for p in parts])
        bias = torch.cat([p.bias.detach() for p in parts]) if parts[0].bias is not None else None
        widths = [p.weight.shape[0] for p in parts]
        for part, piece in zip(parts, weight.split(widths)):
            part.weight = nn.Parameter(piece, requires_grad=False)
        if bias is not None:
            for part, piece in zip(parts, bias.split(widths)):
                part.bias = nn.Parameter(piece, requires_grad=False)
        self.fused = Fused(weight, bias, widths)


class MLP(nn.Module):
    def __init__(self, config: StepConfig):
        super().__init__()
        self.activation = config.activation
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, config.mlp_bias)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, config.mlp_bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, config.mlp_bias)

    def forward(self, x: torch.Tensor, ops, residual: torch.Tensor | None = None) -> torch.Tensor:
        inner = ops.gate_up(x, self.gate_proj.weight, self.up_proj.weight, self.activation,
                            self.gate_proj.bias, self.up_proj.bias)
        return ops.linear(inner, self.down_proj.weight, self.down_proj.bias, residual)
