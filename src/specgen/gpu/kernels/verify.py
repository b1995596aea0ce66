"""Triton verification kernels, equal to core/sampling/rejection.py (the torch reference and its glossary).

Glossary:
    accepted   draft x at position i is kept while u_i * q_i(x) <= p_i(x) with q_i(x) > 0 (random)
               or while x equals the target argmax (greedy); the first failure ends the run.
    recovered  at the first rejection j: argmax over V of max(p_j - q_j, 0) / E (exponential race,
               no normalisation), with q one-hot at x when there are no draft probabilities, and
               p_j / E instead when the residual is all zero. Greedy: the target argmax at j.
    bonus      when all n_b drafts are accepted: argmax(p_n / E) (greedy: the target argmax at n).
    output     [B, max_spec_len + 1]: accepted, then the recovered or bonus token, then PLACEHOLDER.

Layout as in the reference: request b owns draft rows [cu[b-1], cu[b]) and target rows shifted by
b (n_b + 1 per request, the last for the bonus); one exponential row [V] per request and round.

Kernels (orchestration first, @triton.jit at the bottom):
    _verify_greedy_kernel  grid (request tiles,): the walk over positions, R requests per program.
    _verify_random_kernel  grid (request tiles, segments): every program repeats the cheap walk over
                           positions, then races its segment of the recovered / bonus row. Long
                           rows are split over segments whose bests meet in per-request int64
                           slots (score bits << 32 | inverted index, so atomic_max keeps the first
                           index on ties); the last segment to arrive writes the output and clears
                           the slots and its counter for the next launch.

Errors: a non-zero error flag (workspace.error, written by gpu/kernels/warp.py: 1 NaN/+inf logits, 2 every id masked) turns
the first output token of every request into ERROR_BAD_LOGITS / ERROR_ALL_MASKED, so the caller
finds it in the same copy that brings the accepted count to the host (no extra sync).

The walk loads every position's draft id, probabilities and uniform at once ([R, SPEC_BLOCK]
tiles, SPEC_BLOCK >= max_spec_len): the accepted count is the first failing position, not a chain
of dependent loads, one per position. max_spec_len stays a runtime value (one compile for every
k up to SPEC_BLOCK).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.core.sampling import warp as sampling
from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous
from specgen.gpu.kernels.warp import layout
from specgen.gpu.workspace import Workspace

ERROR_BAD_LOGITS = -2  # output sentinel for error flag bit 1
ERROR_ALL_MASKED = -3  # output sentinel for error flag bit 2
_GREEDY_TILE = 128  # requests per program of the greedy kernel


def _spec_block(max_spec_len: int) -> int:
    return max(32, triton.next_power_of_2(max_spec_len))


def check_output(first_id: int, workspace: Workspace) -> None:
    """The round's one host read of the verify output: a sentinel left by an error flag becomes
    the DecodeError the torch reference raises in warp, and the flag is cleared for the next round."""
    if first_id >= 0:
        return
    workspace.clear_error()
    if first_id == ERROR_BAD_LOGITS:
        raise sampling.bad_logits_error()
    raise sampling.all_masked_error()


def verify_greedy(
    draft_token_ids: torch.Tensor,  # [T] int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    target_argmax: torch.Tensor,  # [T + B] int64
    max_spec_len: int,
    workspace: Workspace,  # its error flag turns into the sentinel
    dependent: bool = False,  # launched dependent on the kernel before (gpu/kernels/dependent.py)
) -> torch.Tensor:  # [B, max_spec_len + 1] int64
    batch, num_tokens = cu_num_draft_tokens.shape[0], draft_token_ids.shape[0]
    _check_layout(draft_token_ids, cu_num_draft_tokens, workspace, target_argmax.device)
    assert target_argmax.shape == (num_tokens + batch,) and target_argmax.dtype == torch.int64
    assert target_argmax.is_contiguous()
    out = torch.empty(batch, max_spec_len + 1, dtype=torch.int64, device=target_argmax.device)
    _verify_greedy_kernel[(triton.cdiv(batch, _GREEDY_TILE),)](
        out, cu_num_draft_tokens, draft_token_ids, target_argmax, workspace.error, batch, max_spec_len,
        BLOCK_R=_GREEDY_TILE, SPEC_BLOCK=_spec_block(max_spec_len), DEPENDENT=dependent, num_warps=4,
        **launch_options(dependent),
    )
    return out


def verify_random(
    draft_token_ids: torch.Tensor,  # [T] int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    draft_probs: torch.Tensor | None,  # [T, V] float32, None = one-hot q (n-gram, argmax drafting)
    target_probs: torch.Tensor,  # [T + B, V] float32
    uniform_draws: torch.Tensor,  # [T] float32 in (0, 1]
    exponential_draws: torch.Tensor,  # [B, V] float32 > 0
    max_spec_len: int,
    workspace: Workspace,  # slots and counters; its error flag turns into the sentinel
    dependent: bool = False,  # launched dependent on the kernel before (gpu/kernels/dependent.py)
) -> torch.Tensor:  # [B, max_spec_len + 1] int64
    batch, num_tokens = cu_num_draft_tokens.shape[0], draft_token_ids.shape[0]
    vocab = target_probs.shape[-1]
    _check_layout(draft_token_ids, cu_num_draft_tokens, workspace, target_probs.device)
    assert target_probs.shape == (num_tokens + batch, vocab) and target_probs.dtype == torch.float32
    assert target_probs.is_contiguous()
    assert draft_probs is None or (
        draft_probs.shape == (num_tokens, vocab) and draft_probs.dtype == torch.float32 and draft_probs.is_contiguous()
    )
    assert uniform_draws.shape == (num_tokens,) and uniform_draws.dtype == torch.float32
    assert exponential_draws.shape == (batch, vocab) and exponential_draws.dtype == torch.float32
    assert uniform_draws.is_contiguous() and exponential_draws.is_contiguous()
    block_r, block_v, n_seg = layout(vocab)
    best = workspace.zeros("verify_best", 3 * batch, torch.int64)  # [B, 3] slots, zero between launches
    arrived = workspace.zeros("verify_arrived", batch)  # [B] int32 segments done
    out = torch.empty(batch, max_spec_len + 1, dtype=torch.int64, device=target_probs.device)
    _verify_random_kernel[(triton.cdiv(batch, block_r), n_seg)](
        out, cu_num_draft_tokens, draft_token_ids, draft_probs if draft_probs is not None else target_probs,
        target_probs, uniform_draws, exponential_draws, best, arrived, workspace.error,
        batch, vocab, max_spec_len,
        NO_DRAFT_PROBS=draft_probs is None, SEGMENTED=n_seg > 1,
        BLOCK_R=block_r, BLOCK_V=block_v, SPEC_BLOCK=_spec_block(max_spec_len), DEPENDENT=dependent,
        num_warps=max(1, min(8, block_r * block_v // 512)), **launch_options(dependent),
    )
    return out


def _check_layout(draft_token_ids, cu_num_draft_tokens, workspace, device) -> None:
    assert draft_token_ids.ndim == 1 and draft_token_ids.dtype == torch.int64 and draft_token_ids.is_contiguous()
    assert cu_num_draft_tokens.ndim == 1 and cu_num_draft_tokens.dtype == torch.int32
    assert cu_num_draft_tokens.is_contiguous()
    assert workspace.device == device, f"workspace on {workspace.device}, tensors on {device}"


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _requests(cu_ptr, n_req, BLOCK_R: tl.constexpr):
    """This program's requests: ids [R], valid [R], first draft row [R], n_b [R]."""
    req = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = req < n_req
    end = tl.load(cu_ptr + req, mask=ok, other=0)
    start = tl.load(cu_ptr + req - 1, mask=ok & (req > 0), other=0)
    return req, ok, start, end - start


@triton.jit
def _error_sentinel(out_ptr, req, mask, row_len, error_ptr):
    """Replace the first token of each request by the error sentinel when the flag is set."""
    error = tl.load(error_ptr)
    if error != 0:
        sentinel = tl.where((error & 1) != 0, -2, -3)  # ERROR_BAD_LOGITS, ERROR_ALL_MASKED
        tl.store(out_ptr + req.to(tl.int64) * row_len, sentinel.to(tl.int64) + 0 * req.to(tl.int64), mask=mask)


@triton.jit(do_not_specialize=["n_req", "max_spec_len"])
def _verify_greedy_kernel(
    out_ptr,  # [B, max_spec_len + 1] int64
    cu_ptr,  # [B] int32
    draft_ptr,  # [T] int64
    argmax_ptr,  # [T + B] int64
    error_ptr,  # [1] int32
    n_req,
    max_spec_len,
    BLOCK_R: tl.constexpr,
    SPEC_BLOCK: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)  # one short pass: the next kernel may be scheduled at once
    release_next(DEPENDENT)
    req, ok, start, num = _requests(cu_ptr, n_req, BLOCK_R)
    pos = tl.arange(0, SPEC_BLOCK)[None, :]  # [1, P]
    live = ok[:, None] & (pos < num[:, None])  # [R, P]
    drafts = tl.load(draft_ptr + start[:, None] + pos, mask=live, other=-1)
    best = tl.load(argmax_ptr + (start + req)[:, None] + pos, mask=live, other=-2)
    num_accepted = _first_failure(live & (drafts == best), num, SPEC_BLOCK)
    last = tl.load(argmax_ptr + start + req + num_accepted, mask=ok, other=0)  # recovered or bonus
    _write_rows(out_ptr, req, ok, drafts, num_accepted, last, max_spec_len, error_ptr, SPEC_BLOCK)


@triton.jit(do_not_specialize=["n_req", "max_spec_len"])
def _verify_random_kernel(
    out_ptr,  # [B, max_spec_len + 1] int64
    cu_ptr,  # [B] int32
    draft_ptr,  # [T] int64
    draft_probs_ptr,  # [T, V] float32 (unused with NO_DRAFT_PROBS)
    target_probs_ptr,  # [T + B, V] float32
    uniform_ptr,  # [T] float32
    expo_ptr,  # [B, V] float32
    best_ptr,  # [B, 3] int64 slots: residual best, p best, residual > 0 anywhere
    arrived_ptr,  # [B] int32 segments done
    error_ptr,  # [1] int32
    n_req,
    vocab,
    max_spec_len,
    NO_DRAFT_PROBS: tl.constexpr,
    SEGMENTED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SPEC_BLOCK: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    req, ok, start, num = _requests(cu_ptr, n_req, BLOCK_R)
    # accepted prefix: u * q(x) <= p(x) with q(x) > 0, up to the first failure
    pos = tl.arange(0, SPEC_BLOCK)[None, :]  # [1, P]
    live = ok[:, None] & (pos < num[:, None])  # [R, P]
    drafts = tl.load(draft_ptr + start[:, None] + pos, mask=live, other=0)
    target_rows = (start + req)[:, None].to(tl.int64) + pos
    p = tl.load(target_probs_ptr + target_rows * vocab + drafts, mask=live, other=0.0)
    if NO_DRAFT_PROBS:
        q = tl.where(live, 1.0, 0.0)
    else:
        q = tl.load(draft_probs_ptr + (start[:, None].to(tl.int64) + pos) * vocab + drafts, mask=live, other=0.0)
    u = tl.load(uniform_ptr + start[:, None] + pos, mask=live, other=1.0)
    num_accepted = _first_failure(live & (q > 0) & (u * q <= p), num, SPEC_BLOCK)
    rejected = ok & (num_accepted < num)
    rejected_id = tl.load(draft_ptr + start + num_accepted, mask=rejected, other=-1)
    # race over this segment of the row at the first rejection (residual) or after the last draft (bonus)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = ok[:, None] & (cols < vocab)[None, :]
    p = tl.load(target_probs_ptr + (start + req + num_accepted).to(tl.int64)[:, None] * vocab + cols[None, :],
                mask=mask, other=0.0)
    if NO_DRAFT_PROBS:
        residual = tl.where(cols[None, :] == rejected_id[:, None], 0.0, p)
    else:
        q = tl.load(draft_probs_ptr + (start + num_accepted).to(tl.int64)[:, None] * vocab + cols[None, :],
                    mask=mask & rejected[:, None], other=0.0)
        residual = tl.maximum(p - q, 0.0)
    residual = tl.where(rejected[:, None], residual, 0.0)
    expo = tl.load(expo_ptr + req.to(tl.int64)[:, None] * vocab + cols[None, :], mask=mask, other=1.0)
    best_residual = _packed_best(tl.math.div_rn(residual, expo), cols, mask)  # [R] int64
    best_p = _packed_best(tl.math.div_rn(p, expo), cols, mask)
    any_residual = tl.max((residual > 0).to(tl.int64), axis=1)
    last = ok
    if SEGMENTED:
        # relaxed slot updates, ordered by the counter's release / acquire (threadfence-reduction
        # pattern): one fenced atomic per program instead of eight
        slot = best_ptr + req.to(tl.int64) * 3
        tl.atomic_max(slot, best_residual, mask=ok, sem="relaxed")
        tl.atomic_max(slot + 1, best_p, mask=ok, sem="relaxed")
        tl.atomic_max(slot + 2, any_residual, mask=ok, sem="relaxed")
        tl.debug_barrier()
        done = tl.atomic_add(arrived_ptr + req, 1, mask=ok, sem="acq_rel")
        last = ok & (done == tl.num_programs(1) - 1)
        tl.debug_barrier()
        best_residual = tl.atomic_xchg(slot, 0, mask=last, sem="relaxed")
        best_p = tl.atomic_xchg(slot + 1, 0, mask=last, sem="relaxed")
        any_residual = tl.atomic_xchg(slot + 2, 0, mask=last, sem="relaxed")
        tl.atomic_xchg(arrived_ptr + req, 0, mask=last, sem="relaxed")
    recovered = 0x7FFFFFFF - (best_residual & 0xFFFFFFFF)
    bonus = 0x7FFFFFFF - (best_p & 0xFFFFFFFF)
    token = tl.where(rejected & (any_residual > 0), recovered, bonus)
    # the last segment to finish writes the row: accepted drafts, the token, placeholders
    _write_rows(out_ptr, req, last, drafts, num_accepted, token, max_spec_len, error_ptr, SPEC_BLOCK)


@triton.jit
def _first_failure(good, num, SPEC_BLOCK: tl.constexpr):
    """Per request: the accepted count, the first position whose test failed (good [R, P] is False
    at every position >= num), at most num."""
    pos = tl.arange(0, SPEC_BLOCK)[None, :]
    return tl.minimum(tl.min(tl.where(good, SPEC_BLOCK, pos), axis=1), num).to(tl.int32)


@triton.jit
def _write_rows(out_ptr, req, mask, drafts, num_accepted, token, max_spec_len, error_ptr, SPEC_BLOCK: tl.constexpr):
    """Each request's output row: the accepted drafts, the token, then PLACEHOLDER (-1)."""
    pos = tl.arange(0, SPEC_BLOCK)[None, :]
    row = out_ptr + req.to(tl.int64) * (max_spec_len + 1)
    at = num_accepted[:, None]
    values = tl.where(pos < at, drafts, tl.where(pos == at, token[:, None].to(tl.int64), -1))
    tl.store(row[:, None] + pos, values, mask=mask[:, None] & (pos < max_spec_len))
    tl.store(row + max_spec_len, tl.where(num_accepted == max_spec_len, token.to(tl.int64), -1), mask=mask)
    tl.debug_barrier()  # the sentinel overwrites position 0, which another thread may have written
    _error_sentinel(out_ptr, req, mask, max_spec_len + 1, error_ptr)


@triton.jit
def _packed_best(score, cols, mask):
    """Per row of score [R, C] >= 0: (float bits << 32) | (2^31 - 1 - first argmax column), int64."""
    score = tl.where(mask, score, -1.0)
    at = tl.argmax(score, axis=1, tie_break_left=True)  # [R]
    top = tl.max(score, axis=1)
    column = tl.min(tl.where(tl.arange(0, score.shape[1])[None, :] == at[:, None], cols[None, :], 2**30), axis=1)
    bits = tl.maximum(top, 0.0).to(tl.int32, bitcast=True).to(tl.int64)
    return (bits << 32) | (0x7FFFFFFF - column).to(tl.int64)
