"""Attention for captured steps: a Triton kernel over the live part of a static KV cache.

Why: a captured step attends over the whole static cache (capacity positions) through SDPA with a
[q, capacity] mask. On an H200 (docs/benchmarks.md, attention study) cuDNN SDPA then costs 5 us a
layer for 1 query token but 23 us for the 5 tokens of a k = 4 verification, and that one
difference is most of what a verification step costs over a 1-token step. This kernel reads the
position straight from the runner's device tensor and visits only keys [0, position + q): its cost
follows the sequence, not the cache, and barely grows with q, because every key block is loaded
once for all q tokens and all query heads that share its KV head (GQA).

Layout (flash decoding): program (b * KVH + kv head, row tile, split) takes rows
r = t * G + g (query token t, query head kv * G + g), and keys [split * split_keys, ...) up to
its rows' last visible key; an online softmax in base 2. One split writes the output directly;
several write normalised partial outputs and their log-sum-exp, and _combine_kernel merges them.
Query token t sits at position + t and sees keys n with n <= position + t (and, with a sliding
window w, n > position + t - w, the mask transformers applies).

Hooked into transformers as the attention implementation "specgen" (AttentionInterface). The
runner passes `specgen_position` to the model; without it (prefill, Hugging Face's own calls on
the same model object) the function is plain SDPA with the SDPA mask, which is also what the
registered mask function builds, so switching a model to "specgen" changes nothing else.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

NAME = "specgen"
# Keys per program: at least SPLIT_KEYS, more when the cache holds over MAX_SPLITS x SPLIT_KEYS. Short
# splits spread even a short sequence over many programs (a 1-token step of a Llama-3-8B shape at
# position 512: 6.8 us a layer with 256-key splits); the merge reads at most MAX_SPLITS partials.
SPLIT_KEYS = 64
MAX_SPLITS = 64
MAX_ROWS = 64  # query rows (tokens x heads per KV head) per program
MAX_GRAPH_QUERY = 64  # longer steps (prefill) take the SDPA path
# float32 products without TF32 for float32 models (their graph-vs-eager checks are exact to 1e-5);
# the CPU interpreter also takes that path for 16-bit inputs, as its bf16 tl.dot is wrong.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def supports(config) -> str | None:
    """None when the kernel computes this model's attention exactly, else why not."""
    text = config.get_text_config(decoder=True)
    for key in ("attn_logit_softcapping", "attention_chunk_size"):
        if getattr(text, key, None):
            return f"{key} is set"
    if getattr(text, "use_bidirectional_attention", False):
        return "bidirectional attention"
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if head_dim > 256:
        return f"head_dim {head_dim} > 256"
    return None


@functools.cache
def register() -> str:
    """Register the attention function and its mask (SDPA's) with transformers, once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
              specgen_position=None, sliding_window=None, **kwargs):
    """transformers' attention-function protocol: query [B, H, q, D], key/value [B, KVH, C, D]
    (the whole cache) -> ([B, q, H, D], None)."""
    if specgen_position is None or query.shape[2] > MAX_GRAPH_QUERY or kwargs.get("s_aux") is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, sliding_window=sliding_window, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return decode_attention(query, key, value, specgen_position, scale, sliding_window or 0), None


def decode_attention(
    query: torch.Tensor,  # [B, H, q, D]
    key: torch.Tensor,  # [B, KVH, C, D]
    value: torch.Tensor,  # [B, KVH, C, D]
    position: torch.Tensor,  # [] int64: where query token 0 sits
    scale: float,
    window: int = 0,  # sliding window (0: none)
) -> torch.Tensor:  # [B, q, H, D]
    batch, heads, tokens, dim = query.shape
    kv_heads, capacity = key.shape[1], key.shape[2]
    assert key.shape == value.shape == (batch, kv_heads, capacity, dim) and heads % kv_heads == 0
    assert query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
    assert position.numel() == 1 and position.dtype == torch.int64
    group = heads // kv_heads
    rows = tokens * group
    block_m = max(16, min(MAX_ROWS, triton.next_power_of_2(rows)))
    block_d = max(16, triton.next_power_of_2(dim))
    block_n = 64 if block_d <= 128 else 32
    split_keys = max(SPLIT_KEYS, block_n * triton.cdiv(triton.cdiv(capacity, MAX_SPLITS), block_n))
    splits = triton.cdiv(capacity, split_keys)
    out = torch.empty(batch, tokens, heads, dim, dtype=query.dtype, device=query.device)
    if splits == 1:
        part, lse = out, out  # unused: the kernel writes out directly
    else:
        part = torch.empty(batch, heads, tokens, splits, dim, dtype=torch.float32, device=query.device)
        lse = torch.empty(batch, heads, tokens, splits, dtype=torch.float32, device=query.device)
    grid = (batch * kv_heads, triton.cdiv(rows, block_m), splits)
    _split_kernel[grid](
        query, key, value, position, out, part, lse,
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3],
        kv_heads, group, tokens, dim, capacity, scale * 1.4426950408889634,
        WINDOW=window, SPLITS=splits, SPLIT_KEYS=split_keys, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        F32_DOT=query.dtype == torch.float32 or _INTERPRETED, num_warps=4,
    )
    if splits > 1:
        _combine_kernel[(batch * heads * tokens,)](
            part, lse, out, heads, tokens, dim, splits,
            BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, num_warps=4,
        )
    return out


def decode_attention_reference(query, key, value, position, scale, window: int = 0) -> torch.Tensor:
    """The same in plain torch (float32 softmax over the masked whole cache): [B, q, H, D]."""
    batch, heads, tokens, dim = query.shape
    kv_heads, capacity = key.shape[1], key.shape[2]
    group = heads // kv_heads
    k = key.float().repeat_interleave(group, dim=1)  # [B, H, C, D]
    v = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("bhtd,bhnd->bhtn", query.float(), k) * scale  # [B, H, q, C]
    at = int(position) + torch.arange(tokens, device=query.device)[:, None]  # [q, 1]
    keys = torch.arange(capacity, device=query.device)[None, :]  # [1, C]
    visible = keys <= at
    if window:
        visible &= keys > at - window
    scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.einsum("bhtn,bhnd->bhtd", torch.softmax(scores, dim=-1), v)
    return out.transpose(1, 2).to(query.dtype)  # [B, q, H, D]


# -- kernels ----------------------------------------------------------------------------------------


@triton.jit
def _split_kernel(
    q_ptr,  # [B, H, q, D]
    k_ptr,  # [B, KVH, C, D]
    v_ptr,  # [B, KVH, C, D]
    position_ptr,  # [] int64
    out_ptr,  # [B, q, H, D] contiguous (SPLITS == 1)
    part_ptr,  # [B, H, q, SPLITS, D] float32 (SPLITS > 1)
    lse_ptr,  # [B, H, q, SPLITS] float32, base 2 (SPLITS > 1)
    sqb, sqh, sqt,
    skb, skh, skn,
    svb, svh, svn,
    kv_heads, group, tokens, dim, capacity, scale_log2,
    WINDOW: tl.constexpr, SPLITS: tl.constexpr, SPLIT_KEYS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, F32_DOT: tl.constexpr,
):
    bkv = tl.program_id(0)
    b = bkv // kv_heads
    kvh = bkv % kv_heads
    split = tl.program_id(2)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [M]
    row_ok = rows < tokens * group
    t = rows // group
    head = kvh * group + rows % group
    d = tl.arange(0, BLOCK_D)
    d_ok = d < dim
    position = tl.load(position_ptr)
    at = position + t  # [M] each row's own position
    q = tl.load(q_ptr + b * sqb + head[:, None] * sqh + t[:, None] * sqt + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [M, D]

    lo = (split * SPLIT_KEYS).to(tl.int64)
    hi = tl.minimum(lo + SPLIT_KEYS, position + tokens)
    hi = tl.minimum(hi, capacity)
    if WINDOW > 0:
        first = tl.maximum(position - WINDOW + 1, 0)
        lo = tl.maximum(lo, first - first % BLOCK_N)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = k_ptr + b * skb + kvh * skh
    v_base = v_ptr + b * svb + kvh * svh
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)  # [N]
        n_ok = n < hi
        k = tl.load(k_base + n[:, None] * skn + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if F32_DOT:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = (s * scale_log2).to(tl.float32)  # [M, N]; inductor passes Python floats as fp64
        visible = n_ok[None, :] & (n[None, :] <= at[:, None])
        if WINDOW > 0:
            visible = visible & (n[None, :] > at[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n[:, None] * svn + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if F32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new

    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    if SPLITS == 1:
        heads = kv_heads * group
        dst = out_ptr + ((b * tokens + t[:, None]) * heads + head[:, None]) * dim + d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:
        heads = kv_heads * group
        row_id = (b * heads + head) * tokens + t  # [M] index into [B, H, q]
        tl.store(part_ptr + (row_id[:, None] * SPLITS + split) * dim + d[None, :], o,
                 mask=row_ok[:, None] & d_ok[None, :])
        lse = tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
        tl.store(lse_ptr + row_id * SPLITS + split, lse, mask=row_ok)


@triton.jit
def _combine_kernel(
    part_ptr,  # [B, H, q, S, D] float32
    lse_ptr,  # [B, H, q, S] float32, base 2
    out_ptr,  # [B, q, H, D]
    heads, tokens, dim, splits,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)  # (b * H + h) * q + t
    t = row % tokens
    bh = row // tokens
    h = bh % heads
    b = bh // heads
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(lse_ptr + row * splits + s, mask=s < splits, other=float("-inf"))  # [S]
    top = tl.max(lse, axis=0)
    weight = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - top))  # [S]
    part = tl.load(part_ptr + (row * splits + s[:, None]) * dim + d[None, :],
                   mask=(s[:, None] < splits) & (d[None, :] < dim), other=0.0)  # [S, D]
    o = tl.sum(part * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(out_ptr + ((b * tokens + t) * heads + h) * dim + d, o.to(out_ptr.dtype.element_ty), mask=d < dim)
