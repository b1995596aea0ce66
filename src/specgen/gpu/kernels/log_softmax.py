"""log_softmax over a few long rows: a token tree's log q at each level of a greedy tree
(core/sampling/warp.logprobs_from_logits, the reference: torch.log_softmax of the penalised logits).

Why: torch's softmax kernel takes one block per row, so a level's w rows over a 128k vocabulary
ran on w SMs: about 30 µs a level on an H200, 0.18 ms of a Llama 3.1 8B + EAGLE-3 head round of
six levels, which a chain round does not pay (its drafts are argmaxes); here a row is spread over
chunks, 28 µs a round (docs/benchmarks.md, "Trees drafted by an EAGLE-3 head (H200)").

_lse_part_kernel, grid (rows, chunks): the chunk's max m and sum of exp(x - m) (0 where the chunk
is all -inf). _log_softmax_kernel, grid (rows, chunks): the row's log-sum-exp from its chunks'
partials, merged in chunk order (M = max m, S = sum s exp(m - M), lse = M + log S), then its chunk
of x - lse. A row all -inf gives NaN, as torch's does.

Not bitwise torch's: exp and log differ between torch, numpy (the interpreter) and CUDA in the last
bit, and the sum's order is the chunks'. The values agree within float32 rounding of the
log-sum-exp (tests/gpu/kernels/test_log_softmax.py); the tree is built from these values on the
backend that computed them, and only its shape depends on them, never the text (greedy and
Gumbel walks) or the law of a sampled one (its q is what the children were drawn from).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous
from specgen.gpu.workspace import Workspace

# columns per program: compiled, 32 chunks of a 128k vocabulary (a level's few rows fill the SMs);
# interpreted, one program a row (each program costs Python time)
CHUNK = {False: 4096, True: 1 << 18}


def log_softmax(x: torch.Tensor, workspace: Workspace, dependent: bool = False,
                chunk: int | None = None) -> torch.Tensor:
    """torch.log_softmax(x, -1) of float32 rows x [R, V] (contiguous), in two launches; a new
    tensor. dependent: both launches dependent on the kernel before (gpu/kernels/dependent.py).
    chunk: columns per program (tests: the merge over many chunks in the interpreter)."""
    rows, vocab = x.shape
    assert x.dtype == torch.float32 and x.stride(-1) == 1, "log_softmax: float32 rows, contiguous"
    block = min(chunk or CHUNK[INTERPRETED], triton.next_power_of_2(vocab))
    chunks = triton.cdiv(vocab, block)
    part = workspace.scratch("log_softmax_part", 2 * rows * chunks)
    out = torch.empty(rows, vocab, dtype=x.dtype, device=x.device)
    launch = dict(DEPENDENT=dependent, **launch_options(dependent))
    _lse_part_kernel[(rows, chunks)](x, part, vocab, x.stride(0), chunks, BLOCK=block, num_warps=4, **launch)
    _log_softmax_kernel[(rows, chunks)](x, part, out, vocab, x.stride(0), out.stride(0), chunks, BLOCK=block,
                                        BLOCK_C=max(16, triton.next_power_of_2(chunks)), num_warps=4, **launch)
    return out


@triton.jit
def _lse_part_kernel(x_ptr, part_ptr, vocab, stride, chunks, BLOCK: tl.constexpr, DEPENDENT: tl.constexpr):
    """Program (row, chunk): part[row, chunk] = (max, sum exp(x - max)) of its chunk; (-inf, 0) for
    a chunk of -inf only."""
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < vocab, other=float("-inf"))
    m = tl.max(x, axis=0)
    s = tl.sum(tl.where(x > float("-inf"), tl.exp(x - m), 0.0), axis=0)
    slot = part_ptr + (row * chunks + chunk) * 2
    tl.store(slot, m)
    tl.store(slot + 1, s)


@triton.jit
def _log_softmax_kernel(x_ptr, part_ptr, out_ptr, vocab, stride, out_stride, chunks, BLOCK: tl.constexpr,
                        BLOCK_C: tl.constexpr, DEPENDENT: tl.constexpr):
    """Program (row, chunk): the row's log-sum-exp from every chunk's partials (each program of the
    row computes the same value), then out = x - lse over its chunk."""
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    c = tl.arange(0, BLOCK_C)
    c_ok = c < chunks
    m = tl.load(part_ptr + (row * chunks + c) * 2, mask=c_ok, other=float("-inf"))
    s = tl.load(part_ptr + (row * chunks + c) * 2 + 1, mask=c_ok, other=0.0)
    top = tl.max(m, axis=0)
    total = tl.sum(tl.where(m > float("-inf"), s * tl.exp(m - top), 0.0), axis=0)
    lse = top + tl.log(total)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = cols < vocab
    x = tl.load(x_ptr + row * stride + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * out_stride + cols, x - lse, mask=ok)


# Triton made interpreted functions, not JITFunctions, when TRITON_INTERPRET was set as this module
# was imported (CPU tests): chunk sizes follow.
INTERPRETED = not isinstance(_lse_part_kernel, JITFunction)
