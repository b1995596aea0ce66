"""Triton warp chain: logits [N, V] -> (argmax [N], warped probs [N, V]), equal to core/sampling/warp.warp.

Glossary (core/sampling/warp.py defines every step; this file only reproduces it):
    l        penalised logits: bad mask, repetition / frequency / presence penalties (float32, the
             reference's operations in its order, round-to-nearest division, no FMA contraction).
    m        max l of a row; its first index is the argmax (greedy rows stop there).
    s        (l - m) / T; exp(s) is the unnormalised probability.
    cut      per-row logit threshold from top-k and top-p: an id is kept iff l >= cut and
             s >= log(min_p). Top-k keeps ids with fewer than k strictly larger logits; top-p keeps
             ids whose top-k-softmax mass of strictly larger logits is < top_p. Decided on l, never
             on rounded probabilities, so the kept set equals the reference's (top-p can differ
             only where a mass sum lies within float32 rounding of top_p).
    z        sum of exp(s) over the kept ids: p = exp(s) / z (one normalisation).

Kernels (the cut and parallel-pass kernels live in gpu/kernels/cuts.py; argmax alone, a greedy draft's pick, is
gpu/kernels/argmax.py):
    _warp_stats_kernel  grid (row tiles, segments): l (stored in the probs buffer as scratch) and,
                        per segment, max / first argmax / sum exp((l - max) / T) / min finite l;
                        raises bit 1 of the error flag on NaN or +inf logits.
    _warp_cut_kernel    grid (row tiles,): cut and z for rows that use top-k / top-p / min-p.
                        Small vocabularies hold the row in registers. Large ones (R = 1 row per
                        program) bracket the cut with 16 pivots per pass over the row (half spaced
                        in value, half in float bit patterns so every pass shrinks the bracket)
                        and compact the <= SEGMENT ids left in it. Either way the cut is then
                        found by bisecting float bit patterns over the candidates in registers.
                        Rows the parallel search finished (below) take their cut and z from its
                        candidates instead.
    _warp_fast_pass_kernel  grid (rows, chunk groups), launched fast_passes(V) + 1 times before the cut
                        kernel for long top-k / top-p rows (warp(..., parallel_cut=True)):
                        bracket passes, each testing FAST_PIVOTS thresholds over every chunk at
                        once, then the compaction of the <= FAST_CAP ids left in the bracket;
                        between two of them _warp_bracket_kernel (grid (rows,)) finds each
                        row's bracket from the pass's per-chunk sums.
    _warp_probs_kernel  grid (row tiles, segments): argmax, p = exp(s) / z on kept ids, one-hot for
                        greedy rows; raises bit 2 of the error flag for a row with every id masked.
                        With Exp(1) draws it also runs the exponential race (sample_race).

Vocabularies up to SEGMENT columns run R rows per program in one segment; larger ones run one row
per program over cdiv(V, SEGMENT) segments. The vocab size is a runtime argument: a kernel compiles
once per (rows per program, block) bucket and mask/penalty presence, never per N or k.
The error flag (workspace.error) is read by the verify kernels and reported with the round's
output (no host sync).

The cut searches (the one-program one and the parallel one for long rows) are gpu/kernels/cuts.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from specgen.core.sampling.warp import PenaltyRows, WarpParams
from specgen.gpu.kernels.cuts import (CUT_BLOCK, FAST_CAP, MAX_PASSES, MAX_SEGMENTS, PIVOTS, SEGMENT, _fast_cut_search,
                                      _row_stats, _warp_cut_kernel)
from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous
from specgen.gpu.workspace import Workspace

# [R, BLOCK_V] elements per program, compiled or in the Triton interpreter (CPU tests), which pays
# ~ms of Python per reduction whatever its size, so its tiles are large
TILE_ELEMENTS = {False: 4096, True: 1 << 19}
ERROR_BAD_LOGITS = 1
ERROR_ALL_MASKED = 2





def layout(vocab: int) -> tuple[int, int, int]:
    """(rows per program, columns per program, segments per row) for a vocabulary."""
    if vocab > SEGMENT:
        assert vocab <= SEGMENT * MAX_SEGMENTS, f"vocab {vocab} > {SEGMENT * MAX_SEGMENTS}"
        return 1, SEGMENT, triton.cdiv(vocab, SEGMENT)
    block_v = triton.next_power_of_2(vocab)
    return max(1, TILE_ELEMENTS[INTERPRETED] // block_v), block_v, 1


def warp(
    logits: torch.Tensor,  # [N, V] float32 / bfloat16 / float16
    params: WarpParams,
    penalties: PenaltyRows | None,
    bad_mask: torch.Tensor | None,  # [N, V] or [V] bool
    workspace: Workspace,  # scratch, and the error flag OR-ed into
    expo: torch.Tensor | None = None,  # [N, V] float32 Exp(1) draws: also run the race (sample_race)
    out: torch.Tensor | None = None,  # [N] int64: where the race's ids go (with expo)
    *,
    parallel_cut: bool = True,  # long top-k / top-p rows try the parallel cut search first
    per_program: int | None = None,  # chunks a program of the parallel search takes (None: its rule)
    probs_out: torch.Tensor | None = None,  # [N, V] float32 contiguous: where the probs go (else new)
    dependent: bool = False,  # every launch dependent on the kernel before (gpu/kernels/dependent.py)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as core/sampling/warp.warp, except that errors land in workspace.error instead of
    raising. With expo, the probs kernel also writes sampling.sample_race(probs, expo) into out:
    each program races its segment and the last of a row's programs to finish picks the winner.
    probs_out: a draft step's row of the round's q, so no copy follows the warp; it is unwritten
    when every row is greedy (None is returned for the probs, as without it).
    dependent: a sampled draft step is then one chain from its logits through its pick."""
    rows, vocab = logits.shape
    error = workspace.error
    _check_inputs(logits, params, penalties, bad_mask, workspace)
    assert expo is None or (out is not None and out.shape == (rows,) and out.dtype == torch.int64)
    flags = params.flags
    block_r, block_v, n_seg = layout(vocab)
    part = workspace.scratch("warp_part", 4 * rows * n_seg + 2 * rows)  # seg max/sum/min/argmax, cut, z
    probs = None
    if not flags.all_greedy:
        if probs_out is not None:
            assert probs_out.shape == (rows, vocab) and probs_out.dtype == torch.float32 and probs_out.is_contiguous()
            probs = probs_out
        else:
            probs = torch.empty(rows, vocab, dtype=torch.float32, device=logits.device)
    launch = dict(DEPENDENT=dependent, **launch_options(dependent))
    dummy = error  # stands in for absent optional tensors (never dereferenced)
    counts = penalties.counts if penalties is not None else dummy
    seen = penalties.seen if penalties is not None else dummy
    grid = (triton.cdiv(rows, block_r), n_seg)
    _warp_stats_kernel[grid](
        logits, probs if probs is not None else dummy, params.temperature,
        params.repetition_penalty, params.presence_penalty, params.frequency_penalty,
        counts, seen, bad_mask if bad_mask is not None else dummy,
        vocab if bad_mask is not None and bad_mask.ndim == 2 else 0,
        part, error, rows, vocab, n_seg,
        HAS_PENALTIES=penalties is not None, HAS_BAD_MASK=bad_mask is not None, STORE_L=probs is not None,
        BLOCK_R=block_r, BLOCK_V=block_v, num_warps=_warps(block_r * block_v),
        **{**launch, **launch_options(dependent, fp_fusion=False)},
    )
    has_cut = probs is not None and (flags.top_k or flags.top_p or flags.min_p)
    if has_cut:
        cand = workspace.scratch("warp_cand", rows * SEGMENT) if n_seg > 1 else dummy
        fast = dummy
        if n_seg > 1 and parallel_cut and (flags.top_k or flags.top_p):
            fast = _fast_cut_search(probs, part, params, cand, rows, vocab, n_seg, workspace, launch, per_program)
        _warp_cut_kernel[(triton.cdiv(rows, block_r),)](
            probs, part, params.temperature, params.top_k, params.top_p, params.log_min_p, cand, fast,
            rows, vocab, n_seg,
            BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_S=1 if n_seg == 1 else MAX_SEGMENTS, CAP=SEGMENT,
            PIVOTS=PIVOTS, CUT_BLOCK=CUT_BLOCK, MAX_PASSES=MAX_PASSES, DIRECT=n_seg == 1,
            FAST=fast is not dummy, FAST_CAP=FAST_CAP,
            num_warps=_warps(block_r * block_v) if n_seg == 1 else 16, **launch,
        )
    argmax = torch.empty(rows, dtype=torch.int64, device=logits.device)
    race = expo is not None and probs is not None
    if race:
        assert expo.shape == logits.shape and expo.dtype == torch.float32 and expo.is_contiguous()
        race_part = workspace.scratch("warp_race", 2 * rows * n_seg)
        counter = workspace.zeros("warp_race_counter", rows)  # per-row arrivals; the last program resets its row's
    _warp_probs_kernel[grid if probs is not None else (grid[0], 1)](
        probs if probs is not None else dummy, argmax, params.temperature, params.log_min_p if has_cut else dummy,
        part, error, expo if race else dummy, out if race else dummy, race_part if race else dummy,
        counter if race else dummy, rows, vocab, n_seg,
        HAS_CUT=has_cut, WRITE_PROBS=probs is not None, RACE=race,
        BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_S=1 if n_seg == 1 else MAX_SEGMENTS,
        num_warps=_warps(block_r * block_v), **launch,
    )
    if expo is not None and probs is None:  # every row greedy: the race of one-hot rows is the argmax
        out.copy_(argmax)
    return argmax, probs


def _check_inputs(logits, params, penalties, bad_mask, workspace) -> None:
    assert logits.ndim == 2 and logits.is_contiguous(), "logits must be a contiguous [N, V] tensor"
    assert logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
    rows, vocab = logits.shape
    for name in params.__dataclass_fields__:
        value = getattr(params, name)
        assert value.shape == (rows,) and value.is_contiguous() and value.device == logits.device, name
        assert value.dtype == (torch.int32 if name == "top_k" else torch.float32), name
    if penalties is not None:
        assert penalties.counts.shape == (rows, vocab) and penalties.counts.dtype == torch.int32
        assert penalties.seen.shape == (rows, vocab) and penalties.seen.dtype == torch.bool
        assert penalties.counts.is_contiguous() and penalties.seen.is_contiguous()
    if bad_mask is not None:
        assert bad_mask.dtype == torch.bool and bad_mask.is_contiguous()
        assert bad_mask.shape in ((rows, vocab), (vocab,)), "bad_mask must be [N, V] or [V]"
    assert workspace.device == logits.device, f"workspace on {workspace.device}, logits on {logits.device}"


def _warps(elements: int) -> int:
    return max(1, min(8, elements // 512))


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------

# Partials layout in `part_ptr`: [4, N, S] (0 max, 1 sum exp, 2 min finite, 3 first argmax as
# float) followed by [2, N] (0 cut, 1 z).


@triton.jit(do_not_specialize=["n_rows", "n_seg"])
def _warp_stats_kernel(
    logits_ptr,  # [N, V] float
    l_ptr,  # [N, V] float32 out: penalised logits (the probs buffer, as scratch)
    temperature_ptr,  # [N] float32
    repetition_ptr,  # [N] float32
    presence_ptr,  # [N] float32
    frequency_ptr,  # [N] float32
    counts_ptr,  # [N, V] int32
    seen_ptr,  # [N, V] bool
    bad_ptr,  # [N, V] or [V] bool
    bad_row_stride,  # V for [N, V], 0 for [V]
    part_ptr,  # [4, N, S] float32 out (+ [2, N])
    error_ptr,  # [1] int32
    n_rows,
    vocab,
    n_seg,
    HAS_PENALTIES: tl.constexpr,
    HAS_BAD_MASK: tl.constexpr,
    STORE_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    # One pass, all tail: the next kernel may be scheduled at once (gpu/kernels/dependent.py); so in the
    # other warp kernels, whose programs are few or short.
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    seg = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [R]
    cols = seg * BLOCK_V + tl.arange(0, BLOCK_V)  # [C]
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < vocab)[None, :]  # [R, C]
    offs = rows[:, None].to(tl.int64) * vocab + cols[None, :]  # [R, C]
    x = tl.load(logits_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
    broken = tl.max(tl.max(((x != x) | (x == float("inf"))).to(tl.int32), axis=1), axis=0)
    if broken > 0:
        tl.atomic_or(error_ptr, 1)  # ERROR_BAD_LOGITS
    if HAS_BAD_MASK:
        bad = tl.load(bad_ptr + rows[:, None].to(tl.int64) * bad_row_stride + cols[None, :], mask=mask, other=0)
        x = tl.where(bad != 0, float("-inf"), x)
    if HAS_PENALTIES:
        rep = tl.load(repetition_ptr + rows, mask=row_ok, other=1.0)[:, None]
        seen = tl.load(seen_ptr + offs, mask=mask, other=0)
        penalised = tl.where(x > 0, tl.math.div_rn(x, rep), x * rep)
        x = tl.where(seen != 0, penalised, x)
        count = tl.load(counts_ptr + offs, mask=mask, other=0).to(tl.float32)
        x = x - tl.load(frequency_ptr + rows, mask=row_ok, other=0.0)[:, None] * count
        x = x - tl.load(presence_ptr + rows, mask=row_ok, other=0.0)[:, None] * (count > 0).to(tl.float32)
    if STORE_L:
        tl.store(l_ptr + offs, x, mask=mask)
    temperature = tl.load(temperature_ptr + rows, mask=row_ok, other=1.0)
    temperature = tl.where(temperature > 0, temperature, 1.0)
    seg_max = tl.max(x, axis=1)  # [R]
    seg_arg = tl.argmax(x, axis=1, tie_break_left=True) + seg * BLOCK_V
    shifted = tl.math.div_rn(x - tl.where(seg_max > float("-inf"), seg_max, 0.0)[:, None], temperature[:, None])
    seg_sum = tl.sum(tl.exp(shifted), axis=1)  # exp(-inf) = 0 for masked ids
    seg_min = tl.min(tl.where(x > float("-inf"), x, float("inf")), axis=1)
    at = rows * n_seg + seg
    plane = n_rows * n_seg
    tl.store(part_ptr + at, seg_max, mask=row_ok)
    tl.store(part_ptr + plane + at, seg_sum, mask=row_ok)
    tl.store(part_ptr + 2 * plane + at, seg_min, mask=row_ok)
    tl.store(part_ptr + 3 * plane + at, seg_arg.to(tl.float32), mask=row_ok)


@triton.jit(do_not_specialize=["n_rows", "n_seg"])
def _warp_probs_kernel(
    probs_ptr,  # [N, V] float32: penalised logits in, warped probabilities out
    argmax_ptr,  # [N] int64 out
    temperature_ptr,  # [N] float32
    log_min_p_ptr,  # [N] float32 (HAS_CUT only)
    part_ptr,  # [4, N, S] float32 partials, then [2, N] cut, z
    error_ptr,  # [1] int32
    expo_ptr,  # [N, V] float32 Exp(1) draws (RACE)
    race_ptr,  # [N] int64 out: the race's ids (RACE)
    race_part_ptr,  # [2, N, S] float32 scratch: each segment's best p / E and its id (RACE)
    counter_ptr,  # [N] int32 arrivals per row, zero between calls (RACE)
    n_rows,
    vocab,
    n_seg,
    HAS_CUT: tl.constexpr,
    WRITE_PROBS: tl.constexpr,
    RACE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    seg = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [R]
    row_ok = rows < n_rows
    temperature = tl.load(temperature_ptr + rows, mask=row_ok, other=1.0)
    greedy = temperature == 0
    temperature = tl.where(greedy, 1.0, temperature)
    m, argmax, z, fmin = _row_stats(part_ptr, rows, row_ok, temperature, n_rows, n_seg, BLOCK_S)
    if seg == 0:
        tl.store(argmax_ptr + rows, argmax, mask=row_ok)
        masked = tl.max((row_ok & (m == float("-inf"))).to(tl.int32), axis=0)
        if masked > 0:
            tl.atomic_or(error_ptr, 2)  # ERROR_ALL_MASKED
    if WRITE_PROBS:
        cut = tl.zeros_like(m) + float("-inf")
        log_min_p = cut
        if HAS_CUT:
            plane = 4 * n_rows * n_seg
            cut = tl.load(part_ptr + plane + rows, mask=row_ok, other=float("-inf"))
            z = tl.load(part_ptr + plane + n_rows + rows, mask=row_ok, other=1.0)
            log_min_p = tl.load(log_min_p_ptr + rows, mask=row_ok, other=float("-inf"))
        cols = seg * BLOCK_V + tl.arange(0, BLOCK_V)
        mask = row_ok[:, None] & (cols < vocab)[None, :]
        offs = rows[:, None].to(tl.int64) * vocab + cols[None, :]
        l = tl.load(probs_ptr + offs, mask=mask, other=float("-inf"))
        s = tl.math.div_rn(l - m[:, None], temperature[:, None])
        keep = (l >= cut[:, None]) & (s >= log_min_p[:, None]) & (l > float("-inf"))
        p = tl.where(keep, tl.math.div_rn(tl.exp(s), z[:, None]), 0.0)
        p = tl.where(greedy[:, None], 0.0, p)
        tl.store(probs_ptr + offs, p, mask=mask)
        if RACE:
            _race_segment(p, expo_ptr, offs, mask, cols, rows, row_ok, greedy, argmax, seg, n_rows, n_seg,
                          race_ptr, race_part_ptr, counter_ptr, BLOCK_S)
        # greedy rows are one-hot: the program holding the argmax column writes its 1 after the zeros
        # (no [R] -> [R, C] broadcast of the argmax: Triton 3.6 routes integer columns through a
        # thread-per-row layout, each thread then holding the whole tile)
        tl.debug_barrier()
        owner = row_ok & greedy & (argmax // BLOCK_V == seg)
        tl.store(probs_ptr + rows.to(tl.int64) * vocab + argmax, tl.full([BLOCK_R], 1.0, tl.float32), mask=owner)



@triton.jit
def _race_segment(p, expo_ptr, offs, mask, cols, rows, row_ok, greedy, argmax, seg, n_rows, n_seg,
                  race_ptr, race_part_ptr, counter_ptr, BLOCK_S: tl.constexpr):
    """sample_race inside the probs kernel: this segment's best p / E (IEEE division, first id among
    equal values) goes to the scratch; the row's last program to arrive (an acq_rel counter) picks
    the best segment, the first one among equal values, and resets the counter. Greedy rows (one-hot
    probs) race to their argmax."""
    e = tl.load(expo_ptr + offs, mask=mask, other=1.0)
    r = tl.where(mask, tl.math.div_rn(p, e), -1.0)  # [R, C]
    best = tl.max(r, axis=1)  # [R]
    first = tl.min(tl.where(r == best[:, None], cols[None, :], 2147483647), axis=1)
    at = rows * n_seg + seg
    plane = n_rows * n_seg
    tl.store(race_part_ptr + at, best, mask=row_ok)
    tl.store(race_part_ptr + plane + at, first.to(tl.float32), mask=row_ok)
    tl.debug_barrier()  # every thread's stores before the release (threadfence-reduction pattern)
    arrived = tl.atomic_add(counter_ptr + rows, 1, mask=row_ok, sem="acq_rel")  # [R]
    last = row_ok & (arrived == n_seg - 1)
    tl.debug_barrier()  # the acquire before any thread of the last program reads the scratch
    if tl.max(last.to(tl.int32), axis=0) > 0:
        segs = tl.arange(0, BLOCK_S)
        smask = last[:, None] & (segs < n_seg)[None, :]
        sat = rows[:, None] * n_seg + segs[None, :]
        values = tl.load(race_part_ptr + sat, mask=smask, other=-2.0, cache_modifier=".cg")  # [R, S]
        ids = tl.load(race_part_ptr + plane + sat, mask=smask, other=0.0, cache_modifier=".cg")
        top = tl.max(values, axis=1)
        won = tl.min(tl.where(values == top[:, None], ids, 3.0e38), axis=1).to(tl.int64)
        tl.store(race_ptr + rows, tl.where(greedy, argmax, won), mask=last)
        tl.store(counter_ptr + rows, tl.zeros_like(arrived), mask=last)


# Triton made interpreted functions, not JITFunctions, when TRITON_INTERPRET was set as this module
# was imported (CPU tests): tile sizes follow.
INTERPRETED = not isinstance(_warp_stats_kernel, JITFunction)
