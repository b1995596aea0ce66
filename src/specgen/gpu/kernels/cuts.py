"""The warp chain's cut searches: per row, the logit threshold that top-k and top-p keep (with
min-p beside it), and the normaliser z of what is kept. gpu/kernels/warp.py launches them between
its stats and probs kernels; core/sampling/warp.py defines what they compute.

Two searches for long rows, because neither does everything: the parallel one (_fast_cut_search,
_warp_fast_pass_kernel) spreads a row over many programs, which is what makes long top-k / top-p
rows fast, but it only takes rows without min-p whose top-k is at most FAST_TOP_K and whose bracket
narrows to FAST_CAP ids; the one-program search inside _warp_cut_kernel finishes every other row
(and is the reference the parallel one is tested against, through warp(..., parallel_cut=False)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from specgen.gpu.kernels.dependent import release_next, wait_previous
from specgen.gpu.workspace import Workspace

SEGMENT = 4096  # vocab columns per program; also the capacity of the compacted cut candidates
PIVOTS = 16  # thresholds tested per pass of the cut search
CUT_BLOCK = 1024  # columns per step of the cut kernel's passes over a long row
MAX_PASSES = 16  # bit-pattern pivots alone isolate a float32 in 11 passes

# The parallel cut search for long rows (vocab > SEGMENT) whose cut is top-k (k <= FAST_TOP_K) and/or
# top-p, without min-p: FAST_PASSES bracket passes over every (row, chunk) at once, each testing
# FAST_PIVOTS thresholds and writing per-chunk counts and masses (summed in chunk order by the next
# launch: deterministic, no atomics); then a compaction of the <= FAST_CAP ids left in the bracket
# at offsets from those counts; then _warp_cut_kernel finishes from the candidates: it sorts them
# once, and each cut is a prefix of that order (a cumulative sum of masses). A row that does not qualify
# or whose bracket still holds more than FAST_CAP ids goes through the one-program search.
FAST_PIVOTS = 32
FAST_CAP = 512
FAST_TOP_K = 256  # top-k rows need every id above the bracket (>= k of them) among the candidates
# Columns a pass program sums at a time, compiled / interpreted, and its warps. Registers set the
# pass's speed: 1,024 columns over 8 warps took 180 registers a thread, one program an SM (Nsight
# Compute, 33 rows), where 256 over 4 take 101, four an SM (sm90_resources.py warp). Both fix each
# chunk's sums, so neither may follow the row count. H200, 128,256 ids, t 0.8 / top-p 0.95 (top-k 50
# and top-p 0.9), µs a warp: 5 rows 109 (81) -> 97 (70), 33 rows 476 (335) -> 338 (198), 80 rows
# 1,160 (832) -> 767 (425); 128 / 4 (64 registers), 256 / 8 and 512 / 16 were slower.
FAST_CHUNK = {False: 256, True: 8192}
FAST_WARPS = 4
# Programs a pass launch aims at: fewer rows, fewer chunks a program (fast_per_program)
FAST_PROGRAMS = 600
FAST_PER_PROGRAM = 16  # most chunks a program takes: 80 rows at 32 were no faster than at 16
FAST_STATE = 8  # per row: status, total, lo, hi, S(hi), E(hi), S(lo), spare
# per row, the bracket after a pass (_warp_bracket_kernel): lo, hi, S(hi), E(hi), S(lo), C(lo), C(hi),
# lo's and hi's pivot indices. Every chunk's program of the next pass read all of a row's chunk sums
# to find it: at 128,256 ids, 126 chunks x 32 pivots x up to 3 planes per program, redone by each
# of the row's 126 programs (33 rows: 0.52 ms of a Llama 3.1 8B tree round at t 0.8, H200)
BRACKET = 9
_BRACKET = tl.constexpr(BRACKET)
# One program a row reads up to 3 planes of [chunks, P] sums: its loads in flight set its time. H200,
# 501 chunks: 4 -> 16 warps took a Llama 3.1 8B t 0.8 tree round's (33 rows) bracket launches from
# 94 to 73 µs, a 1-row warp's unchanged
BRACKET_WARPS = 16

MAX_SEGMENTS = 64  # vocab <= 262144; one constant, so every large vocabulary shares one compile


def _fast_cut_search(l, part, params, cand, rows: int, vocab: int, n_seg: int, workspace: Workspace,
                     launch: dict, per_program: int | None = None) -> torch.Tensor:
    """The parallel cut search of long rows (parallel_cut, the comment above FAST_PIVOTS): bracket passes and the compaction of the
    candidates, each over every chunk of every row at once. Returns the per-row state buffer that
    _warp_cut_kernel reads ([N, STATE] float32: status 1 = candidates ready, else the row's cut is
    searched there the one-program way). per_program: chunks a pass program takes (default
    fast_per_program's); the bits do not depend on it."""
    chunk = FAST_CHUNK[INTERPRETED]
    n_chunks = triton.cdiv(vocab, chunk)
    per_program = per_program or fast_per_program(rows, n_chunks)
    block_c = max(2, triton.next_power_of_2(n_chunks))
    passes = fast_passes(vocab)
    piv = workspace.scratch("warp_fast_piv", passes * rows * FAST_PIVOTS)
    sums = workspace.scratch("warp_fast_sums", 3 * rows * n_chunks * FAST_PIVOTS)
    state = workspace.scratch("warp_fast_state", rows * FAST_STATE)
    bracket = workspace.scratch("warp_fast_bracket", rows * BRACKET)
    common = (l, part, params.temperature, params.top_k, params.top_p, params.log_min_p, piv, sums, state, cand,
              bracket)
    for index in range(passes + 1):  # the passes, then the compaction
        if index:  # each row's bracket after the pass before, once, not in every chunk's program
            _warp_bracket_kernel[(rows,)](
                part, params.temperature, params.top_k, params.top_p, params.log_min_p, piv, sums, bracket, rows,
                vocab, n_seg, n_chunks, index - 1, passes, BLOCK_S=MAX_SEGMENTS, BLOCK_C=block_c, P=FAST_PIVOTS,
                KFAST=FAST_TOP_K, num_warps=BRACKET_WARPS, **launch,
            )
        _warp_fast_pass_kernel[(rows, triton.cdiv(n_chunks, per_program))](
            *common, rows, vocab, n_seg, n_chunks, index, passes, per_program,
            FIRST=index == 0, COMPACT=index == passes, BLOCK_S=MAX_SEGMENTS, BLOCK_C=block_c,
            CHUNK=chunk, P=FAST_PIVOTS, CAP=FAST_CAP, KFAST=FAST_TOP_K, STRIDE=SEGMENT, num_warps=FAST_WARPS,
            **launch,
        )
    return state


def fast_per_program(rows: int, chunks: int) -> int:
    """Chunks each pass program takes in turn: a power of two that leaves about FAST_PROGRAMS programs
    a launch. A program's chunks share its prologue (the row's scalars, its bracket, its pivots), and
    the sums of each chunk keep their bits whatever it is. H200, 128,256 ids (501 chunks), measured
    best: 1 row 2, 5 rows 4, 16 rows 8, 33 rows 8-16, 80 rows 16."""
    per = 1
    while per < FAST_PER_PROGRAM and rows * chunks // (2 * per) >= FAST_PROGRAMS:
        per *= 2
    return per


def fast_passes(vocab: int) -> int:
    """Bracket passes before the compaction: each narrows a row's bracket by up to FAST_PIVOTS - 1 pivots."""
    return 2 if vocab <= 32768 else 3


@triton.jit
def _row_stats(part_ptr, rows, row_ok, temperature, n_rows, n_seg, BLOCK_S: tl.constexpr):
    """Combine a row's segment partials: (m, first argmax, sum exp((l - m) / T), min finite l)."""
    segs = tl.arange(0, BLOCK_S)  # [S]
    mask = row_ok[:, None] & (segs < n_seg)[None, :]
    at = rows[:, None] * n_seg + segs[None, :]
    plane = n_rows * n_seg
    seg_max = tl.load(part_ptr + at, mask=mask, other=float("-inf"))  # [R, S]
    seg_sum = tl.load(part_ptr + plane + at, mask=mask, other=0.0)
    seg_min = tl.load(part_ptr + 2 * plane + at, mask=mask, other=float("inf"))
    seg_arg = tl.load(part_ptr + 3 * plane + at, mask=mask, other=0.0)
    m = tl.max(seg_max, axis=1)  # [R]
    first = tl.min(tl.where(seg_max == m[:, None], segs[None, :], BLOCK_S), axis=1)
    argmax = tl.sum(tl.where(segs[None, :] == first[:, None], seg_arg, 0.0), axis=1).to(tl.int64)
    scale = tl.exp(tl.math.div_rn(seg_max - tl.where(m > float("-inf"), m, 0.0)[:, None], temperature[:, None]))
    z = tl.sum(tl.where(seg_max > float("-inf"), seg_sum * scale, 0.0), axis=1)
    return m, argmax, z, tl.min(seg_min, axis=1)


@triton.jit(do_not_specialize=["n_rows", "n_seg"])
def _warp_cut_kernel(
    l_ptr,  # [N, V] float32 penalised logits
    part_ptr,  # [4, N, S] float32 partials, then [2, N] out: cut, z
    temperature_ptr,  # [N] float32
    top_k_ptr,  # [N] int32
    top_p_ptr,  # [N] float32
    log_min_p_ptr,  # [N] float32
    cand_ptr,  # [N, CAP] float32 scratch (segmented rows only)
    fast_ptr,  # [N, FAST_STATE] float32 state of the parallel search (FAST only)
    n_rows,
    vocab,
    n_seg,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CAP: tl.constexpr,
    PIVOTS: tl.constexpr,
    CUT_BLOCK: tl.constexpr,
    MAX_PASSES: tl.constexpr,
    DIRECT: tl.constexpr,
    FAST: tl.constexpr,
    FAST_CAP: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [R]
    row_ok = rows < n_rows
    live, m, temperature, z_all, fmin, k, k_on, top_p, p_on, log_min_p = _cut_params(
        part_ptr, temperature_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, rows, row_ok, n_rows, vocab, n_seg, BLOCK_S)
    bound_p = tl.maximum(top_p, 1.1754943508222875e-38)  # top_p clamped above 0: the max id survives
    if DIRECT:
        cols = tl.arange(0, BLOCK_V)
        mask = row_ok[:, None] & (cols < vocab)[None, :]
        l = tl.load(l_ptr + rows[:, None].to(tl.int64) * vocab + cols[None, :], mask=mask, other=float("-inf"))
        cut, z = _cut_full(l, m, temperature, k, k_on, bound_p, p_on, log_min_p,
                           tl.zeros_like(m) + float("-inf"), z_all, True)
    else:  # one row per program
        row = tl.max(rows, axis=0)
        status = 0.0 * tl.max(m, axis=0)
        if FAST:
            status = tl.load(fast_ptr + row * 8)
        if status == 1.0:  # the parallel search left the candidates
            cut, z = _cut_from_candidates(
                fast_ptr, cand_ptr, row, tl.max(m, axis=0), tl.max(temperature, axis=0), tl.max(z_all, axis=0),
                tl.max(k, axis=0), tl.max(k_on.to(tl.int32), axis=0) > 0, tl.max(bound_p, axis=0),
                tl.max(p_on.to(tl.int32), axis=0) > 0, CAP, FAST_CAP,
            )
        else:
            cut, z = _cut_segmented(
                l_ptr, cand_ptr, row, vocab, tl.max(m, axis=0), tl.max(temperature, axis=0), tl.max(z_all, axis=0),
                tl.max(fmin, axis=0), tl.max(k, axis=0), tl.max(k_on.to(tl.int32), axis=0) > 0,
                tl.max(bound_p, axis=0), tl.max(p_on.to(tl.int32), axis=0) > 0, tl.max(log_min_p, axis=0),
                CAP, PIVOTS, CUT_BLOCK, MAX_PASSES,
            )
    plane = 4 * n_rows * n_seg
    tl.store(part_ptr + plane + rows, cut, mask=row_ok)
    tl.store(part_ptr + plane + n_rows + rows, z, mask=row_ok)


# -- the parallel search (parallel_cut) ------------------------------------------------------------
# Scratch: piv [passes, N, P] pivots; sums [3, N, chunks, P]: per chunk, the count of ids above each
# pivot (plane 0), their mass w = exp(s) / z (plane 1; top-p rows) and, on the last pass, their
# unnormalised mass exp(s) (plane 2). Each pass overwrites the one before: the bracket launch between
# them has read it, and the compaction reads the last pass's counts (a batch's 160 rows over 128,256
# ids: 31 MB, not the 72 of a plane set a pass). State [N, 8]: status (1 = candidates ready), total,
# lo, hi, S(hi), E(hi), S(lo).


@triton.jit
def _fast_row(part_ptr, temperature_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, row, n_rows, vocab, n_seg,
              BLOCK_S: tl.constexpr, KFAST: tl.constexpr):
    """One row's scalars: (fast, by_count, m, temperature, z, fmin, bound). fast: the row's cut is
    top-k (k <= KFAST) and/or top-p without min-p; by_count: it has top-k, and the passes bracket
    the k-th largest logit (bound k), else the top-p cut (bound top_p)."""
    rows = row + tl.arange(0, 1)
    row_ok = rows < n_rows
    live, m, temperature, z_all, fmin, k, k_on, top_p, p_on, log_min_p = _cut_params(
        part_ptr, temperature_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, rows, row_ok, n_rows, vocab, n_seg, BLOCK_S)
    fast = live & (k_on | p_on) & (log_min_p == float("-inf")) & ((k <= KFAST) | (k_on == 0))
    bound = tl.where(k_on, k.to(tl.float32), tl.maximum(top_p, 1.1754943508222875e-38))
    return (tl.max(fast.to(tl.int32), axis=0) > 0, tl.max(k_on.to(tl.int32), axis=0) > 0,
            tl.max(m, axis=0), tl.max(temperature, axis=0), tl.max(z_all, axis=0),
            tl.max(fmin, axis=0), tl.max(bound, axis=0))


@triton.jit
def _cut_params(part_ptr, temperature_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, rows, row_ok, n_rows, vocab, n_seg,
                BLOCK_S: tl.constexpr):
    """Per row of [R] rows: live (sampled, some id unmasked), m (0 where not live), temperature (1
    where not live), z, min finite l, top-k and whether it cuts, top-p and whether it cuts, log min-p."""
    temperature = tl.load(temperature_ptr + rows, mask=row_ok, other=0.0)
    live = row_ok & (temperature > 0)
    temperature = tl.where(live, temperature, 1.0)
    m, argmax, z_all, fmin = _row_stats(part_ptr, rows, row_ok, temperature, n_rows, n_seg, BLOCK_S)
    live = live & (m > float("-inf"))
    m = tl.where(live, m, 0.0)
    k = tl.load(top_k_ptr + rows, mask=row_ok, other=0)
    top_p = tl.load(top_p_ptr + rows, mask=row_ok, other=1.0)
    log_min_p = tl.load(log_min_p_ptr + rows, mask=row_ok, other=float("-inf"))
    k_on = live & (k > 0) & (k < vocab)
    p_on = live & (top_p < 1.0)
    return live, m, temperature, z_all, fmin, k, k_on, top_p, p_on, log_min_p


@triton.jit
def _fast_bracket(piv_ptr, sums_ptr, row, n_rows, n_chunks, index, passes, by_count, bound,
                  BLOCK_C: tl.constexpr, P: tl.constexpr):
    """The bracket after pass `index`: its per-chunk sums added in chunk order, then as _bracket's
    update. Returns lo, hi, S(hi), E(hi) (last pass only), S(lo), C(lo), C(hi), and lo's and hi's
    pivot indices."""
    j = tl.arange(0, P)
    c = tl.arange(0, BLOCK_C)
    piv = tl.load(piv_ptr + (index * n_rows + row) * P + j)
    plane = n_rows * n_chunks * P
    at = (row * n_chunks + c[:, None]) * P + j[None, :]
    mask = (c[:, None] < n_chunks) & (j[None, :] < P)
    count = tl.sum(tl.load(sums_ptr + at, mask=mask, other=0.0), axis=0)  # [P] C(pivot)
    mass = count
    e_mass = 0.0 * count
    if by_count == 0:
        mass = tl.sum(tl.load(sums_ptr + plane + at, mask=mask, other=0.0), axis=0)  # [P] S(pivot)
        if index == passes - 1:
            e_mass = tl.sum(tl.load(sums_ptr + 2 * plane + at, mask=mask, other=0.0), axis=0)
    dropped = mass >= bound
    lo = tl.max(tl.where(dropped, piv, -float("inf")), axis=0)
    hi = tl.min(tl.where(dropped, float("inf"), piv), axis=0)
    at_lo = piv == lo
    at_hi = piv == hi
    return (lo, hi, tl.max(tl.where(at_hi, mass, 0.0), axis=0), tl.max(tl.where(at_hi, e_mass, 0.0), axis=0),
            tl.max(tl.where(at_lo, mass, 0.0), axis=0), tl.max(tl.where(at_lo, count, 0.0), axis=0),
            tl.max(tl.where(at_hi, count, 0.0), axis=0), tl.min(tl.where(at_lo, j, P), axis=0),
            tl.min(tl.where(at_hi, j, P), axis=0))


@triton.jit(do_not_specialize=["n_rows", "n_seg", "n_chunks", "index", "passes"])
def _warp_bracket_kernel(
    part_ptr,  # [4, N, S] float32 segment partials
    temperature_ptr,  # [N] float32
    top_k_ptr,  # [N] int32
    top_p_ptr,  # [N] float32
    log_min_p_ptr,  # [N] float32
    piv_ptr,  # [passes, N, P] float32
    sums_ptr,  # [3, N, chunks, P] float32: the latest pass's (see the comment above _fast_row)
    bracket_ptr,  # [N, BRACKET] float32 out
    n_rows,
    vocab,
    n_seg,
    n_chunks,
    index,  # the pass whose sums are read
    passes,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    P: tl.constexpr,
    KFAST: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Grid (rows,): a fast row's bracket after pass `index` (_fast_bracket), for every chunk's
    program of the next launch to read."""
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0)
    fast, by_count, m, temperature, z_all, fmin, bound = _fast_row(
        part_ptr, temperature_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, row, n_rows, vocab, n_seg, BLOCK_S, KFAST)
    if fast:
        lo, hi, s_hi, e_hi, s_lo, c_lo, c_hi, j_lo, j_hi = _fast_bracket(
            piv_ptr, sums_ptr, row, n_rows, n_chunks, index, passes, by_count, bound, BLOCK_C, P)
        b = bracket_ptr + row * _BRACKET
        tl.store(b, lo)
        tl.store(b + 1, hi)
        tl.store(b + 2, s_hi)
        tl.store(b + 3, e_hi)
        tl.store(b + 4, s_lo)
        tl.store(b + 5, c_lo)
        tl.store(b + 6, c_hi)
        tl.store(b + 7, j_lo.to(tl.float32))
        tl.store(b + 8, j_hi.to(tl.float32))


@triton.jit(do_not_specialize=["n_rows", "n_seg", "n_chunks", "index", "passes", "per_program"])
def _warp_fast_pass_kernel(
    l_ptr,  # [N, V] float32 penalised logits
    part_ptr,  # [4, N, S] float32 segment partials
    temperature_ptr,  # [N] float32
    top_k_ptr,  # [N] int32
    top_p_ptr,  # [N] float32
    log_min_p_ptr,  # [N] float32
    piv_ptr,  # [passes, N, P] float32
    sums_ptr,  # [3, N, chunks, P] float32: the latest pass's (see the comment above _fast_row)
    state_ptr,  # [N, 8] float32 out (compaction)
    cand_ptr,  # [N, STRIDE] float32 out (compaction)
    bracket_ptr,  # [N, BRACKET] float32: the bracket after the pass before (_warp_bracket_kernel)
    n_rows,
    vocab,
    n_seg,
    n_chunks,
    index,  # this pass (the compaction: index == passes)
    passes,
    per_program,  # chunks a program takes, one after another
    FIRST: tl.constexpr,
    COMPACT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHUNK: tl.constexpr,
    P: tl.constexpr,
    CAP: tl.constexpr,
    KFAST: tl.constexpr,
    STRIDE: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Grid (rows, cdiv(chunks, per_program)); each program takes per_program chunks in turn. A pass:
    the bracket from the previous pass's sums, P pivots in it, and each chunk's count / mass above
    each pivot. The compaction: the final bracket, and each chunk's ids in it stored at an offset
    counted from the last pass's per-chunk counts (the row's ids in column order). The program of
    chunk 0 writes the row's pivots (passes) or its state (compaction)."""
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0)
    first = tl.program_id(1) * per_program  # this program's chunks: first .. first + per_program - 1
    fast, by_count, m, temperature, z_all, fmin, bound = _fast_row(
        part_ptr, temperature_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, row, n_rows, vocab, n_seg, BLOCK_S, KFAST)
    if COMPACT:
        if (first == 0) & (fast == 0):
            tl.store(state_ptr + row * 8, 0.0)
    if fast:
        if FIRST:
            lo = -float("inf") + 0.0 * m
            hi = m
        else:
            b = bracket_ptr + row * _BRACKET
            lo, hi, s_hi, e_hi, s_lo = tl.load(b), tl.load(b + 1), tl.load(b + 2), tl.load(b + 3), tl.load(b + 4)
            c_lo, c_hi = tl.load(b + 5), tl.load(b + 6)
            j_lo, j_hi = tl.load(b + 7).to(tl.int32), tl.load(b + 8).to(tl.int32)
        row_l = l_ptr + row.to(tl.int64) * vocab
        # A chunk past the row's last (the last program's spare turns) loads no id and stores nothing,
        # so the loop has no branch: each chunk's sums are the same bits whatever per_program is.
        if COMPACT:
            top = tl.where(by_count, float("inf"), hi)  # top-k: every id above lo; top-p: those in (lo, hi]
            total = tl.where(by_count, c_lo, c_lo - c_hi)
            c = tl.arange(0, BLOCK_C)
            base = sums_ptr + row * n_chunks * P  # the last pass's counts
            per = tl.load(base + c * P + j_lo, mask=c < n_chunks, other=0.0)
            per -= tl.where(by_count, 0.0, tl.load(base + c * P + j_hi, mask=c < n_chunks, other=0.0))
            if total <= CAP:
                for turn in range(per_program):
                    chunk = first + turn
                    cols = chunk * CHUNK + tl.arange(0, CHUNK)
                    l = tl.load(row_l + cols, mask=cols < vocab, other=float("-inf"))
                    offset = tl.sum(tl.where(c < chunk, per, 0.0), axis=0).to(tl.int32)
                    inside = (l > lo) & (l <= top)
                    at = offset + tl.cumsum(inside.to(tl.int32), axis=0) - 1
                    tl.store(cand_ptr + row.to(tl.int64) * STRIDE + at, l, mask=inside)
            if first == 0:
                state = state_ptr + row * 8
                tl.store(state, tl.where(total <= CAP, 1.0, 0.0))
                tl.store(state + 1, total)
                tl.store(state + 2, lo)
                tl.store(state + 3, hi)
                tl.store(state + 4, s_hi)
                tl.store(state + 5, e_hi)
                tl.store(state + 6, s_lo)
        else:
            piv = _pivots(lo, hi, fmin, P)  # [P]
            j = tl.arange(0, P)
            if first == 0:
                tl.store(piv_ptr + (index * n_rows + row) * P + j, piv)
            plane = n_rows * n_chunks * P
            for turn in range(per_program):
                chunk = first + turn
                cols = chunk * CHUNK + tl.arange(0, CHUNK)
                l = tl.load(row_l + cols, mask=cols < vocab, other=float("-inf"))
                here = chunk * P + j < n_chunks * P  # [P] (a tensor mask, as the interpreter needs)
                above = l[:, None] > piv[None, :]  # [CHUNK, P]
                at = (row * n_chunks + chunk) * P + j
                tl.store(sums_ptr + at, tl.sum(above.to(tl.int32), axis=0).to(tl.float32), mask=here)
                if by_count == 0:
                    e = tl.exp(tl.math.div_rn(l - m, temperature))
                    w = tl.math.div_rn(e, z_all)
                    tl.store(sums_ptr + plane + at, tl.sum(tl.where(above, w[:, None], 0.0), axis=0),
                             mask=here)
                    if index == passes - 1:
                        tl.store(sums_ptr + 2 * plane + at,
                                 tl.sum(tl.where(above, e[:, None], 0.0), axis=0), mask=here)


@triton.jit
def _prefix_kept(vs, ws, above, bound, total):
    """How many of the candidates vs (sorted in descending order, -inf padded) are kept: candidate i
    is kept when above + (the sum of ws over positions before i) < bound. Sums are non-decreasing
    along the sorted order, so the kept candidates are a prefix. Ties need no care: an equal value
    earlier in the order adds to the sum, but the first of a tie group decides for the group
    (every id >= the cut is kept), and it sees exactly the mass of strictly larger values."""
    before = tl.cumsum(ws, axis=0)  # before[i] = the sum over positions 0..i (so position i + 1 is kept)
    later = (above + before < bound) & (tl.arange(0, vs.shape[0]) < total - 1)  # none when above >= bound
    return tl.where(above < bound, 1, 0) + tl.sum(later.to(tl.int32), axis=0)


@triton.jit
def _nth_largest(vs, n):
    """vs[n - 1] of candidates sorted in descending order; +inf for n = 0."""
    return tl.min(tl.where(tl.arange(0, vs.shape[0]) < n, vs, float("inf")), axis=0)


@triton.jit
def _cut_from_candidates(state_ptr, cand_ptr, row, m, temperature, z_all, k, k_on, bound_p, p_on,
                         STRIDE: tl.constexpr, CAP: tl.constexpr):
    """cut and z of one row from the parallel search's candidates (see _warp_fast_pass_kernel): the
    candidates sorted once, then each cut is a prefix of the sorted order (_prefix_kept)."""
    state = state_ptr + row * 8
    total = tl.load(state + 1).to(tl.int32)
    hi = tl.load(state + 3)
    s_hi = tl.load(state + 4)
    e_hi = tl.load(state + 5)
    s_lo = tl.load(state + 6)
    cbase = cand_ptr + row.to(tl.int64) * STRIDE
    idx = tl.arange(0, CAP)
    v = tl.load(cbase + idx, mask=idx < total, other=float("-inf"))
    e = tl.where(v > float("-inf"), tl.exp(tl.math.div_rn(v - m, temperature)), 0.0)
    vs = tl.sort(v, descending=True)
    es = tl.where(vs > float("-inf"), tl.exp(tl.math.div_rn(vs - m, temperature)), 0.0)
    if k_on:  # every id above the bracket is a candidate: top-k, then top-p inside it, in registers
        k_cut = _nth_largest(vs, tl.minimum(k, total))
        z_k = tl.sum(tl.where(v >= k_cut, e, 0.0), axis=0)
        cut = k_cut
        if p_on:
            ws = tl.where(vs >= k_cut, tl.math.div_rn(es, z_k), 0.0)
            cut = tl.maximum(k_cut, _nth_largest(vs, _prefix_kept(vs, ws, 0.0 * m, bound_p, total)))
        z = tl.sum(tl.where(v >= cut, e, 0.0), axis=0)
    else:  # top-p: the candidates are the ids in (lo, hi]; S(hi) and E(hi) come from the passes
        cut = _nth_largest(vs, _prefix_kept(vs, tl.math.div_rn(es, z_all), s_hi, bound_p, total))
        cut = tl.where(cut == float("inf"), hi, cut)  # no candidate kept: exactly the ids above hi
        cut = tl.where(s_lo < bound_p, -float("inf"), cut)  # the bracket never dropped anything
        z = tl.where(cut == -float("inf"), z_all, e_hi + tl.sum(tl.where(v >= cut, e, 0.0), axis=0))
    return cut, z


@triton.jit
def _cut_full(v, m, temperature, k, k_on, bound_p, p_on, log_min_p, k_cut, z_k, FIND_K: tl.constexpr):
    """cut and z from candidates v [R, C] (-inf padded) that hold every id above the cut.

    With FIND_K, v also holds more than k ids (or the whole row), so counting within v finds the
    top-k cut; otherwise the top-k cut k_cut and its normaliser z_k are given.
    """
    s = tl.math.div_rn(v - m[:, None], temperature[:, None])
    e = tl.where(v > float("-inf"), tl.exp(s), 0.0)
    unbounded = tl.zeros_like(m) + float("-inf")
    if FIND_K:
        if tl.max(k_on.to(tl.int32), axis=0) > 0:
            ones = tl.where(v > float("-inf"), 1.0, 0.0)
            k_cut = tl.where(k_on, _cut(v, ones, 0.0 * m, k.to(tl.float32), unbounded, m), float("-inf"))
            z_k = tl.sum(tl.where(v >= k_cut[:, None], e, 0.0), axis=1)
    p_cut = unbounded
    if tl.max(p_on.to(tl.int32), axis=0) > 0:
        w = tl.where(v >= k_cut[:, None], tl.math.div_rn(e, tl.where(z_k > 0, z_k, 1.0)[:, None]), 0.0)
        p_cut = tl.where(p_on, _cut(v, w, 0.0 * m, bound_p, unbounded, m), float("-inf"))
    cut = tl.maximum(k_cut, p_cut)
    z = tl.sum(tl.where((v >= cut[:, None]) & (s >= log_min_p[:, None]), e, 0.0), axis=1)
    return cut, z


@triton.jit
def _cut(v, w, above, bound, lo, hi):
    """Per row of candidates v [R, C] with weights w: the smallest c such that keeping v >= c keeps
    exactly the ids whose S = above + (sum of w over candidates with a strictly larger v) < bound.

    Needs S(hi) < bound; where S(lo) < bound too, every id is kept (-inf). Bisects the float bit
    patterns between lo and hi: 32 halvings leave no float between them (a step on converged rows
    changes nothing; a fixed count saves the interpreter a convergence reduction per step).
    """
    lo_s = above + tl.sum(tl.where(v > lo[:, None], w, 0.0), axis=1)
    key_lo = _key(lo).to(tl.int64)
    key_hi = _key(hi).to(tl.int64)
    for _ in range(32):
        mid = (key_lo + key_hi) // 2
        key = mid.to(tl.int32)
        pivot = (key ^ ((key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)  # _unkey, inlined (hot loop)
        dropped = above + tl.sum(tl.where(v > pivot[:, None], w, 0.0), axis=1) >= bound
        key_lo = tl.where(dropped, mid, key_lo)
        key_hi = tl.where(dropped, key_hi, mid)
    return tl.where(lo_s >= bound, _unkey(key_hi.to(tl.int32)), float("-inf"))


@triton.jit
def _cut_segmented(l_ptr, cand_ptr, row, vocab, m, temperature, z_all, fmin, k, k_on, bound_p, p_on, log_min_p,
                   CAP: tl.constexpr, PIVOTS: tl.constexpr, CUT_BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr):
    """cut and z of one long row: bracket by passes, compact, finish in registers; more passes only
    where a stage's bracket leaves ids above it uncompacted. Scalars and 1-D [C] blocks only: [1, C]
    tiles broadcast from [1] vectors get a thread-per-row layout from Triton 3.6 (each thread
    holding the whole tile)."""
    row_off = row.to(tl.int64) * vocab
    k_cut = -float("inf") + 0.0 * m
    z_k = z_all
    cut = k_cut
    z = z_all
    finished = 0 * k  # int32 tensors (not Python ints) so both sides of each `if` agree in type
    pass_z = 0 * k  # 1: z must be summed over the row after the stages
    if k_on:
        lo, hi, s_hi, c_lo, c_hi = _bracket(l_ptr, row_off, vocab, m, temperature, 1.0, k_cut, k.to(tl.float32),
                                            fmin, False, CAP, PIVOTS, CUT_BLOCK, MAX_PASSES)
        full = c_lo <= CAP  # every id above lo fits: finish top-k, top-p and min-p in registers
        v = _candidates(l_ptr, cand_ptr, row, row_off, vocab, lo, tl.where(full, float("inf"), hi), CAP, CUT_BLOCK)
        ones = tl.where(v > float("-inf"), 1.0, 0.0)
        # with every id above lo present, counting from -inf is exact; else c_hi ids rank above the bracket
        k_cut = _cut_1d(v, ones, tl.where(full, 0.0, c_hi.to(tl.float32)), k.to(tl.float32),
                        tl.where(full, float("-inf"), lo), hi)
        if full:
            s = tl.math.div_rn(v - m, temperature)
            e = tl.where(v > float("-inf"), tl.exp(s), 0.0)
            z_k = tl.sum(tl.where(v >= k_cut, e, 0.0), axis=0)
            cut = k_cut
            if p_on:
                w = tl.where(v >= k_cut, tl.math.div_rn(e, z_k), 0.0)
                cut = tl.maximum(k_cut, _cut_1d(v, w, 0.0, bound_p, -float("inf") + 0.0 * m, m))
            z = tl.sum(tl.where((v >= cut) & (s >= log_min_p), e, 0.0), axis=0)
            finished = 1 + 0 * k
        else:
            z_k = _exp_sum(l_ptr, row_off, vocab, m, temperature, k_cut, -float("inf"), CUT_BLOCK)
            cut = k_cut
            z = z_k
    if p_on & (finished == 0):
        lo, hi, s_hi, c_lo, c_hi = _bracket(l_ptr, row_off, vocab, m, temperature, z_k, k_cut, bound_p,
                                            fmin, True, CAP, PIVOTS, CUT_BLOCK, MAX_PASSES)
        full = c_lo <= CAP
        v = _candidates(l_ptr, cand_ptr, row, row_off, vocab, lo, tl.where(full, float("inf"), hi), CAP, CUT_BLOCK)
        s = tl.math.div_rn(v - m, temperature)
        e = tl.where(v > float("-inf"), tl.exp(s), 0.0)
        w = tl.where(v >= k_cut, tl.math.div_rn(e, z_k), 0.0)
        cut = tl.maximum(k_cut, _cut_1d(v, w, tl.where(full, 0.0, s_hi), bound_p, lo, hi))
        if full:
            z = tl.sum(tl.where((v >= cut) & (s >= log_min_p), e, 0.0), axis=0)
            finished = 1 + 0 * k
        else:
            pass_z = 1 + 0 * k
    if (finished == 0) & ((pass_z == 1) | (log_min_p > float("-inf"))):
        z = _exp_sum(l_ptr, row_off, vocab, m, temperature, cut, log_min_p, CUT_BLOCK)
    return cut, z


@triton.jit
def _cut_1d(v, w, above, bound, lo, hi):
    """_cut for one row: candidates v [C], weights w [C], scalar above / bound / lo / hi."""
    lo_s = above + tl.sum(tl.where(v > lo, w, 0.0), axis=0)
    key_lo = _key(lo).to(tl.int64)
    key_hi = _key(hi).to(tl.int64)
    for _ in range(32):
        mid = (key_lo + key_hi) // 2
        key = mid.to(tl.int32)
        pivot = (key ^ ((key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)  # _unkey, inlined (hot loop)
        dropped = above + tl.sum(tl.where(v > pivot, w, 0.0), axis=0) >= bound
        key_lo = tl.where(dropped, mid, key_lo)
        key_hi = tl.where(dropped, key_hi, mid)
    return tl.where(lo_s >= bound, _unkey(key_hi.to(tl.int32)), float("-inf"))


@triton.jit
def _key(x):
    """float32 -> int32 with the same order (for pivots spaced in bit patterns)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _unkey(key):
    return (key ^ ((key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _pivots(lo, hi, fmin, PIVOTS: tl.constexpr):
    """[P] thresholds in [lo, hi]: lo, hi, then half spaced in value, half in bit patterns."""
    j = tl.arange(0, PIVOTS)
    n_value: tl.constexpr = (PIVOTS - 2) // 2
    n_bits: tl.constexpr = PIVOTS - 2 - n_value
    base = tl.where(lo > float("-inf"), lo, fmin)
    f = (j - 1).to(tl.float32) / (n_value + 1)
    by_value = base * (1.0 - f) + hi * f
    key_lo = _key(lo).to(tl.int64)
    key_hi = _key(hi).to(tl.int64)
    by_bits = _unkey((key_lo + (key_hi - key_lo) * (j - 1 - n_value) // (n_bits + 1)).to(tl.int32))
    by_value = tl.minimum(tl.maximum(by_value, lo), hi)
    return tl.where(j == 0, lo, tl.where(j == 1, hi, tl.where(j <= n_value + 1, by_value, by_bits)))


@triton.jit
def _bracket(l_ptr, row_off, vocab, m, temperature, z_k, floor, bound, fmin, MASS: tl.constexpr,
             CAP: tl.constexpr, PIVOTS: tl.constexpr, CUT_BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr):
    """Shrink (lo, hi] around the cut of S(c) = sum over l > c of w(l) < bound, until <= CAP ids remain.

    Invariant: S(lo) >= bound (ids <= lo dropped), S(hi) < bound (ids >= hi kept). w = 1 (top-k,
    bound k) or w = exp(s) / z_k on l >= floor (top-p, bound top_p). Returns lo, hi, S(hi),
    C(lo), C(hi) with C(c) = #ids with l > c.
    """
    lo = -float("inf") + 0.0 * m
    hi = m
    s_hi = 0.0 * m
    c_lo = vocab + 0 * row_off.to(tl.int32)
    c_hi = 0 * c_lo
    passes = 0 * c_lo
    go = c_lo - c_hi > CAP
    while go:
        pivots = _pivots(lo, hi, fmin, PIVOTS)  # [P]
        sums = tl.zeros([CUT_BLOCK, PIVOTS], dtype=tl.float32)
        counts = tl.zeros([CUT_BLOCK, PIVOTS], dtype=tl.int32)
        for start in range(0, vocab, CUT_BLOCK):
            cols = start + tl.arange(0, CUT_BLOCK)
            l = tl.load(l_ptr + row_off + cols, mask=cols < vocab, other=float("-inf"))
            above = l[:, None] > pivots[None, :]  # [B, P]
            if MASS:
                w = tl.where(l >= floor, tl.math.div_rn(tl.exp(tl.math.div_rn(l - m, temperature)), z_k), 0.0)
                sums += tl.where(above, w[:, None], 0.0)
            counts += above.to(tl.int32)
        count = tl.sum(counts, axis=0)  # [P] C(pivot)
        if MASS:
            mass = tl.sum(sums, axis=0)  # [P] S(pivot)
        else:
            mass = count.to(tl.float32)
        dropped = mass >= bound
        lo = tl.max(tl.where(dropped, pivots, -float("inf")), axis=0)
        hi = tl.min(tl.where(dropped, float("inf"), pivots), axis=0)
        c_lo = tl.max(tl.where(pivots == lo, count, 0), axis=0)
        c_hi = tl.max(tl.where(pivots == hi, count, 0), axis=0)
        s_hi = tl.max(tl.where(pivots == hi, mass, 0.0), axis=0)
        passes += 1
        between = _unkey(_key(lo) + 1) < hi  # some float lies strictly inside (lo, hi); else only ties at hi
        go = (c_lo - c_hi > CAP) & between & (passes < MAX_PASSES)
    return lo, hi, s_hi, c_lo, c_hi


@triton.jit
def _candidates(l_ptr, cand_ptr, row, row_off, vocab, lo, top, CAP: tl.constexpr, CUT_BLOCK: tl.constexpr):
    """The logits in (lo, top] of one row (at most CAP of them, any order), -inf padded."""
    base = cand_ptr + row.to(tl.int64) * CAP
    n = 0 * row
    for start in range(0, vocab, CUT_BLOCK):
        cols = start + tl.arange(0, CUT_BLOCK)
        l = tl.load(l_ptr + row_off + cols, mask=cols < vocab, other=float("-inf"))
        inside = (l > lo) & (l <= top)
        at = n + tl.cumsum(inside.to(tl.int32), axis=0) - 1
        tl.store(base + at, l, mask=inside & (at < CAP))
        n += tl.sum(inside.to(tl.int32), axis=0)
    tl.debug_barrier()  # the stores above, from every thread, before the loads below
    idx = tl.arange(0, CAP)
    return tl.load(base + idx, mask=idx < n, other=float("-inf"))


@triton.jit
def _exp_sum(l_ptr, row_off, vocab, m, temperature, cut, log_min_p, CUT_BLOCK: tl.constexpr):
    """sum of exp(s) over one row's ids with l >= cut and s >= log_min_p."""
    acc = tl.zeros([CUT_BLOCK], dtype=tl.float32)
    for start in range(0, vocab, CUT_BLOCK):
        cols = start + tl.arange(0, CUT_BLOCK)
        l = tl.load(l_ptr + row_off + cols, mask=cols < vocab, other=float("-inf"))
        s = tl.math.div_rn(l - m, temperature)
        acc += tl.where((l >= cut) & (s >= log_min_p) & (l > float("-inf")), tl.exp(s), 0.0)
    return tl.sum(acc, axis=0)


# Triton made interpreted functions, not JITFunctions, when TRITON_INTERPRET was set as this module
# was imported (CPU tests): tile sizes follow.
INTERPRETED = not isinstance(_warp_cut_kernel, JITFunction)
