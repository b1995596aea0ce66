"""The kernel table's reference: every op a model step calls, in plain torch.

An owned model (core/step/llama.py, core/step/gemma2.py) computes through one table object and never
calls a kernel itself, as vLLM's fused ops carry `forward_native` beside `forward_cuda`. This class
is the torch implementation: the reference every faster table is tested against, and the one CPU
runs use. It follows transformers' arithmetic (norms and rotary tables in float32, results in the
model's dtype) so that owned and transformers logits agree within rounding (tests/core/step/test_step.py).

Shapes: B sequences, n rows each, H hidden width, h query heads, g key/value heads, d head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen.core.step.cache import SlotCache
from specgen.core.step.rows import Rows

# The most rows one call of a batch's kernel table takes (gpu/kernels/linear.py's kernels; a call of
# more takes the reference): a batch's verification, B x (k + 1) rows, and a group of prompts'
# prefill chunks (core/round/batch_prefill.py), whose every row gets a one-request step's bits.
BATCH_ROWS = 512
ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class TorchOps:
    name = "torch"

    def embed(self, weight: torch.Tensor, ids: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """ids [B, n] -> [B, n, H]; scale: Gemma's sqrt(H), rounded to the weights' dtype first (a
        0-dimensional CPU tensor: a scalar to a kernel, no copy to the device inside a capture)."""
        x = F.embedding(ids, weight)
        return x * torch.tensor(scale, dtype=x.dtype) if scale is not None else x

    def inputs(self, rows: Rows, weight: torch.Tensor, scale: float | None, inv_freq: torch.Tensor):
        """A step's inputs: the rows' embeddings [B, n, H] and their rotary (cos, sin); pending chain
        positions are written first."""
        if rows.pending:
            torch.add(rows.start[:, None], torch.arange(rows.count, device=rows.ids.device), out=rows.positions)
        h = self.embed(weight, rows.ids, scale)
        return h, self.rotary(rows.positions, inv_freq, h.dtype)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T + b, plus `residual` (the residual stream's add, which a kernel does in its epilogue)."""
        out = F.linear(x, weight, bias)
        return out if residual is None else residual + out

    def qkv(self, x: torch.Tensor, attn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An attention module's q, k and v projections of x."""
        return tuple(self.linear(x, p.weight, p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj))

    def gate_up(self, x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str,
                gate_bias: torch.Tensor | None = None, up_bias: torch.Tensor | None = None) -> torch.Tensor:
        """act(x gate^T) * (x up^T): a gated MLP's first half."""
        return ACTIVATIONS[activation](self.linear(x, gate, gate_bias)) * self.linear(x, up, up_bias)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool = False) -> torch.Tensor:
        """RMSNorm: Llama's `w * norm(x)` in x's dtype, or Gemma's `(1 + w) * norm(x)` in float32."""
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
        if offset:
            return (y * (1.0 + weight.float())).to(x.dtype)
        return weight * y.to(x.dtype)

    def norm_add_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      after: torch.Tensor, after_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Gemma 2's hand-over between a block and the next: (residual + norm(x), norm_after(that)),
        both norms (1 + w)."""
        total = residual + self.norm(x, weight, eps, offset=True)
        return total, self.norm(total, after, after_eps, offset=True)

    def rotary(self, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
        """(cos, sin) [B, n, d] of each row's position, computed in float32 and rounded to `dtype`
        once a step, as transformers' rotary embedding module does."""
        freqs = positions[..., None].float() * inv_freq  # [B, n, d/2]
        table = torch.cat((freqs, freqs), dim=-1)
        return table.cos().to(dtype), table.sin().to(dtype)

    def rope(self, x: torch.Tensor, rotary) -> torch.Tensor:
        """x [B, n, heads, d] rotated (rotate-half form) by the rows' (cos, sin)."""
        cos, sin = (t[:, :, None] for t in rotary)  # [B, n, 1, d]
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: SlotCache, layer: int,
                  rows: Rows, rotary, scale: float, window: int | None = None,
                  softcap: float | None = None) -> torch.Tensor:
        """q [B, n, h, d] and k, v [B, n, g, d] before rotary: rotates q and k by the rows' (cos, sin),
        writes k, v at the rows' slots, then each row attends over the slots it sees (within `window`
        positions of its own) -> [B, n, h * d]."""
        q, k = self.rope(q, rotary), self.rope(k, rotary)
        self.write(k, v, cache, layer, rows)
        return self.read(q, cache, layer, rows, scale, window, softcap)

    def write(self, k: torch.Tensor, v: torch.Tensor, cache: SlotCache, layer: int, rows: Rows) -> None:
        seq = torch.arange(k.shape[0], device=k.device)[:, None]  # [B, 1]
        cache.keys[layer][seq, :, rows.slots] = k
        cache.values[layer][seq, :, rows.slots] = v

    def read(self, q: torch.Tensor, cache: SlotCache, layer: int, rows: Rows, scale: float,
             window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        b, n, heads, d = q.shape
        mask = rows.seen(cache.capacity)  # [B, n, S]
        span = mask.shape[-1]
        keys, values = cache.keys[layer][:, :, :span], cache.values[layer][:, :, :span]  # [B, g, S, d]
        if window is not None:
            keyed = cache.positions_on(q.device)[:, None, :span]  # [B, 1, S]
            mask = mask & (rows.positions[:, :, None] - keyed < window)
        query = q.transpose(1, 2)  # [B, h, n, d]
        if softcap is None:
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask[:, None], scale=scale,
                                                 enable_gqa=keys.shape[1] != heads)
        else:
            out = _capped(query, keys, values, mask, scale, softcap)
        return out.transpose(1, 2).reshape(b, n, heads * d)

    def compact(self, cache: SlotCache, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's keys and values, and the slots' positions, from slots src [B, m] to
        dst [B, m] (a tree's accepted path to the slots after the committed prefix). Sources are
        read before any destination is written, so the two may overlap."""
        seq = torch.arange(src.shape[0], device=src.device)[:, None]  # [B, 1]
        for table in (*cache.keys, *cache.values):
            table[seq, :, dst] = table[seq, :, src]
        for positions in cache.copies.values():
            positions[seq, dst] = positions[seq, src]

    def logits(self, x: torch.Tensor, weight: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
        """x [B, n, H] -> [B, n, V] in x's dtype; softcap: Gemma 2's final tanh cap."""
        out = self.linear(x, weight)
        return torch.tanh(out / softcap) * softcap if softcap is not None else out


def _capped(query, keys, values, mask, scale: float, softcap: float) -> torch.Tensor:
    """Attention with Gemma 2's tanh cap on the scores (SDPA has no such option), as transformers'
    eager attention computes it: scores in the model's dtype, softmax in float32."""
    repeat = query.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(repeat, dim=1), values.repeat_interleave(repeat, dim=1)
    scores = torch.matmul(query, keys.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(query.dtype), values)
