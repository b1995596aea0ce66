"""A token tree's walk: core/sampling/tree_walk.py's greedy_walk, sibling_walk and
recursive_walk (the references, and the glossary; the recursive walk with or without point-mass
lanes), with the same outputs out [B, k + 1], path [B, k], shown [B, k] and taken [B], bit for bit.

Why: the reference walks depth by depth in some ten tensor ops a depth, and the sampled walks add
V-long ops per sibling; captured, a k = 4, width 2 tree round spent 0.58 ms walking and committing
against 0.015 ms for a chain round's verify and commit (H100, bench pair).

Greedy: one program per tree walks from the root with its state in scalars: at each depth it reads
the node's w children and their tokens, moves to the one whose token is the target's and writes
out, path and shown at that depth.

Sampled walks: what the walk needs at a node does not depend on the walk's draws, only on how
many of the node's lanes it rejected, and a walk that reaches lane i has rejected every lane it
tried before it, one that stops at a node every lane it tried there. So all of it is computed for
every node before the walk, spread over the GPU as (tree row, vocabulary chunk) programs, and the
walk reads scalars:
- records (recursive): per lane, its test as the walk meets it (r(c) unnormalised, q_i(c), z),
  and kept and q at c for the next lane's; one launch a lane, since each lane's z is the sum its
  elder's rejection leaves, each chunk's share as `total`'s fixed-point integers, which add to
  the reference's bits in any order; the walk accepts the first lane whose test passes;
- sum(p) (sibling), as those integers, for the sibling tests the walk runs itself;
- races: per chunk, the best r / E (every lane tried rejected) and p / E with their first ids
  (ties: the first id, as torch.argmax), r replayed from p and q and the node's rejected drafts;
  the walk merges a node's chunks (the best score, then the smallest id holding it: the id one
  pass finds).
One program walking V itself made a pass per rejection: a k = 4, w = 4, 16-node walk took 73 µs
at 16,384 ids and 476 µs at 128,256, now 32 and 79; w = 2, 8 nodes 38 and 226, now 18 and 30
(H200, `bench_kernels.py walk`, draws rejected at the root; before and after in one call, at 32
chunks a node: 28 / 116 and 17 / 35). In a Llama 3.1 8B + EAGLE-3 head round at t 0.8 the walk
took 1.12 ms of a w = 4, 32-node round, its node launches now 0.10 ms (docs/benchmarks.md).

A lane's scalar is written out where it is read (tl.sum(tl.where(lane == j, vec, 0)), one value
and zeros: exact) rather than a helper: each device-function call costs the interpreter that runs
these kernels in CI Python time, and these run in loops over lanes.

Every float operation is the reference's, in its order: divisions by div_rn (Triton's `/` is
approximate on a GPU), and the launches keep multiplies and adds apart (no FMA: enable_fp_fusion
off).

Errors: as gpu/kernels/verify.py, a non-zero error flag (the warp kernel's) turns each tree's
out[b, 0] into its sentinel, which the backend's check() reads with the round.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.core.sampling.tree_walk import FIXED
from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous
from specgen.gpu.workspace import Workspace

GREEDY, SIBLING, RECURSIVE = 0, 1, 2
# chunks of V a node's sums and races take: at most this many a node, each a power of two of at
# least 1,024 ids (one block of a program), so a 17-row tree over 128,256 ids is 2,142 programs.
# A k = 4, w = 4, 16-node walk at 128,256 ids took 231 / 149 / 120 / 89 / 79 µs with at most
# 8 / 16 / 32 / 64 / 128 chunks, at 16,384 ids 31-36 µs from 16 on (H200, .device-style sweep of
# bench_kernels.py walk)
MAX_CHUNKS = 128
# a recursive walk's lane record, as a walk that meets the lane sees it: r(c) unnormalised, q_i(c),
# z and kept before the lane's test, and q without the drafts tried before it at c
FIELDS = 5
_FIELDS = tl.constexpr(FIELDS)
_MASS, _QC, _Z, _KEPT, _LEFT = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3), tl.constexpr(4)
_FIXED = tl.constexpr(FIXED)
_UNIT = tl.constexpr(1.0 / FIXED)


def greedy_walk(children: torch.Tensor, tokens: torch.Tensor, choice: torch.Tensor, limit: torch.Tensor, k: int,
                workspace: Workspace, dependent: bool = False) -> tuple:
    """choice [B, R] int64: the target's token at each row (its argmax, or the Gumbel race's)."""
    assert choice.shape == tokens.shape and choice.dtype == torch.int64
    return _walk(GREEDY, children, tokens, limit, k, workspace, dependent, choice=choice)


def sibling_walk(children: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor, uniforms: torch.Tensor,
                 expo: torch.Tensor, limit: torch.Tensor, k: int, workspace: Workspace,
                 dependent: bool = False) -> tuple:
    """probs [B, R, V], uniforms [B, k, w], expo [B, V] float32."""
    return _walk(SIBLING, children, tokens, limit, k, workspace, dependent, probs=probs, uniforms=uniforms,
                 expo=expo)


def recursive_walk(children: torch.Tensor, drawn: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor,
                   q: torch.Tensor, uniforms: torch.Tensor, expo: torch.Tensor, limit: torch.Tensor, k: int,
                   workspace: Workspace, dependent: bool = False, point: torch.Tensor | None = None) -> tuple:
    """drawn [B, R, w] int64 the drawn children's tokens, q [B, R, V] the draft's q, point [B, R, w]
    bool the point-mass lanes (None: none); as sibling_walk."""
    assert drawn.shape == children.shape and drawn.dtype == torch.int64 and q.shape == probs.shape
    assert point is None or (point.shape == children.shape and point.dtype == torch.bool)
    return _walk(RECURSIVE, children, tokens, limit, k, workspace, dependent, probs=probs, uniforms=uniforms,
                 expo=expo, drawn=drawn, q=q, point=point)


def chunk_block(vocab: int) -> int:
    """Ids a chunk of a node's sums and races holds: V in at most MAX_CHUNKS chunks of at least
    1,024 ids (fewer for a smaller V), a power of two."""
    widest = max(1024, triton.next_power_of_2(triton.cdiv(vocab, MAX_CHUNKS)))
    return max(16, min(triton.next_power_of_2(vocab), widest))


def _walk(mode: int, children, tokens, limit, k, workspace, dependent, choice=None, probs=None, uniforms=None,
          expo=None, drawn=None, q=None, point=None):
    batch, rows, width = children.shape
    device = tokens.device
    assert children.dtype == tokens.dtype == torch.int64 and tokens.shape == (batch, rows)
    assert limit.dtype == torch.int32 and limit.numel() in (1, batch) and k >= 1
    assert workspace.device == device, f"workspace on {workspace.device}, tensors on {device}"
    vocab, block, chunks = 1, 16, 1
    if mode != GREEDY:
        vocab = probs.shape[-1]
        assert probs.shape == (batch, rows, vocab) and probs.dtype == torch.float32
        assert uniforms.shape == (batch, k, width) and uniforms.dtype == torch.float32
        assert expo.shape == (batch, vocab) and expo.dtype == torch.float32
        block = chunk_block(vocab)
        chunks = triton.cdiv(vocab, block)
    # contiguous() is the tensor itself in a round (no copy inside a capture); tests pass expanded ones
    children, tokens = children.contiguous(), tokens.contiguous()
    dense = [t.contiguous() if t is not None else tokens for t in (choice, probs, q, drawn, point, uniforms, expo)]
    choice, probs, q, drawn, point_, uniforms, expo = dense
    out = torch.empty(batch, k + 1, dtype=torch.int64, device=device)
    path = torch.empty(batch, k, dtype=torch.int64, device=device)
    shown = torch.empty(batch, k, dtype=torch.int64, device=device)
    taken = torch.empty(batch, dtype=torch.int64, device=device)
    # per node, the workspace's scratch (read within this call only): sums [.., lane, chunk] int64;
    # the recursive walk's lane records [.., field, lane] float32; the races' best scores
    # [.., r / p, chunk] float32 and ids [.., r / p / r seen, chunk] int64
    sums, records, best, at = tokens, probs, probs, tokens  # greedy: unread
    shape = dict(POINT=point is not None, W=width, WB=max(2, triton.next_power_of_2(width)),
                 CB=triton.next_power_of_2(chunks), DEPENDENT=dependent)
    if mode != GREEDY:
        lanes = width - 1 if mode == RECURSIVE else 1  # z after each lane but the last; or sum(p)
        nodes = batch * rows
        sums = workspace.scratch("walk_sums", nodes * max(1, lanes) * chunks, torch.int64)
        best = workspace.scratch("walk_best", nodes * 2 * chunks)
        at = workspace.scratch("walk_at", nodes * 3 * chunks, torch.int64)
        if mode == RECURSIVE:
            records = workspace.scratch("walk_records", nodes * FIELDS * width)
        grid = (nodes, chunks)
        node = (children, tokens, probs, q, drawn, point_, expo, sums, records, best, at, rows, vocab, chunks)
        options = dict(MODE=mode, BLOCK_V=block, num_warps=4 if block <= 2048 else 8, **shape)
        # the recursive walk's lanes in order, a launch each: a lane's record and the sum its
        # rejection leaves, which the next lane's test divides by; the last lane's with the races
        for lane in range(width - 1 if mode == RECURSIVE else 0):
            _node_kernel[grid](*node, LANE=lane, RACE=False, **options, **launch_options(dependent, fp_fusion=False))
        _node_kernel[grid](*node, LANE=width - 1, RACE=True, **options, **launch_options(dependent, fp_fusion=False))
    _walk_kernel[(batch,)](
        out, path, shown, taken, children, tokens, limit, choice, probs, drawn, uniforms, sums, records, best, at,
        workspace.error, rows, k, vocab, chunks, 0 if limit.numel() == 1 else 1, MODE=mode, num_warps=1, **shape,
        **launch_options(dependent, fp_fusion=False),
    )
    return out, path, shown, taken


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["rows", "k", "vocab", "chunks", "limit_stride"])
def _walk_kernel(
    out_ptr,  # [B, k + 1] int64
    path_ptr,  # [B, k] int64
    shown_ptr,  # [B, k] int64
    taken_ptr,  # [B] int64
    children_ptr,  # [B, R, W] int64
    tokens_ptr,  # [B, R] int64
    limit_ptr,  # [1] or [B] int32
    choice_ptr,  # [B, R] int64 (GREEDY)
    probs_ptr,  # [B, R, V] float32 (SIBLING)
    drawn_ptr,  # [B, R, W] int64 (RECURSIVE)
    uniform_ptr,  # [B, k, W] float32 (sampled)
    sums_ptr,  # [B, R, 1, C] int64 (SIBLING): sum(p) by chunk
    records_ptr,  # [B, R, FIELDS, W] float32 (RECURSIVE): the lanes' records
    best_ptr,  # [B, R, 2, C] float32 (sampled): the races' best scores, by chunk
    at_ptr,  # [B, R, 3, C] int64 (sampled): their ids, and whether r > 0 in the chunk
    error_ptr,  # [1] int32
    rows,
    k,
    vocab,
    chunks,
    limit_stride,  # 0: one limit for every tree
    MODE: tl.constexpr,
    POINT: tl.constexpr,  # unread here: the records hold the point-mass lanes' tests
    W: tl.constexpr,
    WB: tl.constexpr,  # W rounded up to a power of two
    CB: tl.constexpr,  # chunks rounded up to a power of two
    DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    b = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, WB)
    limit = tl.load(limit_ptr + b * limit_stride)
    first_row = b * rows
    node = b * 0  # tree row of the walk's node
    follow = b * 0  # the row whose token `shown` repeats
    alive = b >= 0
    taken = b < 0  # the last token a child accepted outside the tree
    for depth in range(k):
        kids = tl.load(children_ptr + (first_row + node) * W + lane, mask=lane < W, other=-1)
        kid_tokens = tl.load(tokens_ptr + first_row + tl.maximum(kids, 0), mask=lane < W, other=0)
        allowed = alive & (limit > depth)
        row = first_row + node
        if MODE == 0:
            x = tl.load(choice_ptr + row)
            match = (kids >= 0) & (kid_tokens == x) & (lane < W)
            index = tl.min(tl.where(match, lane, WB), axis=0)
            hit = allowed & (index < W)
            index = tl.where(index < W, index, 0)
            token = x
            accepted = hit
        else:
            if MODE == 1:
                hit, index, token = _sibling_pick(probs_ptr + row * vocab, sums_ptr + row * chunks,
                                                  uniform_ptr + (b * k + depth) * W, kids, kid_tokens, allowed,
                                                  lane, chunks, W, CB)
                accepted = hit
            else:
                # lane i's record holds its test as the walk meets it (every lane tried before it
                # rejected), so the lane accepted is the first whose test passes
                draws = tl.load(drawn_ptr + row * W + lane, mask=lane < W, other=-1)
                record = records_ptr + row * _FIELDS * W + lane
                drawn = draws >= 0  # a leaf's records are never written
                mass = tl.load(record + _MASS * W, mask=drawn, other=0.0)
                qc = tl.load(record + _QC * W, mask=drawn, other=0.0)
                z = tl.load(record + _Z * W, mask=drawn, other=0.0)
                u = tl.load(uniform_ptr + (b * k + depth) * W + lane, mask=lane < W, other=1.0)
                passes = drawn & (qc > 0) & (mass > 0) & (u * qc * z <= mass)
                index = tl.min(tl.where(passes, lane, WB), axis=0)
                accepted = allowed & (index < W)
                index = tl.where(index < W, index, 0)
                hit = accepted & (tl.sum(tl.where(lane == index, kids, 0), axis=0) >= 0)
                token = tl.sum(tl.where(lane == index, draws, 0), axis=0)
            if alive & ~accepted:  # every lane tried was rejected (or none was allowed): the race
                token = _race(best_ptr + row * 2 * chunks, at_ptr + row * 3 * chunks, allowed, chunks, CB)
        taken = taken | (accepted & ~hit)
        nxt = tl.sum(tl.where(lane == index, kids, 0), axis=0)
        tl.store(out_ptr + b * (k + 1) + depth, tl.where(alive, token, -1))
        tl.store(path_ptr + b * k + depth, tl.where(hit, nxt, 0))
        below = tl.where(hit, nxt, tl.load(children_ptr + (first_row + follow) * W))  # stopped: the draft's best
        follow = tl.where(below >= 0, below, follow)  # a branch that ends repeats its last token
        tl.store(shown_ptr + b * k + depth, tl.load(tokens_ptr + first_row + follow))
        alive = hit
        node = tl.where(hit, nxt, node)
    if MODE == 0:
        bonus = tl.load(choice_ptr + first_row + node)
    else:  # p's race at the last node
        bonus = _race(best_ptr + (first_row + node) * 2 * chunks, at_ptr + (first_row + node) * 3 * chunks,
                      b < 0, chunks, CB)
    tl.store(out_ptr + b * (k + 1) + k, tl.where(alive, bonus, -1))
    tl.store(taken_ptr + b, taken.to(tl.int64))
    tl.debug_barrier()  # the sentinel overwrites out[b, 0], which another thread may have written
    error = tl.load(error_ptr)
    if error != 0:
        tl.store(out_ptr + b * (k + 1), tl.where((error & 1) != 0, -2, -3).to(tl.int64))  # verify.py's sentinels


@triton.jit(do_not_specialize=["rows", "vocab", "chunks"])
def _node_kernel(
    children_ptr,  # [B, R, W] int64
    tokens_ptr,  # [B, R] int64
    probs_ptr,  # [B, R, V] float32
    q_ptr,  # [B, R, V] float32 (RECURSIVE)
    drawn_ptr,  # [B, R, W] int64 (RECURSIVE)
    point_ptr,  # [B, R, W] bool (RECURSIVE with POINT)
    expo_ptr,  # [B, V] float32 (RACE)
    sums_ptr,  # [B, R, max(1, W - 1), C] int64
    records_ptr,  # [B, R, FIELDS, W] float32 (RECURSIVE)
    best_ptr,  # [B, R, 2, C] float32 (RACE)
    at_ptr,  # [B, R, 3, C] int64 (RACE)
    rows,
    vocab,
    chunks,
    MODE: tl.constexpr,
    LANE: tl.constexpr,  # RECURSIVE: the lane whose record this launch writes
    RACE: tl.constexpr,  # the races (and the sibling walk's sum); else lane LANE's sum
    POINT: tl.constexpr,
    W: tl.constexpr,
    WB: tl.constexpr,
    CB: tl.constexpr,
    BLOCK_V: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """One node's one chunk of V (program (tree row, chunk)), as a walk that stops at the node sees
    it (every lane it tries there rejected).
    - RECURSIVE, lane LANE: the lane's record (written by chunk 0; every chunk computes it), and
      unless RACE, z after its rejection: this chunk's part of sum(max(0, r − q_i)) as `total`'s
      integers (nothing where the lane is not tried or no drawn lane follows: no z is read there).
    - RACE: the recovered token's race after every lane tried is rejected (r) and p's (a bonus, a
      walk allowed no draft, or r all zero): the chunk's best score, its first id, and whether
      r > 0 in it; SIBLING: also sum(p)'s part."""
    wait_previous(DEPENDENT)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    b = row // rows
    lane = tl.arange(0, WB)
    p_row = probs_ptr + row * vocab
    cols = chunk * BLOCK_V + tl.arange(0, BLOCK_V)
    inside = cols < vocab
    p = tl.load(p_row + cols, mask=inside, other=0.0)
    r = p
    if MODE == 2:
        draws = tl.load(drawn_ptr + row * W + lane, mask=lane < W, other=-1)
        # a node with no draws (a leaf) has no lanes to test: its races are p's, and the walk
        # reads no record there
        if tl.max((draws >= 0).to(tl.int32), axis=0) > 0:
            q_row = q_ptr + row * vocab
            node_sums = sums_ptr + row * (W - 1) * chunks
            tokens, points = _drafts(drawn_ptr + row * W, point_ptr + row * W, lane, POINT, W)
            rejected, zs, kepts, summing = _lane_record(p_row, q_row, records_ptr + row * _FIELDS * W, node_sums,
                                                        draws, tokens, points, lane, chunks, chunk == 0, LANE, POINT,
                                                        W, CB)
            if RACE:  # r after every lane tried
                r, _ = _replay(p, tl.load(q_row + cols, mask=inside, other=0.0), cols, tokens, rejected, points, zs,
                               kepts, lane, POINT, W)
            elif summing:  # r <- max(0, r - q_i), z its sum
                r, _ = _replay(p, tl.load(q_row + cols, mask=inside, other=0.0), cols, tokens, rejected, points, zs,
                               kepts, lane, POINT, W)
                tl.store(node_sums + LANE * chunks + chunk, tl.sum((r * _FIXED).to(tl.int64), axis=0))
    if RACE:
        if MODE == 1:  # sibling_walk: r is p less every child (each was tried and rejected)
            kids = tl.load(children_ptr + row * W + lane, mask=lane < W, other=-1)
            kid_tokens = tl.load(tokens_ptr + b * rows + tl.maximum(kids, 0), mask=lane < W, other=0)
            for j in tl.static_range(W):
                kid = tl.sum(tl.where(lane == j, kids, 0), axis=0)
                r = tl.where((kid >= 0) & (cols == tl.sum(tl.where(lane == j, kid_tokens, 0), axis=0)), 0.0, r)
            tl.store(sums_ptr + row * chunks + chunk, tl.sum((p * _FIXED).to(tl.int64), axis=0))
        expo = tl.load(expo_ptr + b * vocab + cols, mask=inside, other=1.0)
        top_r, col_r = _best(tl.math.div_rn(r, expo), cols, inside)
        top_p, col_p = _best(tl.math.div_rn(p, expo), cols, inside)
        node_best, node_at = best_ptr + row * 2 * chunks + chunk, at_ptr + row * 3 * chunks + chunk
        tl.store(node_best, top_r)
        tl.store(node_best + chunks, top_p)
        tl.store(node_at, col_r)
        tl.store(node_at + chunks, col_p)
        tl.store(node_at + 2 * chunks, tl.max((inside & (r > 0)).to(tl.int64), axis=0))
    release_next(DEPENDENT)


@triton.jit
def _sibling_pick(p_row, node_sums, uniform_row, kids, kid_tokens, allowed, lane, chunks, W: tl.constexpr,
                  CB: tl.constexpr):
    """sibling_walk's tests at one node: sum(r) is the integer sum of p (node_sums' chunks) less
    the rejected siblings' masses (what the reference's total(left) adds). The token where every
    sibling is rejected is the caller's race."""
    c = tl.arange(0, CB)
    whole = tl.sum(tl.load(node_sums + c, mask=c < chunks, other=0), axis=0)
    hit = tl.max((lane < 0).to(tl.int32), axis=0) > 0  # False
    index = tl.sum(lane * 0, axis=0)
    removed = whole * 0
    rejected = lane < 0
    for i in tl.static_range(W):
        kid = tl.sum(tl.where(lane == i, kids, 0), axis=0)
        token = tl.sum(tl.where(lane == i, kid_tokens, 0), axis=0)
        valid = allowed & (kid >= 0) & ~hit
        zeroed = tl.max((rejected & (kid_tokens == token)).to(tl.int32), axis=0) > 0  # r(c) = 0 already
        mass = tl.where(zeroed, 0.0, tl.load(p_row + token))
        z = (whole - removed).to(tl.float32) * _UNIT
        accept = valid & (tl.load(uniform_row + i) * z <= mass) & (mass > 0)
        index = tl.where(accept, i, index)
        hit = hit | accept
        out = valid & ~accept
        removed += tl.where(out, (mass * _FIXED).to(tl.int64), 0)
        rejected = rejected | ((lane == i) & out)
    return hit, index, tl.sum(tl.where(lane == index, kid_tokens, 0), axis=0)


@triton.jit
def _drafts(drawn_row, point_row, lane, POINT: tl.constexpr, W: tl.constexpr):
    """A node's drawn tokens (0 where none) and its point-mass lanes, [WB] each."""
    tokens = tl.maximum(tl.load(drawn_row + lane, mask=lane < W, other=-1), 0)
    if POINT:
        points = tl.load(point_row + lane, mask=lane < W, other=0).to(tl.int32) != 0
    else:
        points = lane < 0
    return tokens, points


@triton.jit
def _lane_record(p_row, q_row, record, node_sums, draws, tokens, points, lane, chunks, write, LANE: tl.constexpr,
                 POINT: tl.constexpr, W: tl.constexpr, CB: tl.constexpr):
    """recursive_walk's test of lane LANE at one node (tree_walk._Residual) as the walk meets it,
    every lane tried before it rejected: from the earlier lanes' records (z and kept before each,
    its q_i(c), q without the drafts tried at c) and the sum after lane LANE − 1, the lane's own
    (mass = r(c) unnormalised, its q_i(c), z, kept, left), stored where `write`. r and q are
    replayed at c from p and q. A point-mass lane (POINT) has q_i(c) = 1, and its rejection zeroes
    r(c) and leaves q and kept. Returns the lanes rejected up to LANE with their (z, kept) [WB]
    each, as _replay takes them, and whether a pass must sum what lane LANE's rejection leaves
    (it is tried and a drawn lane follows it)."""
    before = lane < LANE
    zs = tl.load(record + _Z * W + lane, mask=before, other=0.0)
    kepts = tl.load(record + _KEPT * W + lane, mask=before, other=0.0)
    qcs = tl.load(record + _QC * W + lane, mask=before, other=0.0)
    rejected = before & (draws >= 0) & (qcs > 0)  # tried, so rejected on the way to LANE
    z = tl.sum(tl.where(lane == 0, 1.0, 0.0), axis=0)  # 1.0, a float32 scalar
    kept = z
    if LANE > 0:  # z and kept after lane LANE - 1
        last = lane == LANE - 1
        z = tl.sum(tl.where(last, zs, 0.0), axis=0)
        kept = tl.sum(tl.where(last, kepts, 0.0), axis=0)
        if tl.sum(tl.where(last, rejected.to(tl.int32), 0), axis=0) > 0:
            if tl.max(((lane >= LANE) & (lane < W) & (draws >= 0)).to(tl.int32), axis=0) > 0:  # a drawn lane follows
                c = tl.arange(0, CB)
                z = tl.sum(tl.load(node_sums + (LANE - 1) * chunks + c, mask=c < chunks, other=0),
                           axis=0).to(tl.float32) * _UNIT
            left = tl.load(record + _LEFT * W + LANE - 1)
            if POINT:
                kept = tl.where(tl.sum(tl.where(last, points.to(tl.int32), 0), axis=0) > 0, kept, kept - left)
            else:
                kept = kept - left
    draw = tl.sum(tl.where(lane == LANE, draws, 0), axis=0)
    token = tl.maximum(draw, 0)
    mass, left = _replay(tl.load(p_row + token), tl.load(q_row + token), token, tokens, rejected, points, zs, kepts,
                         lane, POINT, W)
    qc = tl.math.div_rn(left, tl.maximum(kept, 1e-30))
    if POINT:
        qc = tl.where(tl.sum(tl.where(lane == LANE, points.to(tl.int32), 0), axis=0) > 0, 1.0, qc)
    if write:
        tl.store(record + _MASS * W + LANE, mass)
        tl.store(record + _QC * W + LANE, qc)
        tl.store(record + _Z * W + LANE, z)
        tl.store(record + _KEPT * W + LANE, kept)
        tl.store(record + _LEFT * W + LANE, left)
    tried = (draw >= 0) & (qc > 0)
    rejected = rejected | ((lane == LANE) & tried)
    zs = tl.where(lane == LANE, z, zs)
    kepts = tl.where(lane == LANE, kept, kepts)
    later = tl.max(((lane > LANE) & (lane < W) & (draws >= 0)).to(tl.int32), axis=0) > 0
    return rejected, zs, kepts, tried & later


@triton.jit
def _replay(mass, left, cols, tokens, rejected, points, zs, kepts, lane, POINT: tl.constexpr, W: tl.constexpr):
    """r (mass) and q without the tried drafts (left) at cols, from p and q, after the node's
    rejections so far: _Residual.reject's arithmetic in its order, one rejection at a time (a
    point mass's: r(c) = 0, q as it was)."""
    for j in tl.static_range(W):
        pick = lane == j  # lane j's scalars: a sum of one value and zeros (exact)
        # a branch on the program's scalar, not a select: the division over the columns runs for
        # the rejected lanes only
        if tl.sum(tl.where(pick, rejected.to(tl.int32), 0), axis=0) > 0:
            at = cols == tl.sum(tl.where(pick, tokens, 0), axis=0)
            q_j = tl.math.div_rn(left, tl.maximum(tl.sum(tl.where(pick, kepts, 0.0), axis=0), 1e-30))
            kept_mass = tl.maximum(mass - tl.sum(tl.where(pick, zs, 0.0), axis=0) * q_j, 0.0)
            if POINT:
                pointed = tl.sum(tl.where(pick, points.to(tl.int32), 0), axis=0) > 0
                mass = tl.where(pointed, tl.where(at, 0.0, mass), kept_mass)
                left = tl.where(~pointed & at, 0.0, left)
            else:
                mass = kept_mass
                left = tl.where(at, 0.0, left)
    return mass, left


@triton.jit
def _best(score, cols, inside):
    """A chunk's best score and its first id (ties: the first, as torch.argmax)."""
    score = tl.where(inside, score, -1.0)
    top = tl.max(score, axis=0)
    return top, tl.min(tl.where(score == top, cols, 2**30), axis=0).to(tl.int64)


@triton.jit
def _race(node_best, node_at, use_r, chunks, CB: tl.constexpr):
    """A node's race from its chunks: r's where use_r (the walk rejected every lane it tried there)
    and r > 0 somewhere, else p's; the best score, then the smallest id holding it, which is the id
    one pass over V in any blocks finds."""
    c = tl.arange(0, CB)
    inside = c < chunks
    seen = tl.max(tl.load(node_at + 2 * chunks + c, mask=inside, other=0), axis=0) > 0
    which = tl.where(use_r & seen, 0, 1)
    score = tl.load(node_best + which * chunks + c, mask=inside, other=-2.0)
    ids = tl.load(node_at + which * chunks + c, mask=inside, other=2**30)
    top = tl.max(score, axis=0)
    return tl.min(tl.where(score == top, ids, 2**30), axis=0)
