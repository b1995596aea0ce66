"""Plain-torch references of gpu/ kernels that core/ has no reference for: the tests and
benchmarks/bench_kernels.py compare each kernel with these. Imports torch only (no Triton).

The warp and verify kernels' references are core/sampling/warp.py and core/sampling/rejection.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen.core.step.rows import seen

GELU_TANH = ("gelu_tanh", "gelu_pytorch_tanh")


def gate_up_reference(x, gate, up, activation: str) -> torch.Tensor:
    """What gpu/kernels/linear.py's gate_up computes, as the unfused module does: act(F.linear(x, gate)) *
    F.linear(x, up) in x's dtype (activation "silu" or a tanh-approximated GELU)."""
    g = F.linear(x, gate)
    act = F.gelu(g, approximate="tanh") if activation in GELU_TANH else F.silu(g)
    return act * F.linear(x, up)


def decode_attention_reference(query, key, value, position, scale, window: int = 0,
                               softcap: float = 0.0, tail=None, depth=None) -> torch.Tensor:
    """gpu/kernels/attention.py's decode_attention without rope: float32 softmax over the masked whole
    cache, scores soft-capped first when softcap > 0. query [B, H, q, D], key/value [B, KVH, C, D],
    position [] or [B] (each sequence's start), tail [B, q, T] and depth [B, q] as the kernel takes
    them -> [B, q, H, D]. The mask is core/step/rows.py's `seen` of the same data; a window compares
    the row's position with each key's (the prefix's slot j holds position j, tail entry j position
    start + j), as the reference step does with its cache's positions."""
    batch, heads, tokens, dim = query.shape
    kv_heads, capacity = key.shape[1], key.shape[2]
    group = heads // kv_heads
    k = key.float().repeat_interleave(group, dim=1)  # [B, H, C, D]
    v = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("bhtd,bhnd->bhtn", query.float(), k) * scale  # [B, H, q, C]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    start = _starts(position, batch)
    visible = seen(start, tokens, capacity, tail, depth)  # [B, q, C]
    if window:
        at, keys = _positions(start, tokens, capacity, tail, depth)
        visible &= at[:, :, None] - keys[:, None, :] < window
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    out = torch.einsum("bhtn,bhnd->bhtd", torch.softmax(scores, dim=-1), v)
    return out.transpose(1, 2).to(query.dtype)  # [B, q, H, D]


def _starts(position, batch: int) -> torch.Tensor:
    return position.reshape(-1).expand(batch)


def _positions(start, tokens: int, capacity: int, tail=None, depth=None):
    """(each row's position [B, q], each slot's key position [B, C]) of the rows' layout."""
    keys = torch.arange(capacity, device=start.device).repeat(start.shape[0], 1)  # [B, C]
    if tail is None:
        return start[:, None] + torch.arange(tokens, device=start.device), keys
    for b in range(start.shape[0]):  # a tail's entry j holds position start + j
        for row in range(tokens):
            d = int(depth[b, row])
            keys[b, tail[b, row, :d]] = int(start[b]) + torch.arange(d, device=start.device)
    return start[:, None] + depth - 1, keys


def _new_slots(position, tokens: int, batch: int, tail=None, depth=None) -> torch.Tensor:
    """[B, q]: where each row's new key goes (its tail's last entry; a chain's start + t)."""
    if tail is None:
        return _starts(position, batch)[:, None] + torch.arange(tokens, device=position.device)
    return tail.gather(2, (depth - 1)[:, :, None])[:, :, 0]


def rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, N, q, D] * cos + rotate_half(x) * sin (cos, sin [B, q, D]) in float32, one rounding."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos.float()[:, None] + rotated * sin.float()[:, None]).to(x.dtype)


def rope_attention_reference(query, k_new, v_new, cos, sin, key, value, position, scale, window: int = 0,
                             softcap: float = 0.0, tail=None, depth=None):
    """decode_attention with rope, on copies of the cache: (out [B, q, H, D], key, value)."""
    key, value = key.clone(), value.clone()
    slots = _new_slots(position, query.shape[2], query.shape[0], tail, depth)  # [B, q]
    seq = torch.arange(query.shape[0], device=query.device)[:, None]
    key[seq, :, slots] = rotate_reference(k_new, cos, sin).transpose(1, 2)
    value[seq, :, slots] = v_new.transpose(1, 2)
    out = decode_attention_reference(rotate_reference(query, cos, sin), key, value, position, scale, window,
                                     softcap, tail, depth)
    return out, key, value


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                       offset: bool = False):
    """gpu/kernels/norm.py's kernel: (RMSNorm(x + residual), x + residual), or (RMSNorm(x), None), with the
    module's rounding steps and the sum of float32 squares taken in float64; offset: Gemma's form,
    (x * rsqrt) * (1 + weight) in float32, rounded once to x's dtype."""
    summed = None
    if residual is not None:
        x = summed = residual + x
    xf = x.float()
    variance = (xf * xf).double().sum(-1, keepdim=True).div(x.shape[-1]).float()
    if offset:
        return ((xf * torch.rsqrt(variance + eps)) * (1.0 + weight.float())).to(x.dtype), summed
    y = (xf * torch.rsqrt(variance + eps)).to(x.dtype)
    return weight * y, summed


def offset_norm_add_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                              second: tuple[torch.Tensor, float] | None = None):
    """gpu/kernels/norm.py's offset_norm_add: (residual + RMSNorm(x), RMSNorm2 of that or None), Gemma's form."""
    summed = residual + rms_norm_reference(x, weight, eps, offset=True)[0]
    return summed, rms_norm_reference(summed, *second, offset=True)[0] if second is not None else None


def step_inputs_reference(ids, position, weight=None, table=None, scale=None, per=None, positions=None):
    """gpu/kernels/step_io.py's inputs: (positions [n], embeds [n, H] or None, rows [n, R] or None); with
    scale, the embedding rows times it as Gemma's scaled embedding multiplies them; `per` rows a
    sequence after each of position's starts, or the `positions` given."""
    if positions is None:
        r = torch.arange(ids.shape[0], device=ids.device)
        positions = position.reshape(-1)[r // (per or ids.shape[0])] + r % (per or ids.shape[0])
    embeds = weight[ids] if weight is not None else None
    if embeds is not None and scale is not None:
        embeds = embeds * torch.tensor(scale, device=ids.device).to(weight.dtype)
    rows = table[positions] if table is not None else None
    return positions, embeds, rows


def step_finish_reference(logits, width: int, position, advance: int):
    """gpu/kernels/step_io.py's finish on a fresh out buffer of -inf: (out [n, width] float32, position)."""
    out = torch.full((logits.shape[0], width), float("-inf"), dtype=torch.float32, device=logits.device)
    cols = min(logits.shape[1], width)
    out[:, :cols] = logits[:, :cols].float()
    return out, position + advance
