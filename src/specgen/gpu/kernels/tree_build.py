"""Token trees' construction in one launch per level and one for the selection: core/round/tree.py's
grow and pick (the references), over a TreeStack's buffers, one program per tree (a batch's B rows,
or a tree alone: B = 1), each reading and writing its own row of the stacked buffers.

Why: the references are some 15 tensor operations per level (the pool's three copies, a sort, a
scatter, the frontier's paths, its draft rows) and some 25 for the selection (two sorts, scatters,
the children table, and core/step/rows.tree's k gathers for the target's rows); captured, each is a
kernel of about a microsecond plus its gap, and the tree round's drafting took 0.58 ms on an H100
against the chain round's 0.18 ms at the same k. Here each is one program: the pool holds at most
a few hundred candidates, so a sort is a selection (the frontier: w picks among w²) or a rank by
pairwise comparison (the selection: N²), with ties to the lower pool index as the references' stable
sorts give them. Integers and copied floats only, so they equal the references exactly
(tests/gpu/kernels/test_tree_build_kernel.py, in the Triton interpreter and on the GPU). A batch's
trees are one launch each, not B: per-row launches were some 200 more kernels a round at B = 16
and k = 6, each of a few microseconds in a captured graph.

Within the selection's program, stores that later loads read (each pool node's tree row, each row's
parent and offset) are separated from those loads by a barrier of the program's threads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous


def _pow2(n: int, least: int = 2) -> int:
    return max(least, triton.next_power_of_2(n))


def expand(trees, level: int, tokens: torch.Tensor, logq: torch.Tensor, start: torch.Tensor,
           root_id: torch.Tensor | None = None, dependent: bool = False) -> None:
    """core/round/tree.grow over a TreeStack of B rows: each row's children (tokens, log q [B w, w];
    level 0: the roots' [B, w], root_id [B]) into its pool, its next frontier, its draft paths and
    rows past its start [B]."""
    b, w, k = trees.batch, trees.w, trees.k
    root = level == 0
    assert tokens.shape == logq.shape == ((b, w) if root else (b * w, w)) and logq.dtype == torch.float32
    assert tokens.dtype == start.dtype == torch.long and start.shape == (b,) and start.device == trees.tokens.device
    assert not root or root_id.shape == (b,)
    size, levels = trees.tokens.shape[1], trees.tail.shape[-1]  # levels: k - 1 (at least 1)
    start = start.contiguous()  # [B]: program b reads entry b
    _expand_kernel[(b,)](
        tokens.contiguous(), logq.contiguous(), start, root_id.contiguous() if root else start, trees.ids,
        trees.tokens, trees.scores, trees.parent, trees.pool_offset, trees.frontier, trees.tail,
        trees.level_ids, trees.level_positions, trees.level_slots, trees.level_tail,
        level, size, levels, trees.n + 1,
        W=w, ROOT=root, LAST=level + 1 >= k, BLOCK_C=_pow2(w * w if not root else w), BLOCK_W=_pow2(w),
        BLOCK_T=_pow2(levels), BLOCK_N=min(_pow2(size), 256), DEPENDENT=dependent,
        num_warps=1, **launch_options(dependent),
    )


def select(trees, start: torch.Tensor, dependent: bool = False) -> None:
    """core/round/tree.pick over a TreeStack of B rows: each row's n best of its pool as tree rows
    (ids, parents, children, offset, row_of; drawn where the row's `draws`) and the target's rows
    over them past its start [B] (positions, slots, path, depth)."""
    b, size, n, w = trees.batch, trees.tokens.shape[1], trees.n, trees.w
    assert start.dtype == torch.long and start.shape == (b,) and start.device == trees.tokens.device
    _select_kernel[(b,)](
        trees.tokens, trees.scores, trees.parent, trees.pool_offset, trees.draws, start.contiguous(),
        trees.ids, trees.parents, trees.children, trees.offset, trees.row_of, trees.drawn,
        trees.positions, trees.slots, trees.path, trees.depth,
        size, n, trees.k + 1,
        W=w, DEEP=trees.k > 1, BLOCK_I=min(_pow2(size), 64), BLOCK_J=min(_pow2(size), 64),
        BLOCK_R=min(_pow2(n + 1), 64), BLOCK_W=_pow2(w), BLOCK_L=_pow2(trees.k + 1), DEPENDENT=dependent,
        num_warps=4, **launch_options(dependent),
    )


@triton.jit
def _expand_kernel(
    kid_tokens_ptr,  # [B w, w] int64 (level 0: [B, w]) each frontier node's children, parent-major
    kid_logq_ptr,  # [B w, w] float32 their log q
    start_ptr,  # [B] int64 the draft's committed prefix
    root_id_ptr,  # [B] int64 the root's token (level 0 only)
    ids_ptr,  # [B, 1, n+1] int64 the tree rows' tokens: row 0 written at level 0
    tokens_ptr, scores_ptr, parent_ptr, pool_offset_ptr,  # [B, N] the pool
    frontier_ptr,  # [B, k-1, w] int64 pool indices per level
    tail_ptr,  # [B, k-1, w, T] int64 draft offsets per frontier node, T = k - 1
    level_ids_ptr, level_positions_ptr, level_slots_ptr,  # [B, k-1, 1, w] int64 each frontier's draft rows
    level_tail_ptr,  # [B, k-1, 1, w, T] int64
    level, size, T, rows,  # rows: n + 1
    W: tl.constexpr, ROOT: tl.constexpr, LAST: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    # program b builds tree b: every pointer moves to its row of the stacked buffers (below, a
    # tree's own buffers, as in a stack of one)
    b = tl.program_id(0).to(tl.int64)
    kids = W if ROOT else W * W
    kid_tokens_ptr += b * kids
    kid_logq_ptr += b * kids
    start_ptr += b
    root_id_ptr += b
    ids_ptr += b * rows
    tokens_ptr += b * size
    scores_ptr += b * size
    parent_ptr += b * size
    pool_offset_ptr += b * size
    frontier_ptr += b * T * W
    tail_ptr += b * T * W * T
    level_ids_ptr += b * T * W
    level_positions_ptr += b * T * W
    level_slots_ptr += b * T * W
    level_tail_ptr += b * T * W * T
    start = tl.load(start_ptr)
    o = tl.arange(0, BLOCK_W)  # frontier index
    in_w = o < W
    j = tl.arange(0, BLOCK_T)  # a draft path's entries
    if ROOT:
        tokens = tl.load(kid_tokens_ptr + o, mask=in_w, other=0)
        tl.store(tokens_ptr + o, tokens, mask=in_w)
        tl.store(scores_ptr + o, tl.load(kid_logq_ptr + o, mask=in_w, other=0.0), mask=in_w)
        tl.store(ids_ptr, tl.load(root_id_ptr))
        for i0 in range(0, size, BLOCK_N):  # no candidate stepped yet but the first frontier
            i = i0 + tl.arange(0, BLOCK_N)
            tl.store(pool_offset_ptr + i, tl.where(i < W, i, -1).to(tl.int64), mask=i < size)
        # frontier 1's rows: the root's children at position start, paths from tail[0] (static)
        path = tl.load(tail_ptr + o[:, None] * T + j[None, :], mask=in_w[:, None] & (j[None, :] < T), other=0)
        tl.store(level_ids_ptr + o, tokens, mask=in_w)
        tl.store(level_positions_ptr + o, start + o * 0, mask=in_w)
        tl.store(level_slots_ptr + o, start + o, mask=in_w)
        tl.store(level_tail_ptr + o[:, None] * T + j[None, :], start + path, mask=in_w[:, None] & (j[None, :] < T))
    else:
        c = tl.arange(0, BLOCK_C)  # candidate, parent-major: c // W its parent's frontier index
        in_c = c < W * W
        base = W + (level - 1) * W * W
        parent = tl.load(frontier_ptr + (level - 1) * W + c // W, mask=in_c, other=0)
        scores = tl.load(scores_ptr + parent, mask=in_c, other=0.0) + tl.load(kid_logq_ptr + c, mask=in_c, other=0.0)
        tl.store(tokens_ptr + base + c, tl.load(kid_tokens_ptr + c, mask=in_c, other=0), mask=in_c)
        tl.store(scores_ptr + base + c, scores, mask=in_c)
        tl.store(parent_ptr + base + c, parent, mask=in_c)
        if not LAST:
            # the next frontier: W picks of the best remaining (ties to the lower index), best first;
            # -inf scores tie among themselves like any others
            taken = c >= W * W
            best = tl.zeros([BLOCK_W], dtype=tl.int32)
            keys = tl.where(c == 0, float("inf"), scores)  # the chain's node first (core/round/tree.py)
            for t in range(W):
                top = tl.max(tl.where(taken, float("-inf"), keys), axis=0)
                pick = tl.min(tl.where(~taken & (keys == top), c, BLOCK_C), axis=0)
                taken = taken | (c == pick)
                best = tl.where(o == t, pick, best)
            best = best.to(tl.int64)
            tl.store(frontier_ptr + level * W + o, base + best, mask=in_w)
            tl.store(pool_offset_ptr + base + best, (level * W + o).to(tl.int64), mask=in_w)
            up = best // W  # each one's parent, as a frontier index of the level before
            above = tl.load(tail_ptr + (level - 1) * W * T + up[:, None] * T + j[None, :],
                            mask=in_w[:, None] & (j[None, :] < level), other=0)
            rest = tl.load(tail_ptr + level * W * T + o[:, None] * T + j[None, :],
                           mask=in_w[:, None] & (j[None, :] > level) & (j[None, :] < T), other=0)
            path = tl.where(j[None, :] < level, above, tl.where(j[None, :] == level, level * W + o[:, None], rest))
            tl.store(tail_ptr + level * W * T + o[:, None] * T + j[None, :], path,
                     mask=in_w[:, None] & (j[None, :] <= level) & (j[None, :] < T))
            # its rows: the frontier's tokens at position start + level, after their ancestors' slots
            at = level * W + o
            tl.store(level_ids_ptr + at, tl.load(kid_tokens_ptr + best, mask=in_w, other=0), mask=in_w)
            tl.store(level_positions_ptr + at, start + level + o * 0, mask=in_w)
            tl.store(level_slots_ptr + at, start + level * W + o, mask=in_w)
            tl.store(level_tail_ptr + at[:, None] * T + j[None, :], start + path,
                     mask=in_w[:, None] & (j[None, :] < T))


@triton.jit
def _spine(i, W: tl.constexpr):
    """The pool's chain nodes among indices i: 0, and the first of each level's W x W candidates
    (core/round/tree.py's spine)."""
    return (i == 0) | ((i >= W) & ((i - W) % (W * W) == 0))


@triton.jit
def _select_kernel(
    tokens_ptr, scores_ptr, parent_ptr, pool_offset_ptr,  # [B, N] the pool
    draws_ptr,  # [B] bool the row's children are drawn: its stepped nodes first, its `drawn` written
    start_ptr,  # [B] int64 the target's committed prefix
    ids_ptr,  # [B, 1, n+1] int64 (row 0, the root, is the expand's)
    parents_ptr,  # [B, n+1] int64 tree rows (row 0's stays -1)
    children_ptr,  # [B, n+1, W] int64 tree rows by rank, -1: none
    offset_ptr,  # [B, n+1] int64 draft offsets (row 0's stays -1)
    row_of_ptr,  # [B, N] int64 pool index -> tree row, 0: unselected
    drawn_ptr,  # [B, n+1, W] int64 expanded rows' children's tokens, -1: not expanded
    positions_ptr, slots_ptr,  # [B, 1, n+1] int64 the target's rows
    path_ptr,  # [B, 1, n+1, L] int64 each row's tail: its path from the root, then itself as padding
    depth_ptr,  # [B, 1, n+1] int64
    size, n, L,
    W: tl.constexpr, DEEP: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_L: tl.constexpr, DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    # program b selects tree b: every pointer moves to its row of the stacked buffers
    b = tl.program_id(0).to(tl.int64)
    tokens_ptr += b * size
    scores_ptr += b * size
    parent_ptr += b * size
    pool_offset_ptr += b * size
    row_of_ptr += b * size
    draws_ptr += b
    start_ptr += b
    ids_ptr += b * (n + 1)
    parents_ptr += b * (n + 1)
    offset_ptr += b * (n + 1)
    positions_ptr += b * (n + 1)
    slots_ptr += b * (n + 1)
    depth_ptr += b * (n + 1)
    children_ptr += b * (n + 1) * W
    drawn_ptr += b * (n + 1) * W
    path_ptr += b * (n + 1) * L
    # a row's flag, not a constexpr: rows of drawn and of top-w children share the launch (as
    # the reference's torch.where); with k = 1 (not DEEP) no node is stepped, so none goes first.
    # Loaded over each block's shape: a scalar flag and'ed with a block mask is an int32 mask in
    # Triton's interpreter, which its loads and stores refuse
    draws_i = tl.load(draws_ptr + tl.zeros([BLOCK_I], tl.int32)) != 0
    draws_j = tl.load(draws_ptr + tl.zeros([BLOCK_J], tl.int32)) != 0
    draws_cell = tl.load(draws_ptr + tl.zeros([BLOCK_R, BLOCK_W], tl.int32)) != 0
    start = tl.load(start_ptr)
    # 1. each candidate's rank (candidates before it: a higher key, or the same at a lower index);
    # the n first are the tree, numbered in pool order
    chosen_before = tl.full([], 0, tl.int32)
    for i0 in range(0, size, BLOCK_I):
        i = i0 + tl.arange(0, BLOCK_I)
        in_pool = i < size
        key = tl.load(scores_ptr + i, mask=in_pool, other=0.0)
        key = tl.where(_spine(i, W), float("inf"), key)  # the chain's nodes first (core/round/tree.py)
        offset = tl.load(pool_offset_ptr + i, mask=in_pool, other=-1)
        if DEEP:
            key = tl.where(draws_i & (offset >= 0), float("inf"), key)
        rank = tl.zeros([BLOCK_I], dtype=tl.int32)
        for j0 in range(0, size, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            other = tl.load(scores_ptr + jj, mask=jj < size, other=0.0)
            other = tl.where(_spine(jj, W), float("inf"), other)
            if DEEP:
                other = tl.where(draws_j & (tl.load(pool_offset_ptr + jj, mask=jj < size, other=-1) >= 0),
                                 float("inf"), other)
            ahead = (other[None, :] > key[:, None]) | ((other[None, :] == key[:, None]) & (jj[None, :] < i[:, None]))
            rank += tl.sum((ahead & (jj[None, :] < size)).to(tl.int32), axis=1)
        chosen = in_pool & (rank < n)
        row = chosen_before + tl.cumsum(chosen.to(tl.int32), axis=0)
        chosen_before += tl.sum(chosen.to(tl.int32), axis=0)
        row = row.to(tl.int64)
        tl.store(row_of_ptr + i, tl.where(chosen, row, 0), mask=in_pool)
        tl.store(ids_ptr + row, tl.load(tokens_ptr + i, mask=chosen, other=0), mask=chosen)
        tl.store(offset_ptr + row, offset, mask=chosen)
        level = tl.where(i < W, 1, 2 + (i - W) // (W * W))  # the pool's level: depth - 1
        tl.store(depth_ptr + row, (level + 1).to(tl.int64), mask=chosen)
    tl.debug_barrier()
    # 2. each selected node's parent row
    for i0 in range(0, size, BLOCK_I):
        i = i0 + tl.arange(0, BLOCK_I)
        row = tl.load(row_of_ptr + i, mask=i < size, other=0)
        up = tl.load(parent_ptr + i, mask=row > 0, other=-1)
        up_row = tl.load(row_of_ptr + up, mask=(row > 0) & (up >= 0), other=0)
        tl.store(parents_ptr + row, up_row, mask=row > 0)
    tl.debug_barrier()
    # 3. per tree row: its children (the pool's w slots from w (1 + offset), where it was expanded),
    # and the target's row: at position start + depth - 1, slot start + r, its path root-first
    rank = tl.arange(0, BLOCK_W)
    lane = tl.arange(0, BLOCK_L)
    for r0 in range(0, n + 1, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        in_rows = r <= n
        offset = tl.load(offset_ptr + r, mask=in_rows, other=-1)
        first = W * (1 + offset)
        slot = first[:, None] + rank[None, :]  # [R, W]
        kids = in_rows[:, None] & ((r == 0) | (offset >= 0))[:, None] & (slot < size) & (rank[None, :] < W)
        child = tl.load(row_of_ptr + slot, mask=kids, other=0)
        cell = r[:, None] * W + rank[None, :]
        in_cell = in_rows[:, None] & (rank[None, :] < W)
        tl.store(children_ptr + cell, tl.where(kids & (child > 0), child, -1), mask=in_cell)
        tl.store(drawn_ptr + cell, tl.where(kids, tl.load(tokens_ptr + slot, mask=kids & draws_cell, other=0), -1),
                 mask=in_cell & draws_cell)  # a row of top-w children keeps its drawn (as the reference)
        depth = tl.where(r == 0, 1, tl.load(depth_ptr + r, mask=in_rows & (r > 0), other=1))
        node = r.to(tl.int64)
        path = tl.zeros([BLOCK_R, BLOCK_L], dtype=tl.int64) + node[:, None]  # entries past depth: itself
        for s in range(L):  # up the parents: the entry at depth - 1 - s is the ancestor s levels up
            at = depth - 1 - s
            path = tl.where(lane[None, :] == at[:, None], node[:, None], path)
            node = tl.where(at > 0, tl.load(parents_ptr + node, mask=in_rows & (at > 0), other=0), node)
        tl.store(path_ptr + r[:, None] * L + lane[None, :], start + path, mask=in_rows[:, None] & (lane[None, :] < L))
        tl.store(depth_ptr + r, depth.to(tl.int64), mask=in_rows)
        tl.store(positions_ptr + r, start + depth - 1, mask=in_rows)
        tl.store(slots_ptr + r, start + r, mask=in_rows)
