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
"""

from __future__ import annotations

import torch

PLACEHOLDER = -1


def _starts(cu_num_draft_tokens: torch.Tensor) -> list[tuple[int, int]]:
    ends = cu_num_draft_tokens.tolist()
    starts = [0] + ends[:-1]
    return [(s, e - s) for s, e in zip(starts, ends)]


def _output(batch: int, max_spec_len: int, device) -> torch.Tensor:
    return torch.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=torch.int64, device=device)


def verify_greedy(
    draft_token_ids: torch.Tensor,  # [T] int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    target_argmax: torch.Tensor,  # [T + B] int64
    max_spec_len: int,
) -> torch.Tensor:  # [B, max_spec_len + 1]
    out = _output(cu_num_draft_tokens.shape[0], max_spec_len, draft_token_ids.device)
    for b, (start, n) in enumerate(_starts(cu_num_draft_tokens)):
        t0 = start + b  # first target row of request b
        for pos in range(n + 1):
            best = target_argmax[t0 + pos]
            out[b, pos] = best  # accepted (equal), recovered (first mismatch) or bonus (pos == n)
            if pos < n and draft_token_ids[start + pos] != best:
                break
    return out


def recovered_token(
    target_row: torch.Tensor,  # [V]
    draft_row: torch.Tensor | None,  # [V], None = one-hot at draft_token
    draft_token: int,
    expo: torch.Tensor,  # [V]
) -> torch.Tensor:
    if draft_row is None:
        residual = target_row.clone()
        residual[draft_token] = 0.0
    else:
        residual = (target_row - draft_row).clamp_min(0.0)
    if not bool((residual > 0).any()):
        residual = target_row
    return (residual / expo).argmax()


def verify_random(
    draft_token_ids: torch.Tensor,  # [T] int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    draft_probs: torch.Tensor | None,  # [T, V] float32, None = n-gram (one-hot q)
    target_probs: torch.Tensor,  # [T + B, V] float32
    uniform_draws: torch.Tensor,  # [T] float32 in (0, 1]
    exponential_draws: torch.Tensor,  # [B, V] float32 > 0
    max_spec_len: int,
) -> torch.Tensor:  # [B, max_spec_len + 1]
    out = _output(cu_num_draft_tokens.shape[0], max_spec_len, target_probs.device)
    for b, (start, n) in enumerate(_starts(cu_num_draft_tokens)):
        t0 = start + b
        for pos in range(n):
            x = int(draft_token_ids[start + pos])
            p = target_probs[t0 + pos, x]
            q = 1.0 if draft_probs is None else draft_probs[start + pos, x]
            if q > 0 and uniform_draws[start + pos] * q <= p:
                out[b, pos] = x
                continue
            draft_row = None if draft_probs is None else draft_probs[start + pos]
            out[b, pos] = recovered_token(target_probs[t0 + pos], draft_row, x, exponential_draws[b])
            break
        else:
            out[b, n] = (target_probs[t0 + n] / exponential_draws[b]).argmax()
    return out


def num_emitted(output_token_ids: torch.Tensor) -> torch.Tensor:
    """[B, max_spec_len + 1] -> [B]: tokens emitted per request (accepted + 1)."""
    return (output_token_ids != PLACEHOLDER).sum(dim=-1)
