"""Verification: the pure-torch reference of the rejection sampler (Leviathan et al., 2211.17192).

Glossary:
    accepted   drafted tokens the verifier keeps; draft x at position i is accepted with
               probability min(1, p_i(x) / q_i(x)), i.e. when u_i * q_i(x) <= p_i(x), u_i ~ U(0, 1].
               A token with p_i(x) = 0 is never accepted; one with q_i(x) = 0 cannot have been drafted.
    recovered  at the first rejection j, a token drawn from the residual max(p_j - q_j, 0) by the
               exponential race argmax(residual / E) (no normalisation, so no division by a tiny sum).
               If the residual is all zero (only possible through rounding), it is drawn from p_j.
    bonus      when every drafted token is accepted, one more token drawn from p at position n.
    output     accepted + (recovered | bonus): between 1 and n + 1 tokens per request and round.

Layout (batch-ready, as the Triton kernels in gpu/ take it): request b drafted n_b tokens;
`cu_num_draft_tokens` [B] is the inclusive cumulative sum of n_b. Draft rows are flattened to
[T = sum n_b]; target rows to [T + B] (n_b + 1 rows per request, the last one for the bonus).
Greedy mode compares with the target argmax; the "no draft probabilities" mode (n-gram proposer)
treats q as one-hot at the drafted token. Randomness is an input: uniforms [T], exponentials [B, V].
The output is [B, max_n + 1] token ids, PLACEHOLDER after each request's emitted tokens.

Vectorised over requests and positions (no Python loop, no host sync), so it also serves as the
fast oracle for the statistical tests and as the GPU fallback; gpu/kernels/verify.py is the kernel twin.
"""

from __future__ import annotations

import torch

PLACEHOLDER = -1


def _layout(cu_num_draft_tokens: torch.Tensor, max_spec_len: int):
    """Per request: first draft row, n_b, and the [B, K] draft-row index / validity of each position."""
    cu = cu_num_draft_tokens.long()  # [B]
    num = torch.diff(cu, prepend=cu.new_zeros(1))  # [B] n_b
    start = cu - num  # [B]
    pos = torch.arange(max_spec_len, device=cu.device)  # [K]
    valid = pos < num.unsqueeze(1)  # [B, K]
    rows = torch.where(valid, start.unsqueeze(1) + pos, 0)  # [B, K] draft row of each position
    return start, num, valid, rows


def _accepted_prefix(accepted: torch.Tensor) -> torch.Tensor:
    """[B, K] bool -> [B]: length of the leading run of accepted positions."""
    return accepted.int().cumprod(dim=1).sum(dim=1)


def _padded_drafts(draft_token_ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[T] -> [B, K] by the layout's row indices; all zeros when nothing was drafted (bonus only)."""
    if draft_token_ids.numel() == 0:
        return torch.zeros_like(rows)
    return draft_token_ids.long()[rows]


def _output(draft: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor, max_spec_len: int):
    """Accepted drafts, then the recovered / bonus token `last`, then PLACEHOLDER."""
    batch = num_accepted.shape[0]
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=torch.int64, device=num_accepted.device)
    pos = torch.arange(max_spec_len, device=out.device)
    out[:, :max_spec_len] = torch.where(pos < num_accepted.unsqueeze(1), draft, PLACEHOLDER)
    out.scatter_(1, num_accepted.unsqueeze(1), last.long().unsqueeze(1))
    return out


def verify_greedy(
    draft_token_ids: torch.Tensor,  # [T] int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    target_argmax: torch.Tensor,  # [T + B] int64
    max_spec_len: int,
) -> torch.Tensor:  # [B, max_spec_len + 1]
    start, num, valid, rows = _layout(cu_num_draft_tokens, max_spec_len)
    request = torch.arange(num.shape[0], device=num.device)
    draft = _padded_drafts(draft_token_ids, rows)  # [B, K]
    accepted = valid
    if draft_token_ids.numel():
        accepted = valid & (draft == target_argmax[rows + request.unsqueeze(1)])
    num_accepted = _accepted_prefix(accepted)  # [B]
    # target argmax after the accepted prefix: recovered at a mismatch, bonus after all n_b
    last = target_argmax[start + request + num_accepted]
    return _output(draft, num_accepted, last, max_spec_len)


def recovered_token(
    target_row: torch.Tensor,  # [..., V]
    draft_row: torch.Tensor | None,  # [..., V], None = one-hot at draft_token
    draft_token: torch.Tensor,  # [...] int64
    expo: torch.Tensor,  # [..., V]
) -> torch.Tensor:
    """argmax(max(p - q, 0) / E), or argmax(p / E) when the residual is all zero (rounding only)."""
    if draft_row is None:
        residual = target_row.scatter(-1, draft_token.unsqueeze(-1), 0.0)
    else:
        residual = (target_row - draft_row).clamp_min(0.0)
    residual = torch.where((residual > 0).any(dim=-1, keepdim=True), residual, target_row)
    return (residual / expo).argmax(dim=-1)


def verify_random(
    draft_token_ids: torch.Tensor,  # [T] int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    draft_probs: torch.Tensor | None,  # [T, V] float32, None = n-gram (one-hot q)
    target_probs: torch.Tensor,  # [T + B, V] float32
    uniform_draws: torch.Tensor,  # [T] float32 in (0, 1]
    exponential_draws: torch.Tensor,  # [B, V] float32 > 0
    max_spec_len: int,
) -> torch.Tensor:  # [B, max_spec_len + 1]
    start, num, valid, rows = _layout(cu_num_draft_tokens, max_spec_len)
    request = torch.arange(num.shape[0], device=num.device)
    draft = _padded_drafts(draft_token_ids, rows)  # [B, K]
    accepted = valid
    if draft_token_ids.numel():
        p = target_probs[rows + request.unsqueeze(1), draft]  # [B, K] p(x)
        q = torch.ones_like(p) if draft_probs is None else draft_probs[rows, draft]  # [B, K] q(x)
        accepted = valid & (q > 0) & (uniform_draws[rows] * q <= p)
    num_accepted = _accepted_prefix(accepted)  # [B]
    rejected = num_accepted < num  # [B]
    target_row = target_probs[start + request + num_accepted]  # [B, V] p at the first rejection or bonus
    last = (target_row / exponential_draws).argmax(dim=-1)  # bonus
    if draft_token_ids.numel() and max_spec_len:
        at = num_accepted.clamp_max(max_spec_len - 1)  # rejected position (clamped where unused)
        token = draft.gather(1, at.unsqueeze(1)).squeeze(1)
        draft_row = None if draft_probs is None else draft_probs[rows.gather(1, at.unsqueeze(1)).squeeze(1)]
        recovered = recovered_token(target_row, draft_row, token, exponential_draws)
        last = torch.where(rejected, recovered, last)
    return _output(draft, num_accepted, last, max_spec_len)


def num_emitted(output_token_ids: torch.Tensor) -> torch.Tensor:
    """[B, max_spec_len + 1] -> [B]: tokens emitted per request (accepted + 1)."""
    return (output_token_ids != PLACEHOLDER).sum(dim=-1)
