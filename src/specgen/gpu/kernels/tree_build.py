"""A token tree's construction in one launch per level and one for the selection: core/round/tree.py's
grow and pick (the references), over the Tree's own buffers.

Why: the references are some 15 tensor operations per level (the pool's three copies, a sort, a
scatter, the frontier's paths, its draft rows) and some 25 for the selection (two sorts, scatters,
the children table, and core/step/rows.tree's k gathers for the target's rows); captured, each is a
kernel of about a microsecond plus its gap, and the tree round's drafting took 0.58 ms on an H100
against the chain round's 0.18 ms at the same k. Here each is one program: the pool holds at most
a few hundred candidates, so a sort is a selection (the frontier: w picks among w²) or a rank by
pairwise comparison (the selection: N²), with ties to the lower pool index as the references' stable
sorts give them. Integers and copied floats only, so they equal the references exactly
(tests/gpu/kernels/test_tree_build_kernel.py, in the Triton interpreter and on the GPU).

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


def expand(tree, level: int, tokens: torch.Tensor, logq: torch.Tensor, start: torch.Tensor,
           root_id: torch.Tensor | None = None, dependent: bool = False) -> None:
    """core/round/tree.grow: level `level`'s children (tokens, log q [w, w]; level 0: the root's
    [1, w], root_id [1]) into the pool, the next frontier, its draft paths and rows past start [1]."""
    w, k = tree.w, tree.k
    root = level == 0
    assert tokens.shape == logq.shape == ((1, w) if root else (w, w)) and logq.dtype == torch.float32
    assert tokens.dtype == start.dtype == torch.long and start.device == tree.tokens.device
    levels = tree.tail.shape[-1]  # k - 1 (at least 1)
    _expand_kernel[(1,)](
        tokens.contiguous(), logq.contiguous(), start, root_id if root else start, tree.ids,
        tree.tokens, tree.scores, tree.parent, tree.pool_offset, tree.frontier, tree.tail,
        tree.level_ids, tree.level_positions, tree.level_slots, tree.level_tail,
        level, tree.tokens.shape[0], levels,
        W=w, ROOT=root, LAST=level + 1 >= k, BLOCK_C=_pow2(w * w if not root else w), BLOCK_W=_pow2(w),
        BLOCK_T=_pow2(levels), BLOCK_N=min(_pow2(tree.tokens.shape[0]), 256), DEPENDENT=dependent,
        num_warps=1, **launch_options(dependent),
    )


def select(tree, start: torch.Tensor, dependent: bool = False) -> None:
    """core/round/tree.pick: the n best of the pool as tree rows (ids, parents, children, offset,
    row_of, drawn) and the target's rows over them past start [1] (positions, slots, path, depth)."""
    size, n, w = tree.tokens.shape[0], tree.n, tree.w
    assert start.dtype == torch.long and start.device == tree.tokens.device
    _select_kernel[(1,)](
        tree.tokens, tree.scores, tree.parent, tree.pool_offset, start,
        tree.ids, tree.parents, tree.children, tree.offset, tree.row_of, tree.drawn,
        tree.positions, tree.slots, tree.path, tree.depth,
        size, n, tree.k + 1,
        W=w, STEPPED_FIRST=tree.sampled and tree.k > 1, DRAWN=tree.sampled,
        BLOCK_I=min(_pow2(size), 64), BLOCK_J=min(_pow2(size), 64), BLOCK_R=min(_pow2(n + 1), 64),
        BLOCK_W=_pow2(w), BLOCK_L=_pow2(tree.k + 1), DEPENDENT=dependent, num_warps=4,
        **launch_options(dependent),
    )


@triton.jit
def _expand_kernel(
    kid_tokens_ptr,  # [w, w] int64 (level 0: [1, w]) each frontier node's children, parent-major
    kid_logq_ptr,  # [w, w] float32 their log q
    start_ptr,  # [1] int64 the draft's committed prefix
    root_id_ptr,  # [1] int64 the root's token (level 0 only)
    ids_ptr,  # [1, n+1] int64 the tree rows' tokens: row 0 written at level 0
    tokens_ptr, scores_ptr, parent_ptr, pool_offset_ptr,  # [N] the pool
    frontier_ptr,  # [k-1, w] int64 pool indices per level
    tail_ptr,  # [k-1, w, T] int64 draft offsets per frontier node, T = k - 1
    level_ids_ptr, level_positions_ptr, level_slots_ptr,  # [k-1, 1, w] int64 each frontier's draft rows
    level_tail_ptr,  # [k-1, 1, w, T] int64
    level, size, T,
    W: tl.constexpr, ROOT: tl.constexpr, LAST: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
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
            for t in range(W):
                top = tl.max(tl.where(taken, float("-inf"), scores), axis=0)
                pick = tl.min(tl.where(~taken & (scores == top), c, BLOCK_C), axis=0)
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
def _select_kernel(
    tokens_ptr, scores_ptr, parent_ptr, pool_offset_ptr,  # [N] the pool
    start_ptr,  # [1] int64 the target's committed prefix
    ids_ptr,  # [1, n+1] int64 (row 0, the root, is the expand's)
    parents_ptr,  # [n+1] int64 tree rows (row 0's stays -1)
    children_ptr,  # [n+1, W] int64 tree rows by rank, -1: none
    offset_ptr,  # [n+1] int64 draft offsets (row 0's stays -1)
    row_of_ptr,  # [N] int64 pool index -> tree row, 0: unselected
    drawn_ptr,  # [n+1, W] int64 expanded rows' children's tokens, -1: not expanded
    positions_ptr, slots_ptr,  # [1, n+1] int64 the target's rows
    path_ptr,  # [1, n+1, L] int64 each row's tail: its path from the root, then itself as padding
    depth_ptr,  # [1, n+1] int64
    size, n, L,
    W: tl.constexpr, STEPPED_FIRST: tl.constexpr, DRAWN: tl.constexpr, BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_L: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    start = tl.load(start_ptr)
    # 1. each candidate's rank (candidates before it: a higher key, or the same at a lower index);
    # the n first are the tree, numbered in pool order
    chosen_before = tl.full([], 0, tl.int32)
    for i0 in range(0, size, BLOCK_I):
        i = i0 + tl.arange(0, BLOCK_I)
        in_pool = i < size
        key = tl.load(scores_ptr + i, mask=in_pool, other=0.0)
        offset = tl.load(pool_offset_ptr + i, mask=in_pool, other=-1)
        if STEPPED_FIRST:
            key = tl.where(offset >= 0, float("inf"), key)
        rank = tl.zeros([BLOCK_I], dtype=tl.int32)
        for j0 in range(0, size, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            other = tl.load(scores_ptr + jj, mask=jj < size, other=0.0)
            if STEPPED_FIRST:
                other = tl.where(tl.load(pool_offset_ptr + jj, mask=jj < size, other=-1) >= 0, float("inf"), other)
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
        if DRAWN:
            tl.store(drawn_ptr + cell, tl.where(kids, tl.load(tokens_ptr + slot, mask=kids, other=0), -1),
                     mask=in_cell)
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
