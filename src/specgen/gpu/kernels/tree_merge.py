"""A merged token tree in one launch: core/round/merged_tree.py's merge (the reference), which
rewrites the model's Tree, as its selection left it, as the lookup's trie plus the model's best
nodes, and the target's rows over the result.

Why: the reference's tensor operations (a sort and a stable re-sort for the ranks, the scatters
of the row map, the index copies of each buffer, core/step/rows.tree's k gathers) are some 118
launches at k = 3, width 3, 8 nodes (tests/core/round/test_tree_launches.py counts them); in a
captured graph each is a kernel of a few microseconds, a large part of a small target's whole
round (a 100M model's takes about 0.5 ms). A tree is small (n + 1 <= 64 rows, w <= 8), so one program
does it: the model rows' ranks by pairwise comparison (rank_i = eligible j with a higher key, or
the same key at a lower row: the reference's stable descending sort, its eligible rows first),
their merged rows by a cumulative count, the parent walk in k gathers. Integers and compared
floats only: the outputs equal the reference's exactly (tests/gpu/kernels/test_tree_merge_kernel.py).

The model's buffers are read and rewritten in place: the program reads every input it needs
before its first store to them (the model rows' map goes to a scratch buffer, which the stores'
gathers read after a barrier of the program's threads), and the walk reads the merged parents
after another barrier.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous
from specgen.gpu.workspace import Workspace


def _pow2(n: int, least: int = 2) -> int:
    return max(least, triton.next_power_of_2(n))


def merge(tree, lookup, start: torch.Tensor, point: torch.Tensor, workspace: Workspace,
          dependent: bool = False) -> None:
    """core/round/merged_tree.merge: `tree` (a Tree) rewritten as the merged tree of the lookup's
    staged trie (a StagedLookup: children [n+1, w], ids [n], parents [n+1]) and its own best
    nodes, with the target's rows past start ([1] int64), and point [n + 1, w] (bool) the lookup's
    lanes."""
    n, w, k = tree.n, tree.w, tree.k
    size = tree.tokens.shape[0]
    device = tree.ids.device
    assert start.dtype == torch.long and start.numel() == 1 and start.device == device
    assert point.shape == (n + 1, w) and point.dtype == torch.bool and point.is_contiguous()
    assert lookup.children.shape == (n + 1, w) and lookup.ids.shape == (n,) and lookup.parents.shape == (n + 1,)
    assert workspace.device == device, f"workspace on {workspace.device}, tensors on {device}"
    mapped = workspace.scratch("tree_merge_rows", n + 1, torch.int64)
    _merge_kernel[(1,)](
        lookup.children, lookup.ids, lookup.parents,
        tree.ids, tree.parents, tree.children, tree.offset, tree.drawn, tree.row_of,
        tree.scores, tree.spine.view(torch.uint8), tree.pool_offset, tree.draws.view(torch.uint8),
        start, point.view(torch.uint8), mapped,
        tree.positions, tree.slots, tree.path, tree.depth,
        size, n,
        W=w, K=k, BLOCK_R=_pow2(n + 1), BLOCK_W=_pow2(w), BLOCK_N=min(_pow2(size), 64), BLOCK_L=_pow2(k + 1),
        DEPENDENT=dependent, num_warps=4, **launch_options(dependent),
    )


@triton.jit
def _lookup_ids(rows, root_id, look_ids_ptr):
    """The lookup's tokens at tree rows `rows` (>= 0): row 0 the root's, row r its node r - 1's."""
    return tl.where(rows == 0, root_id, tl.load(look_ids_ptr + rows - 1, mask=rows > 0, other=0))


@triton.jit
def _merge_kernel(
    looked_ptr,  # [n+1, W] int64 the lookup's rows' children by rank (tree rows), -1: none
    look_ids_ptr,  # [n] int64 its rows 1 .. n's tokens (padding: 0)
    look_parents_ptr,  # [n+1] int64 its rows' parents (row 0: -1; padding: 0)
    ids_ptr,  # [1, n+1] int64 the model's tree rows' tokens (row 0 the root), rewritten merged
    parents_ptr,  # [n+1] int64, rewritten
    children_ptr,  # [n+1, W] int64 by rank, -1: none; rewritten
    offset_ptr,  # [n+1] int64 draft offsets, -1: none; rewritten
    drawn_ptr,  # [n+1, W] int64 expanded rows' children's tokens; rewritten
    row_of_ptr,  # [N] int64 pool index -> tree row (0: none), rewritten as merged rows
    scores_ptr,  # [N] float32 the pool's cumulative log q
    spine_ptr,  # [N] uint8 (bool) the chain's nodes
    pool_offset_ptr,  # [N] int64 draft offsets, -1: not stepped
    draws_ptr,  # [] uint8 (bool) the model's children are drawn
    start_ptr,  # [1] int64 the target's committed prefix
    point_ptr,  # [n+1, W] uint8 (bool) out: the lookup's lanes
    mapped_ptr,  # [n+1] int64 scratch: each model row's merged row, -1: left out
    positions_ptr, slots_ptr,  # [1, n+1] int64 out: the target's rows
    path_ptr,  # [1, n+1, K+1] int64 out: each row's tail
    depth_ptr,  # [1, n+1] int64 out
    size, n,
    W: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr, DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    r = tl.arange(0, BLOCK_R)  # tree rows
    in_rows = r <= n
    lane = tl.arange(0, BLOCK_W)
    in_w = lane < W
    cell = r[:, None] * W + lane[None, :]
    in_cell = in_rows[:, None] & in_w[None, :]
    # 1. every input read before the first store: the model's buffers are the outputs
    looked = tl.load(looked_ptr + cell, mask=in_cell, other=-1)
    looked_root = tl.load(looked_ptr + lane, mask=in_w, other=-1)
    m = tl.sum(tl.sum((looked >= 0).to(tl.int32), axis=1), axis=0)  # the lookup's nodes: each some row's child
    a = tl.sum((looked_root >= 0).to(tl.int32), axis=0)  # its children of the root
    # each model row's pool index (row 0's: junk, as the reference's; no row reads it)
    pool = tl.zeros([BLOCK_R], dtype=tl.int32)
    for i0 in range(0, size, BLOCK_N):
        i = i0 + tl.arange(0, BLOCK_N)
        row = tl.load(row_of_ptr + i, mask=i < size, other=-1)
        pool = tl.maximum(pool, tl.max(tl.where(row[None, :] == r[:, None], i[None, :], 0), axis=1))
    # its key as the model's selection ranks it: the chain first, with drawn children every
    # stepped node first (core/round/tree.py pick), then the cumulative log q
    first = tl.load(spine_ptr + pool, mask=in_rows, other=0) != 0
    if K > 1:
        draws = tl.load(draws_ptr + tl.zeros([BLOCK_R], tl.int32)) != 0
        first = first | (draws & (tl.load(pool_offset_ptr + pool, mask=in_rows, other=-1) >= 0))
    key = tl.where(first, float("inf"), tl.load(scores_ptr + pool, mask=in_rows, other=0.0))
    # eligible: its ancestor below the root is one of the root's first W - a children
    below = r
    for _ in range(K - 1):
        up = tl.load(parents_ptr + below, mask=in_rows, other=-1).to(tl.int32)
        below = tl.where(up > 0, up, below)
    root_kids = tl.load(children_ptr + lane, mask=in_w, other=-1)
    root_lane = tl.min(tl.where(root_kids[None, :] == below[:, None], lane[None, :], W), axis=1)
    eligible = in_rows & (r > 0) & (root_lane < W - a)
    # rank among the eligible: a higher key ahead, or the same key at a lower row (a stable
    # descending sort; inf and -inf tie among themselves like any key)
    ahead = (key[None, :] > key[:, None]) | ((key[None, :] == key[:, None]) & (r[None, :] < r[:, None]))
    rank = tl.sum((ahead & eligible[None, :]).to(tl.int32), axis=1)
    keep = eligible & (rank < n - m)  # the best n - m, in row order (parents first)
    count = tl.cumsum(keep.to(tl.int32), axis=0)
    mapped = tl.where(keep, m + count, -1)
    kept = tl.sum(keep.to(tl.int32), axis=0)
    # the model's rows, the lookup's, and the root's lanes past the lookup's (model lane l - a)
    model_ids = tl.load(ids_ptr + r, mask=in_rows, other=0)
    model_parents = tl.load(parents_ptr + r, mask=in_rows, other=-1)
    model_kids = tl.load(children_ptr + cell, mask=in_cell, other=-1)
    model_offset = tl.load(offset_ptr + r, mask=in_rows, other=-1)
    model_drawn = tl.load(drawn_ptr + cell, mask=in_cell, other=-1)
    shift = tl.maximum(lane - a, 0)
    shifted_kids = tl.load(children_ptr + shift, mask=in_w, other=-1)
    shifted_drawn = tl.load(drawn_ptr + shift, mask=in_w, other=-1)
    root_id = tl.load(ids_ptr)
    look_ids = _lookup_ids(r, root_id, look_ids_ptr)
    look_parents = tl.load(look_parents_ptr + r, mask=in_rows, other=0)
    look_kid_ids = tl.where(looked >= 0, _lookup_ids(tl.maximum(looked, 0), root_id, look_ids_ptr), -1)
    look_root_ids = tl.where(looked_root >= 0, _lookup_ids(tl.maximum(looked_root, 0), root_id, look_ids_ptr), -1)
    tl.store(mapped_ptr + r, mapped.to(tl.int64), mask=in_rows)
    tl.debug_barrier()
    # 2. the merged rows: the lookup's, with the kept model rows at m + 1 .. m + kept
    kid_rows = tl.where(model_kids >= 0, tl.load(mapped_ptr + model_kids, mask=in_cell & (model_kids >= 0), other=-1),
                        -1)
    up_rows = tl.where(model_parents > 0, tl.load(mapped_ptr + model_parents, mask=in_rows & (model_parents > 0),
                                                  other=-1), 0)
    shifted_rows = tl.where(shifted_kids >= 0, tl.load(mapped_ptr + shifted_kids, mask=in_w & (shifted_kids >= 0),
                                                       other=-1), -1)
    root = r[:, None] == 0
    children = tl.where(root, tl.where(lane < a, looked_root, shifted_rows)[None, :], looked)
    drawn = tl.where(root, tl.where(lane < a, look_root_ids, shifted_drawn)[None, :], look_kid_ids)
    base = in_rows & ((r <= m) | (r > m + kept))  # rows no model row goes to
    tl.store(ids_ptr + r, look_ids, mask=base)
    tl.store(parents_ptr + r, look_parents, mask=base)
    tl.store(offset_ptr + r, tl.full([BLOCK_R], -1, tl.int64), mask=base)
    tl.store(children_ptr + cell, children, mask=in_cell & base[:, None])
    tl.store(drawn_ptr + cell, drawn, mask=in_cell & base[:, None])
    dest = tl.maximum(mapped, 0)
    dest_cell = dest[:, None] * W + lane[None, :]
    tl.store(ids_ptr + dest, model_ids, mask=keep)
    tl.store(parents_ptr + dest, up_rows, mask=keep)
    tl.store(offset_ptr + dest, model_offset, mask=keep)
    tl.store(children_ptr + dest_cell, kid_rows, mask=keep[:, None] & in_w[None, :])
    tl.store(drawn_ptr + dest_cell, model_drawn, mask=keep[:, None] & in_w[None, :])
    tl.store(point_ptr + cell, (looked >= 0).to(tl.uint8), mask=in_cell)
    for i0 in range(0, size, BLOCK_N):  # pool index -> merged row (0: none)
        i = i0 + tl.arange(0, BLOCK_N)
        row = tl.load(row_of_ptr + i, mask=i < size, other=0)
        moved = tl.load(mapped_ptr + row, mask=(i < size) & (row > 0), other=0)
        tl.store(row_of_ptr + i, tl.where(row > 0, tl.maximum(moved, 0), 0), mask=i < size)
    tl.debug_barrier()
    # 3. the target's rows (core/step/rows.tree): each row's lineage up the merged parents (k
    # gathers), its depth, its path root-first (entries past the depth: itself)
    step = tl.arange(0, BLOCK_L)
    node = r
    lineage = tl.where(step[None, :] == 0, r[:, None], -1)  # [R, L]: self, parent, grandparent, ...
    for s in range(1, K + 1):
        up = tl.load(parents_ptr + node, mask=in_rows & (node >= 0), other=-1).to(tl.int32)
        node = tl.where(node >= 0, up, -1)
        lineage = tl.where(step[None, :] == s, node[:, None], lineage)
    depth = tl.sum((lineage >= 0).to(tl.int32), axis=1)
    path = tl.zeros([BLOCK_R, BLOCK_L], dtype=tl.int32) + r[:, None]
    for s in range(K + 1):  # the ancestor s levels up is the path's entry depth - 1 - s
        above = tl.sum(tl.where(step[None, :] == s, lineage, 0), axis=1)
        path = tl.where(step[None, :] == (depth - 1 - s)[:, None], above[:, None], path)
    start = tl.load(start_ptr)
    tl.store(path_ptr + r[:, None] * (K + 1) + step[None, :], start + path,
             mask=in_rows[:, None] & (step[None, :] < K + 1))
    tl.store(depth_ptr + r, depth.to(tl.int64), mask=in_rows)
    tl.store(positions_ptr + r, start + depth - 1, mask=in_rows)
    tl.store(slots_ptr + r, start + r, mask=in_rows)
