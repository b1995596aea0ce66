"""A round's bookkeeping in one kernel each: core/sampling/bookkeeping.py's count_drafts and commit.

Why: captured, each tensor operation of the reference is a kernel of about a microsecond plus its
gap; the two together were some 25 kernels, and moving them here took about 45 µs off a round
on an H200, 7-8% of the bench pair's (`git show 1b54921:docs/benchmarks.md`, "A round's bookkeeping in
two kernels (H200)"). Each kernel here is one program of one warp over the round's k + 1
positions:
every load comes before any store, and a scalar's read-modify-write (the positions, generated)
is stored by one thread from its own load. Integers only, so they equal the reference exactly
(tests/gpu/kernels/test_commit.py, in the Triton interpreter and on the GPU). A batch's rows
(count_drafts_rows, commit_rows) launch one such program per row, each at its row's offsets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.core.sampling.bookkeeping import CommitBuffers
from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous


def _block(k: int) -> int:
    return max(16, triton.next_power_of_2(k + 1))


def count_drafts(confident: torch.Tensor, budget: torch.Tensor, limit: torch.Tensor, generated: torch.Tensor,
                 out: torch.Tensor, dependent: bool = False) -> None:
    k = confident.shape[0]
    assert confident.dtype == torch.bool and budget.dtype == out.dtype == torch.int32
    _count_kernel[(1,)](confident, budget, limit, generated, out, k, BLOCK=_block(k), DEPENDENT=dependent,
                        num_warps=1, **launch_options(dependent))


def count_drafts_rows(confident: torch.Tensor, budget: torch.Tensor, limit: torch.Tensor, generated: torch.Tensor,
                      out: torch.Tensor, dependent: bool = False) -> None:
    """core/sampling/bookkeeping.count_drafts_rows: one program per row, each the one-row kernel
    at its row's flags (confident [B, k])."""
    rows, k = confident.shape
    assert confident.dtype == torch.bool and budget.dtype == out.dtype == torch.int32 and confident.is_contiguous()
    assert all(t.shape == (rows,) and t.is_contiguous() for t in (budget, limit, generated, out))
    _count_kernel[(rows,)](confident, budget, limit, generated, out, k, BLOCK=_block(k), DEPENDENT=dependent,
                           num_warps=1, **launch_options(dependent))


def commit(b: CommitBuffers, dependent: bool = False) -> None:
    k = b.row.shape[0] - 1
    has_draft = b.draft_position is not None
    assert b.row.dtype == b.feed.dtype == b.stage.dtype == torch.int64 and b.num_drafts.dtype == torch.int32
    assert b.row.is_contiguous() and b.feed.is_contiguous() and b.stage.shape == (2 * k + 2,)
    _commit_kernel[(1,)](
        b.row, b.feed, b.num_drafts, b.stage, b.target_position, b.emitted, b.generated,
        b.draft_position if has_draft else b.target_position, b.pending if has_draft else b.feed, k, b.ran,
        HAS_DRAFT=has_draft, BLOCK=_block(k), DEPENDENT=dependent, num_warps=1, **launch_options(dependent),
    )


def commit_rows(b: CommitBuffers, dependent: bool = False) -> None:
    """core/sampling/bookkeeping.commit_rows: one program per row, each the one-row kernel at its
    row's offsets (every buffer contiguous, rows leading)."""
    rows, k = b.row.shape[0], b.row.shape[1] - 1
    has_draft = b.draft_position is not None
    assert b.row.dtype == b.feed.dtype == b.stage.dtype == torch.int64 and b.num_drafts.dtype == torch.int32
    assert b.stage.shape == (rows, 2 * k + 2) and b.feed.shape == (rows, k + 1)
    tensors = (b.row, b.feed, b.num_drafts, b.stage, b.target_position, b.emitted, b.generated,
               *((b.draft_position, b.pending) if has_draft else ()))
    assert all(t.is_contiguous() and t.shape[0] == rows for t in tensors)
    _commit_kernel[(rows,)](
        b.row, b.feed, b.num_drafts, b.stage, b.target_position, b.emitted, b.generated,
        b.draft_position if has_draft else b.target_position, b.pending if has_draft else b.feed, k, b.ran,
        HAS_DRAFT=has_draft, BLOCK=_block(k), DEPENDENT=dependent, num_warps=1, **launch_options(dependent),
    )


@triton.jit
def _count_kernel(confident_ptr, budget_ptr, limit_ptr, generated_ptr, out_ptr, k, BLOCK: tl.constexpr,
                  DEPENDENT: tl.constexpr):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    r = tl.program_id(0)  # the row (a batch's; 0 for one request)
    budget_ptr += r
    limit_ptr += r
    generated_ptr += r
    out_ptr += r
    confident_ptr += r * k  # a batch's rows each have k flags
    i = tl.arange(0, BLOCK)
    sure = tl.load(confident_ptr + i, mask=i < k, other=1).to(tl.int32)
    first_unsure = tl.min(tl.where(sure == 0, i, k), axis=0)  # k when every step is sure
    room = tl.minimum(tl.maximum(tl.load(limit_ptr) - tl.load(generated_ptr), 0), k)
    n = tl.minimum(tl.minimum(tl.load(budget_ptr).to(tl.int64), first_unsure.to(tl.int64)), room)
    tl.store(out_ptr, n.to(tl.int32))


@triton.jit
def _commit_kernel(row_ptr, feed_ptr, num_ptr, stage_ptr, target_pos_ptr, emitted_ptr, generated_ptr, draft_pos_ptr,
                   pending_ptr, k, ran, HAS_DRAFT: tl.constexpr, BLOCK: tl.constexpr, DEPENDENT: tl.constexpr):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    r = tl.program_id(0).to(tl.int64)  # the row (a batch's; 0 for one request): its buffers' offsets
    row_ptr += r * (k + 1)
    feed_ptr += r * (k + 1)
    num_ptr += r
    stage_ptr += r * (2 * k + 2)
    target_pos_ptr += r
    emitted_ptr += r
    generated_ptr += r
    draft_pos_ptr += r
    pending_ptr += r * 2
    i = tl.arange(0, BLOCK)
    in_row = i <= k
    row = tl.load(row_ptr + i, mask=in_row, other=-1)
    feed = tl.load(feed_ptr + i, mask=in_row, other=0)
    num = tl.load(num_ptr)
    target_pos = tl.load(target_pos_ptr)
    draft_pos = tl.load(draft_pos_ptr)  # the target's again without a draft: unused
    generated = tl.load(generated_ptr)
    # stage = [row (k + 1) | drafts = feed[1:] (k) | num_drafts]
    tl.store(stage_ptr + i, row, mask=in_row)
    tl.store(stage_ptr + k + i, feed, mask=in_row & (i >= 1))
    tl.store(stage_ptr + 2 * k + 1, num.to(tl.int64))
    emitted = tl.sum((row >= 0).to(tl.int64), axis=0)
    last = tl.minimum(tl.maximum(emitted - 1, 0), k)
    newest = tl.sum(tl.where(i == last, row, 0), axis=0)
    tl.store(target_pos_ptr, target_pos - (k + 1 - emitted))
    if HAS_DRAFT:
        tl.store(draft_pos_ptr, draft_pos - (ran - emitted))
        tl.store(pending_ptr, tl.sum(tl.where(i == last, feed, 0), axis=0))
        tl.store(pending_ptr + 1, newest)
    tl.store(feed_ptr, newest)
    tl.store(emitted_ptr, emitted)
    tl.store(generated_ptr, generated + emitted)
