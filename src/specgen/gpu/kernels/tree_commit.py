"""A token tree round's commit in one kernel: core/sampling/bookkeeping.py's tree_commit (the reference).

Why: after the walk, a tree round's ranks, staged ids, compaction slots, next inputs and positions
were some 50 tensor operations on a few integers, each a kernel and a graph node once captured:
0.10 ms of the bench pair's round on an H200, against 0.015 ms for a chain round's commit kernel
(gpu/kernels/commit.py). One program of one warp per row (a round alone: one) over the k + 1
depths: every load comes before any store (feed[0], read as the root, is written here too), and
a scalar's read-modify-write is stored from its own load. Integers only, so the kernel equals the
reference exactly (tests/gpu/kernels/test_tree_commit.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.core.sampling.bookkeeping import TreeCommitBuffers
from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous


def tree_commit(b: TreeCommitBuffers, dependent: bool = False) -> None:
    rows, k = b.path.shape
    nodes, width = b.children.shape[1], b.children.shape[2]
    has_draft, compacts = b.draft_position is not None, b.draft_slots is not None
    assert k >= 1 and b.out.shape == (rows, k + 1) and b.shown.shape == (rows, k) and b.taken.shape == (rows,)
    assert b.tokens.shape == (rows, nodes) and (b.drawn is None or b.drawn.shape == b.children.shape)
    assert b.stage.shape == (rows, 3 * k + 3) and b.rows.shape == b.feed.shape == (rows, k + 1)
    assert b.target_slots.shape == (rows, 2, k) and b.num_drafts.dtype == torch.int32
    assert not compacts or (has_draft and b.draft_slots.shape == (rows, 2, k - 1) and b.offset.shape == (rows, nodes))
    tensors = [b.out, b.path, b.shown, b.taken, b.children, b.tokens, b.num_drafts, b.stage, b.rows, b.feed,
               b.target_position, b.emitted, b.generated, b.target_slots]
    optional = [b.drawn, b.draft_position, b.pending, b.offset, b.draft_slots]
    assert all(t.is_contiguous() for t in tensors + [t for t in optional if t is not None])
    assert all(t.dtype == torch.int64 for t in tensors + optional if t is not None and t is not b.num_drafts)
    dummy = b.target_position  # stands in for absent optional tensors (never dereferenced)
    _tree_commit_kernel[(rows,)](
        b.out, b.path, b.shown, b.taken, b.children, b.tokens, dummy if b.drawn is None else b.drawn,
        b.num_drafts, b.stage, b.rows, b.feed, b.target_position, b.emitted, b.generated, b.target_slots,
        b.draft_position if has_draft else dummy, b.pending if has_draft else dummy,
        b.offset if compacts else dummy, b.draft_slots if compacts else dummy,
        k, nodes, b.ran,
        W=width, WB=max(2, triton.next_power_of_2(width)), BLOCK=max(16, triton.next_power_of_2(k + 1)),
        DRAWN=b.drawn is not None, HAS_DRAFT=has_draft, COMPACTS=compacts, DEPENDENT=dependent, num_warps=1,
        **launch_options(dependent),
    )


@triton.jit(do_not_specialize=["k", "nodes", "ran"])
def _tree_commit_kernel(
    out_ptr,  # [B, k + 1]
    path_ptr,  # [B, k]
    shown_ptr,  # [B, k]
    taken_ptr,  # [B]
    children_ptr,  # [B, n + 1, W] tree rows, -1: none
    tokens_ptr,  # [B, n + 1]
    drawn_ptr,  # [B, n + 1, W] tokens, -1: none (DRAWN)
    num_ptr,  # [B] int32
    stage_ptr,  # [B, 3k + 3]
    rows_ptr,  # [B, k + 1]
    feed_ptr,  # [B, k + 1]
    target_pos_ptr,  # [B]
    emitted_ptr,  # [B]
    generated_ptr,  # [B]
    target_slots_ptr,  # [B, 2, k]
    draft_pos_ptr,  # [B] (HAS_DRAFT)
    pending_ptr,  # [B, 2] (HAS_DRAFT)
    offset_ptr,  # [B, n + 1] (COMPACTS)
    draft_slots_ptr,  # [B, 2, k - 1] (COMPACTS)
    k,
    nodes,  # n + 1
    ran,
    W: tl.constexpr,
    WB: tl.constexpr,
    BLOCK: tl.constexpr,
    DRAWN: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    COMPACTS: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    lane = tl.arange(0, WB)[None, :]
    depth = i < k  # [BLOCK] the k depths below the root
    out = tl.load(out_ptr + b * (k + 1) + i, mask=i <= k, other=-1)
    path = tl.load(path_ptr + b * k + i, mask=depth, other=0)
    shown = tl.load(shown_ptr + b * k + i, mask=depth, other=0)
    parents = tl.load(path_ptr + b * k + i - 1, mask=(i >= 1) & (i <= k), other=0)  # [0 | path]: root first
    taken = tl.load(taken_ptr + b)
    num = tl.load(num_ptr + b).to(tl.int64)
    target_pos = tl.load(target_pos_ptr + b)
    generated = tl.load(generated_ptr + b)
    root = tl.load(feed_ptr + b * (k + 1))
    first = b * nodes
    inside = depth[:, None] & (lane < W)
    if DRAWN:
        siblings = tl.load(drawn_ptr + (first + parents[:, None]) * W + lane, mask=inside, other=-1)
    else:
        kids = tl.load(children_ptr + (first + parents[:, None]) * W + lane, mask=inside, other=-1)
        kid_tokens = tl.load(tokens_ptr + first + tl.maximum(kids, 0), mask=inside, other=0)
        siblings = tl.where(kids >= 0, kid_tokens, -1)
    if HAS_DRAFT:
        draft_pos = tl.load(draft_pos_ptr + b)
    if COMPACTS:
        offset = tl.load(offset_ptr + first + path, mask=i < k - 1, other=0)
    # every load above, every store below
    emitted = tl.sum((out >= 0).to(tl.int64), axis=0)
    last = tl.minimum(tl.maximum(emitted - 1, 0), k)
    newest = tl.sum(tl.where(i == last, out, 0), axis=0)
    match = (siblings == out[:, None]) & (siblings >= 0)
    rank = tl.min(tl.where(match, lane, WB), axis=1)  # the first match (siblings hold distinct tokens)
    ranks = tl.where((rank < WB) & (i < emitted - 1 + taken), rank, -1)
    shown = tl.where((taken > 0) & (i == emitted - 1), out, shown)
    stage = stage_ptr + b * (3 * k + 3)  # out | shown | n | taken | ranks
    tl.store(stage + i, out, mask=i <= k)
    tl.store(stage + k + 1 + i, shown, mask=depth)
    tl.store(stage + 2 * k + 1, num)
    tl.store(stage + 2 * k + 2, taken)
    tl.store(stage + 2 * k + 3 + i, ranks, mask=depth)
    tl.store(rows_ptr + b * (k + 1) + i, parents, mask=i <= k)
    dst = target_pos + 1 + i
    tl.store(target_slots_ptr + b * 2 * k + i, tl.where(i < emitted - 1, target_pos + path, dst), mask=depth)
    tl.store(target_slots_ptr + b * 2 * k + k + i, dst, mask=depth)
    if HAS_DRAFT:
        if COMPACTS:
            moved = i < k - 1
            dst = draft_pos + i
            slots = draft_slots_ptr + b * 2 * (k - 1)
            tl.store(slots + i, tl.where(i < emitted - 2, draft_pos + offset, dst), mask=moved)
            tl.store(slots + k - 1 + i, dst, mask=moved)
        before = tl.where(last == 0, root, tl.sum(tl.where(i == last - 1, out, 0), axis=0))
        tl.store(pending_ptr + b * 2, before)
        tl.store(pending_ptr + b * 2 + 1, newest)
        tl.store(draft_pos_ptr + b, draft_pos + emitted - ran)
    tl.store(feed_ptr + b * (k + 1), newest)
    tl.store(target_pos_ptr + b, target_pos + emitted)
    tl.store(emitted_ptr + b, emitted)
    tl.store(generated_ptr + b, generated + emitted)
