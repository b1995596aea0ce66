"""argmax over long rows: a greedy draft's pick, spread over segments of a row, then merged.

_argmax_kernel, grid (rows, segments): each segment's max and its first index; a row of one
segment stores its argmax directly. _argmax_merge_kernel, grid (rows,): the first segment holding
the row's max (segments in column order) has the row's first index. Its reference is torch.argmax
(tests/gpu/kernels/test_warp_kernel.py); the warp chain's own argmax (gpu/kernels/warp.py) comes with its
probabilities.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous
from specgen.gpu.workspace import Workspace

# argmax(): columns per program (compiled: 16 segments of a 128,256 vocabulary; interpreted: one
# program a row, where each program costs Python time) and warps per program
ARGMAX_SEGMENT = {False: 8192, True: 1 << 18}
ARGMAX_WARPS = 8


def argmax(logits: torch.Tensor, out: torch.Tensor, workspace: Workspace, dependent: bool = False) -> torch.Tensor:
    """out [N] int64 = torch.argmax(logits [N, V], dim=-1): the first index of each row's maximum
    (on rows without NaN: torch's picks a NaN, this a number). Why not torch's: its reduction over one long row runs in
    few blocks (27.7 µs for one row of 128,256 on an H200, 4 times a round for a greedy draft);
    here each row is spread over segments of ARGMAX_SEGMENT columns, then merged. dependent:
    both launches dependent on the kernel before (gpu/kernels/dependent.py): a greedy draft phase is then
    one chain from each step's logits through its pick into the next step's inputs."""
    rows, vocab = logits.shape
    assert logits.stride(-1) == 1 and out.shape == (rows,) and out.dtype == torch.int64, "argmax's shapes"
    segment = ARGMAX_SEGMENT[INTERPRETED]
    n_seg = triton.cdiv(vocab, segment)
    part = workspace.scratch("argmax_part", 2 * rows * n_seg)  # max, then first index (exact below 2^24)
    _argmax_kernel[(rows, n_seg)](logits, part, out, vocab, logits.stride(0), n_seg, BLOCK=segment,
                                  DEPENDENT=dependent, num_warps=ARGMAX_WARPS, **launch_options(dependent))
    if n_seg > 1:
        _argmax_merge_kernel[(rows,)](part, out, n_seg, BLOCK_S=triton.next_power_of_2(n_seg), DEPENDENT=dependent,
                                      **launch_options(dependent))
    return out


@triton.jit
def _argmax_kernel(l_ptr, part_ptr, out_ptr, vocab, stride, n_seg, BLOCK: tl.constexpr, DEPENDENT: tl.constexpr):
    """Program (row, seg): the max of its columns and the first column holding it; a row of one
    segment stores its argmax directly."""
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    cols = seg * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(l_ptr + row * stride + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    best = tl.max(v, axis=0)
    # masked columns lie past every real one: a row of -inf still finds its first real column
    first = tl.min(tl.where(v == best, cols, 2147483647), axis=0)
    if n_seg == 1:
        tl.store(out_ptr + row, first.to(tl.int64))
    else:
        at = row * n_seg + seg
        tl.store(part_ptr + 2 * at, best)
        tl.store(part_ptr + 2 * at + 1, first.to(tl.float32))


@triton.jit
def _argmax_merge_kernel(part_ptr, out_ptr, n_seg, BLOCK_S: tl.constexpr, DEPENDENT: tl.constexpr):
    """Program row: the first segment holding the row's max (segments in column order) has its
    first index."""
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0).to(tl.int64)
    segs = tl.arange(0, BLOCK_S)
    ok = segs < n_seg
    at = row * n_seg + segs
    values = tl.load(part_ptr + 2 * at, mask=ok, other=float("-inf"))
    firsts = tl.load(part_ptr + 2 * at + 1, mask=ok, other=3.0e38)
    top = tl.max(values, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(ok & (values == top), firsts, 3.0e38), axis=0).to(tl.int64))


# Triton made interpreted functions, not JITFunctions, when TRITON_INTERPRET was set as this module
# was imported (CPU tests): tile sizes follow.
INTERPRETED = not isinstance(_argmax_kernel, JITFunction)
