"""A token tree's walk in one launch: core/sampling/tree_walk.py's greedy_walk, sibling_walk and
recursive_walk (the references, and the glossary; the recursive walk with or without point-mass
lanes), with the same outputs out [B, k + 1], path
[B, k], shown [B, k] and taken [B], bit for bit.

Why: the reference walks depth by depth in some ten tensor ops a depth, and the sampled walks add
V-long ops per sibling; captured, a k = 4, width 2 tree round spent 0.58 ms walking and committing
against 0.015 ms for a chain round's verify and commit (H100, bench pair).

One program per tree walks from the root with its state in scalars: at each depth it reads the
node's w children and their tokens, picks a child (greedy: the one whose token is the target's;
sampled: the siblings' rejection tests) and writes out, path and shown at that depth. Nothing
V-long is stored: a sum over V (the normaliser after a rejection) is a blocked pass of `total`'s
fixed-point integers, which add to the reference's bits in any order, and the recovered or bonus
token is the race argmax r / E over V in blocks (ties: the first id, as torch.argmax), r replayed
per block from p (and q) and the node's rejected drafts. Every float operation is the reference's,
in its order: divisions by div_rn (Triton's `/` is approximate on a GPU), and the launch keeps
multiplies and adds apart (no FMA: enable_fp_fusion off).

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
# vocabulary columns a pass reads at once, 16 a thread over 8 warps: one program walks a tree,
# so a pass over V is latency-bound and wants many loads in flight
MAX_BLOCK_V = 4096
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


def _walk(mode: int, children, tokens, limit, k, workspace, dependent, choice=None, probs=None, uniforms=None,
          expo=None, drawn=None, q=None, point=None):
    batch, rows, width = children.shape
    device = tokens.device
    assert children.dtype == tokens.dtype == torch.int64 and tokens.shape == (batch, rows)
    assert limit.dtype == torch.int32 and limit.numel() in (1, batch) and k >= 1
    assert workspace.device == device, f"workspace on {workspace.device}, tensors on {device}"
    vocab = 1
    if mode != GREEDY:
        vocab = probs.shape[-1]
        assert probs.shape == (batch, rows, vocab) and probs.dtype == torch.float32
        assert uniforms.shape == (batch, k, width) and uniforms.dtype == torch.float32
        assert expo.shape == (batch, vocab) and expo.dtype == torch.float32
    # contiguous() is the tensor itself in a round (no copy inside a capture); tests pass expanded ones
    dense = [t.contiguous() if t is not None else tokens for t in (choice, probs, q, drawn, point, uniforms, expo)]
    out = torch.empty(batch, k + 1, dtype=torch.int64, device=device)
    path = torch.empty(batch, k, dtype=torch.int64, device=device)
    shown = torch.empty(batch, k, dtype=torch.int64, device=device)
    taken = torch.empty(batch, dtype=torch.int64, device=device)
    _walk_kernel[(batch,)](
        out, path, shown, taken, children.contiguous(), tokens.contiguous(), limit, *dense, workspace.error,
        rows, k, vocab, 0 if limit.numel() == 1 else 1,
        MODE=mode, POINT=point is not None, W=width, WB=max(2, triton.next_power_of_2(width)),
        BLOCK_V=min(MAX_BLOCK_V, max(16, triton.next_power_of_2(vocab))), DEPENDENT=dependent,
        num_warps=1 if mode == GREEDY else 8, **launch_options(dependent, fp_fusion=False),
    )
    return out, path, shown, taken


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["rows", "k", "vocab", "limit_stride"])
def _walk_kernel(
    out_ptr,  # [B, k + 1] int64
    path_ptr,  # [B, k] int64
    shown_ptr,  # [B, k] int64
    taken_ptr,  # [B] int64
    children_ptr,  # [B, R, W] int64
    tokens_ptr,  # [B, R] int64
    limit_ptr,  # [1] or [B] int32
    choice_ptr,  # [B, R] int64 (GREEDY)
    probs_ptr,  # [B, R, V] float32 (sampled)
    q_ptr,  # [B, R, V] float32 (RECURSIVE)
    drawn_ptr,  # [B, R, W] int64 (RECURSIVE)
    point_ptr,  # [B, R, W] bool (RECURSIVE with POINT)
    uniform_ptr,  # [B, k, W] float32 (sampled)
    expo_ptr,  # [B, V] float32 (sampled)
    error_ptr,  # [1] int32
    rows,
    k,
    vocab,
    limit_stride,  # 0: one limit for every tree
    MODE: tl.constexpr,
    POINT: tl.constexpr,  # point-mass lanes (point_ptr); else none
    W: tl.constexpr,
    WB: tl.constexpr,  # W rounded up to a power of two
    BLOCK_V: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    b = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, WB)
    limit = tl.load(limit_ptr + b * limit_stride)
    first_row = b * rows
    expo_row = expo_ptr + b * vocab
    node = b * 0  # tree row of the walk's node
    follow = b * 0  # the row whose token `shown` repeats
    alive = b >= 0
    taken = b < 0  # the last token a child accepted outside the tree
    for depth in range(k):
        kids = tl.load(children_ptr + (first_row + node) * W + lane, mask=lane < W, other=-1)
        kid_tokens = tl.load(tokens_ptr + first_row + tl.maximum(kids, 0), mask=lane < W, other=0)
        allowed = alive & (limit > depth)
        if MODE == 0:
            x = tl.load(choice_ptr + first_row + node)
            match = (kids >= 0) & (kid_tokens == x) & (lane < W)
            index = tl.min(tl.where(match, lane, WB), axis=0)
            hit = allowed & (index < W)
            index = tl.where(index < W, index, 0)
            token = x
            accepted = hit
        elif MODE == 1:
            hit, index, token = _sibling_pick(probs_ptr + (first_row + node) * vocab, expo_row,
                                              uniform_ptr + (b * k + depth) * W, kids, kid_tokens, alive, allowed,
                                              lane, vocab, W, BLOCK_V)
            accepted = hit
        else:
            hit, accepted, index, token = _recursive_pick(probs_ptr + (first_row + node) * vocab,
                                                q_ptr + (first_row + node) * vocab, expo_row,
                                                drawn_ptr + (first_row + node) * W, point_ptr + (first_row + node) * W,
                                                uniform_ptr + (b * k + depth) * W, kids, alive, allowed, lane, vocab,
                                                POINT, W, BLOCK_V)
        taken = taken | (accepted & ~hit)
        nxt = _lane(kids, index, lane)
        tl.store(out_ptr + b * (k + 1) + depth, tl.where(alive, token, -1))
        tl.store(path_ptr + b * k + depth, tl.where(hit, nxt, 0))
        below = tl.where(hit, nxt, tl.load(children_ptr + (first_row + follow) * W))  # stopped: the draft's best
        follow = tl.where(below >= 0, below, follow)  # a branch that ends repeats its last token
        tl.store(shown_ptr + b * k + depth, tl.load(tokens_ptr + first_row + follow))
        alive = hit
        node = tl.where(hit, nxt, node)
    if MODE == 0:
        bonus = tl.load(choice_ptr + first_row + node)
    else:
        bonus = b * 0
        if alive:
            none = lane < 0  # no draft rejected: the race over p
            bonus = _race(probs_ptr + (first_row + node) * vocab, q_ptr + (first_row + node) * vocab, expo_row,
                          lane * 0, none, none, tl.zeros([WB], tl.float32), tl.zeros([WB], tl.float32), lane, vocab,
                          MODE, False, W, BLOCK_V)
    tl.store(out_ptr + b * (k + 1) + k, tl.where(alive, bonus, -1))
    tl.store(taken_ptr + b, taken.to(tl.int64))
    tl.debug_barrier()  # the sentinel overwrites out[b, 0], which another thread may have written
    error = tl.load(error_ptr)
    if error != 0:
        tl.store(out_ptr + b * (k + 1), tl.where((error & 1) != 0, -2, -3).to(tl.int64))  # verify.py's sentinels


@triton.jit
def _lane(vec, j, lane):
    """vec [WB] at lane j (a sum of one value and zeros: exact)."""
    return tl.sum(tl.where(lane == j, vec, 0), axis=0)


@triton.jit
def _fixed(x):
    """`total`'s integers: x >= 0 truncated to a multiple of 2^-60 (x * 2^60 is exact in float32)."""
    return (x * _FIXED).to(tl.int64)


@triton.jit
def _sibling_pick(p_row, expo_row, uniform_row, kids, kid_tokens, alive, allowed, lane, vocab, W: tl.constexpr,
                  BLOCK_V: tl.constexpr):
    """sibling_walk's pick at one node: sum(r) is the integer sum of p less the rejected siblings'
    masses (what the reference's total(left) adds)."""
    whole = tl.sum(lane * 0, axis=0).to(tl.int64)
    if allowed & (tl.max(((kids >= 0) & (lane < W)).to(tl.int32), axis=0) > 0):
        for start in range(0, vocab, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            whole += tl.sum(_fixed(tl.load(p_row + cols, mask=cols < vocab, other=0.0)), axis=0)
    hit = tl.max((lane < 0).to(tl.int32), axis=0) > 0  # False
    index = tl.sum(lane * 0, axis=0)
    removed = whole * 0
    rejected = lane < 0
    for i in tl.static_range(W):
        kid = _lane(kids, i, lane)
        token = _lane(kid_tokens, i, lane)
        valid = allowed & (kid >= 0) & ~hit
        zeroed = tl.max((rejected & (kid_tokens == token)).to(tl.int32), axis=0) > 0  # r(c) = 0 already
        mass = tl.where(zeroed, 0.0, tl.load(p_row + token))
        z = (whole - removed).to(tl.float32) * _UNIT
        accept = valid & (tl.load(uniform_row + i) * z <= mass) & (mass > 0)
        index = tl.where(accept, i, index)
        hit = hit | accept
        out = valid & ~accept
        removed += tl.where(out, _fixed(mass), 0)
        rejected = rejected | ((lane == i) & out)
    token = _lane(kid_tokens, index, lane)
    if alive & ~hit:
        unused = lane.to(tl.float32) * 0.0
        token = _race(p_row, p_row, expo_row, kid_tokens, rejected, rejected, unused, unused, lane, vocab, 1, False,
                      W, BLOCK_V)
    return hit, index, token


@triton.jit
def _recursive_pick(p_row, q_row, expo_row, drawn_row, point_row, uniform_row, kids, alive, allowed, lane, vocab,
                    POINT: tl.constexpr, W: tl.constexpr, BLOCK_V: tl.constexpr):
    """recursive_walk's pick at one node (tree_walk._Residual): each rejection's (z, kept) kept per
    lane, r and q_i replayed from p and q wherever they are read; a point-mass lane (POINT) has
    q_i(c) = 1, and its rejection zeroes r(c) and leaves q and kept."""
    draws = tl.load(drawn_row + lane, mask=lane < W, other=-1)
    if POINT:
        points = tl.load(point_row + lane, mask=lane < W, other=0).to(tl.int32) != 0
    else:
        points = lane < 0
    tokens = tl.maximum(draws, 0)
    z = tl.sum(tl.where(lane == 0, 1.0, 0.0), axis=0)  # 1.0, a float32 scalar
    kept = z
    accepted = tl.max((lane < 0).to(tl.int32), axis=0) > 0
    index = tl.sum(lane * 0, axis=0)
    rejected = lane < 0
    zs = tl.zeros_like(lane).to(tl.float32)
    kepts = tl.zeros_like(lane).to(tl.float32)
    for i in tl.static_range(W):
        draw = _lane(draws, i, lane)
        token = tl.maximum(draw, 0)
        valid = allowed & ~accepted & (draw >= 0)
        mass, left = _replay(tl.load(p_row + token), tl.load(q_row + token), token, tokens, rejected, points, zs,
                             kepts, lane, POINT, W)
        qc = tl.math.div_rn(left, tl.maximum(kept, 1e-30))
        pointed = (_lane(points.to(tl.int32), i, lane) > 0) if POINT else (lane < 0)
        if POINT:
            qc = tl.where(pointed, 1.0, qc)
        tried = valid & (qc > 0)
        accept = tried & (mass > 0) & (tl.load(uniform_row + i) * qc * z <= mass)
        index = tl.where(accept, i, index)
        accepted = accepted | accept
        out = tried & ~accept
        rejected = rejected | ((lane == i) & out)
        zs = tl.where(lane == i, z, zs)
        kepts = tl.where(lane == i, kept, kepts)
        # z is read by later lanes' tests and rejections only (the race takes r unnormalised): after
        # the node's last drawn lane its pass over V would be wasted
        later = tl.max(((lane > i) & (lane < W) & (draws >= 0)).to(tl.int32), axis=0) > 0
        if out & later:  # r <- max(0, r - q_i), z its sum
            whole = tl.sum(lane * 0, axis=0).to(tl.int64)
            for start in range(0, vocab, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                inside = cols < vocab
                r, _ = _replay(tl.load(p_row + cols, mask=inside, other=0.0), tl.load(q_row + cols, mask=inside,
                               other=0.0), cols, tokens, rejected, points, zs, kepts, lane, POINT, W)
                whole += tl.sum(_fixed(r), axis=0)
            z = whole.to(tl.float32) * _UNIT
        if out:  # c_i leaves q
            if POINT:
                kept = tl.where(pointed, kept, kept - left)
            else:
                kept = kept - left
    hit = accepted & (_lane(kids, index, lane) >= 0)
    token = _lane(draws, index, lane)
    if alive & ~accepted:
        token = _race(p_row, q_row, expo_row, tokens, rejected, points, zs, kepts, lane, vocab, 2, POINT, W,
                      BLOCK_V)
    return hit, accepted, index, token


@triton.jit
def _replay(mass, left, cols, tokens, rejected, points, zs, kepts, lane, POINT: tl.constexpr, W: tl.constexpr):
    """r (mass) and q without the tried drafts (left) at cols, from p and q, after the node's
    rejections so far: _Residual.reject's arithmetic in its order, one rejection at a time (a
    point mass's: r(c) = 0, q as it was)."""
    for j in tl.static_range(W):
        # a branch on the program's scalar, not a select: the division over the columns runs for
        # the rejected lanes only (a pass after the i-th rejection: i of them, not W)
        if _lane(rejected.to(tl.int32), j, lane) > 0:
            at = cols == _lane(tokens, j, lane)
            q_j = tl.math.div_rn(left, tl.maximum(_lane(kepts, j, lane), 1e-30))
            if POINT:
                pointed = _lane(points.to(tl.int32), j, lane) > 0
                mass = tl.where(pointed, tl.where(at, 0.0, mass), tl.maximum(mass - _lane(zs, j, lane) * q_j, 0.0))
                left = tl.where(~pointed & at, 0.0, left)
            else:
                mass = tl.maximum(mass - _lane(zs, j, lane) * q_j, 0.0)
                left = tl.where(at, 0.0, left)
    return mass, left


@triton.jit
def _race(p_row, q_row, expo_row, tokens, rejected, points, zs, kepts, lane, vocab, MODE: tl.constexpr,
          POINT: tl.constexpr, W: tl.constexpr, BLOCK_V: tl.constexpr):
    """The recovered (or bonus) token: argmax r / E, or argmax p / E where r is all zero."""
    best_r = tl.sum(tl.where(lane == 0, -1.0, 0.0), axis=0)
    best_p = best_r
    at_r = tl.sum(lane * 0, axis=0).to(tl.int64)
    at_p = at_r
    seen = at_r > 0  # any r > 0
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        inside = cols < vocab
        p = tl.load(p_row + cols, mask=inside, other=0.0)
        if MODE == 1:  # sibling_walk: r is p less the rejected siblings
            r = p
            for j in tl.static_range(W):
                r = tl.where((_lane(rejected.to(tl.int32), j, lane) > 0) & (cols == _lane(tokens, j, lane)), 0.0, r)
        else:
            r, _ = _replay(p, tl.load(q_row + cols, mask=inside, other=0.0), cols, tokens, rejected, points, zs,
                           kepts, lane, POINT, W)
        expo = tl.load(expo_row + cols, mask=inside, other=1.0)
        seen = seen | (tl.max((inside & (r > 0)).to(tl.int32), axis=0) > 0)
        best_r, at_r = _better(tl.math.div_rn(r, expo), cols, inside, best_r, at_r)
    if ~seen:  # rounding left r all zero (rare): p's race, a second pass rather than a division in every one
        for start in range(0, vocab, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            inside = cols < vocab
            p = tl.load(p_row + cols, mask=inside, other=0.0)
            expo = tl.load(expo_row + cols, mask=inside, other=1.0)
            best_p, at_p = _better(tl.math.div_rn(p, expo), cols, inside, best_p, at_p)
    return tl.where(seen, at_r, at_p)


@triton.jit
def _better(score, cols, inside, best, at):
    """The running (best score, its first column) after this block: an earlier block keeps ties."""
    score = tl.where(inside, score, -1.0)
    top = tl.max(score, axis=0)
    col = tl.min(tl.where(score == top, cols, 2**30), axis=0).to(tl.int64)
    better = top > best
    return tl.where(better, top, best), tl.where(better, col, at)
