"""The top-w of long rows: a token tree's children (core/round/tree.draw_children, the reference),
spread over chunks of a row, then merged.

Why: torch.topk over the vocabulary (gatherTopK) was the tree round's largest item on an H200,
about 186 µs of its 0.99 ms for a k = 4, width-2 tree over a 32k vocabulary (4 launches: the
root's [1, V], each level's [w, V]), and it promises no order among equal keys, which the tree's
children need (a row's masked ids all tie at -inf).

The order: the larger key first, equal keys by the lower id. _topw_chunk_kernel, grid (rows,
chunks): its chunk's w best (key, id) pairs in that order, by w passes over the chunk held in
registers; each pass takes, among the ids after the previous winner in the order (a smaller key,
or an equal key and a larger id), the max key and the lowest id holding it. Nothing is masked out
by value, so -inf keys stay candidates and tie like any others; columns past V are never
candidates (a chunk short of w real ids pads with (-inf, NONE), after every real id in the
order). _topw_merge_kernel, grid (rows,): the same w passes over the chunks' candidates (a row's
top-w are each within their chunk's top-w), then log q at the winners.

Keys: log q, or with Exp(1) noise E log q − log E. log E is torch.log into the workspace, as the
reference computes it: neither the interpreter's log (numpy's) nor the compiled one is torch's
bit for bit (numpy's float32 log differs from torch's CPU log in the last bit on ~20% of inputs);
the subtraction is here, one float32 operation as torch does it, so the keys are the reference's.
Keys are never NaN (the warp rejects NaN logits; E > 0 is finite).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous
from specgen.gpu.workspace import Workspace

# top_w(): columns per program (compiled: 16 chunks of a 32k vocabulary, enough programs for the
# GPU's SMs at a few rows; interpreted: one program a row, where each program costs Python time)
# and warps per chunk program; W is at most MAX_W (the passes are unrolled)
TOPW_CHUNK = {False: 2048, True: 1 << 18}
TOPW_WARPS = 4
MAX_W = 8
NONE = tl.constexpr(2147483647)  # the id of no candidate: after every real id


def top_w(logq: torch.Tensor, noise: torch.Tensor | None, w: int, workspace: Workspace, dependent: bool = False,
          chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """core/round/tree.draw_children: (tokens [R, w] int64, log q at them [R, w] float32) of log q
    [R, V] float32, its top-w or with noise [R or 1, V] the top-w of log q − log E, larger first,
    ties to the lower id. The outputs are workspace buffers, valid until the next call. dependent:
    both launches dependent on the kernel before (gpu/kernels/dependent.py). chunk: columns per
    program (tests: the merge over many chunks in the interpreter)."""
    rows, vocab = logq.shape
    assert logq.dtype == torch.float32 and logq.stride(-1) == 1, "top_w: float32 rows, contiguous"
    assert 1 <= w <= min(MAX_W, vocab), f"top_w: w={w} outside 1 .. {min(MAX_W, vocab)}"
    block = min(chunk or TOPW_CHUNK[INTERPRETED], triton.next_power_of_2(vocab))
    n_chunks = triton.cdiv(vocab, block)
    if noise is not None:
        assert noise.shape[-1] == vocab and noise.shape[0] in (1, rows), "top_w: noise [R or 1, V]"
        log_noise = workspace.scratch("topw_log_noise", noise.numel())[: noise.numel()].view(noise.shape)
        torch.log(noise, out=log_noise)
        noise_stride = 0 if noise.shape[0] == 1 else vocab
    else:
        log_noise, noise_stride = logq, 0  # not read
    keys = workspace.scratch("topw_keys", rows * n_chunks * w)
    ids = workspace.scratch("topw_ids", rows * n_chunks * w, torch.int32)
    tokens = workspace.scratch("topw_tokens", rows * w, torch.int64)[: rows * w].view(rows, w)
    values = workspace.scratch("topw_values", rows * w)[: rows * w].view(rows, w)
    _topw_chunk_kernel[(rows, n_chunks)](logq, log_noise, keys, ids, vocab, logq.stride(0), noise_stride, n_chunks,
                                         W=w, NOISE=noise is not None, BLOCK=block, DEPENDENT=dependent,
                                         num_warps=TOPW_WARPS, **launch_options(dependent))
    _topw_merge_kernel[(rows,)](keys, ids, logq, tokens, values, vocab, logq.stride(0), n_chunks * w, W=w,
                                BLOCK_C=max(16, triton.next_power_of_2(n_chunks * w)), DEPENDENT=dependent,
                                num_warps=1, **launch_options(dependent))
    return tokens, values


@triton.jit
def _topw_chunk_kernel(logq_ptr, log_noise_ptr, keys_ptr, ids_ptr, vocab, stride, noise_stride, n_chunks,
                       W: tl.constexpr, NOISE: tl.constexpr, BLOCK: tl.constexpr, DEPENDENT: tl.constexpr):
    """Program (row, chunk): the chunk's W best (key, id), best first, into keys/ids [rows, chunks, W]."""
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    real = cols < vocab
    key = tl.load(logq_ptr + row * stride + cols, mask=real, other=float("-inf"))
    if NOISE:
        key = key - tl.load(log_noise_ptr + row * noise_stride + cols, mask=real, other=0.0)
    out = (row * n_chunks + chunk) * W
    prev_key = float("inf")  # before every key: the first pass takes the chunk's best
    prev_id = -1
    for i in tl.static_range(W):
        after = real & ((key < prev_key) | ((key == prev_key) & (cols > prev_id)))
        best = tl.max(tl.where(after, key, float("-inf")), axis=0)
        pick = tl.min(tl.where(after & (key == best), cols, NONE), axis=0)
        tl.store(keys_ptr + out + i, best)
        tl.store(ids_ptr + out + i, pick)
        prev_key = best
        prev_id = pick


@triton.jit
def _topw_merge_kernel(keys_ptr, ids_ptr, logq_ptr, tokens_ptr, values_ptr, vocab, stride, n_cand,
                       W: tl.constexpr, BLOCK_C: tl.constexpr, DEPENDENT: tl.constexpr):
    """Program row: the W best of its chunks' candidates, best first, and log q at each."""
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    ok = c < n_cand
    key = tl.load(keys_ptr + row * n_cand + c, mask=ok, other=float("-inf"))
    ids = tl.load(ids_ptr + row * n_cand + c, mask=ok, other=NONE)
    prev_key = float("inf")
    prev_id = -1
    for i in tl.static_range(W):
        after = (key < prev_key) | ((key == prev_key) & (ids > prev_id))
        best = tl.max(tl.where(after, key, float("-inf")), axis=0)
        pick = tl.min(tl.where(after & (key == best), ids, NONE), axis=0)
        tl.store(tokens_ptr + row * W + i, pick.to(tl.int64))
        # pick is a real id: a row holds at least W of them (the wrapper's w <= V)
        tl.store(values_ptr + row * W + i, tl.load(logq_ptr + row * stride + pick, mask=pick < vocab,
                                                   other=float("-inf")))
        prev_key = best
        prev_id = pick


# Triton made interpreted functions, not JITFunctions, when TRITON_INTERPRET was set as this module
# was imported (CPU tests): tile sizes follow.
INTERPRETED = not isinstance(_topw_chunk_kernel, JITFunction)
