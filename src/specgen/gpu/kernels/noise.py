"""Gumbel coupling's uniforms in one Triton kernel, equal bit for bit to core/sampling/noise.uniform.

One program per (row, block of ids) evaluates Philox4x32-10 at counter (id, position, 0) under the
seed's key. The 32 x 32-bit products are taken in uint64, so no multiply-high and no sign rules
are involved; every value stays below 2**64. The key and the first position are read from device
tensors, so a captured round replays with the request's seed and its own positions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.core.sampling import noise
from specgen.gpu.kernels.dependent import launch_options

BLOCK = 1024


def uniform_(out: torch.Tensor, key: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """out [rows, width] float32 <- core/sampling/noise.uniform(key, first, rows, width)."""
    rows, width = out.shape
    assert out.dtype == torch.float32 and out.is_contiguous()
    assert key.dtype == torch.int64 and key.numel() == 2 and first.dtype == torch.int64
    _uniform_kernel[(rows, triton.cdiv(width, BLOCK))](
        out, key, first, width, rows,
        MASK=noise.MASK32, M0=noise.MULTIPLIER_0, M1=noise.MULTIPLIER_1,
        STEP0=noise.KEY_STEP_0, STEP1=noise.KEY_STEP_1, ROUNDS=noise.ROUNDS, BLOCK=BLOCK, **launch_options(False),
    )
    return out


def uniform_rows_(out: torch.Tensor, key: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """out [B, rows, width] float32 <- core/sampling/noise.uniform_rows(key [B, 2], first [B], rows, width):
    one launch for a batch's sequences, each keyed by its own seed and positions."""
    batch, rows, width = out.shape
    assert out.dtype == torch.float32 and out.is_contiguous()
    assert key.dtype == torch.int64 and key.shape == (batch, 2) and key.is_contiguous()
    assert first.dtype == torch.int64 and first.shape == (batch,) and first.is_contiguous()
    _uniform_kernel[(batch * rows, triton.cdiv(width, BLOCK))](
        out, key, first, width, rows,
        MASK=noise.MASK32, M0=noise.MULTIPLIER_0, M1=noise.MULTIPLIER_1,
        STEP0=noise.KEY_STEP_0, STEP1=noise.KEY_STEP_1, ROUNDS=noise.ROUNDS, BLOCK=BLOCK, **launch_options(False),
    )
    return out


@triton.jit
def _uniform_kernel(out_ptr, key_ptr, first_ptr, width, per, MASK: tl.constexpr, M0: tl.constexpr, M1: tl.constexpr,
                    STEP0: tl.constexpr, STEP1: tl.constexpr, ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    seq = row // per  # the sequence whose key and first position the row takes (per: its rows)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < width
    k0 = tl.load(key_ptr + 2 * seq).to(tl.uint64)
    k1 = tl.load(key_ptr + 2 * seq + 1).to(tl.uint64)
    position = tl.load(first_ptr + seq) + row % per
    mask = tl.full((), MASK, tl.uint64)
    c0 = cols.to(tl.uint64)
    c1 = tl.zeros((BLOCK,), tl.uint64) + (position & MASK).to(tl.uint64)
    c2 = tl.zeros((BLOCK,), tl.uint64) + (position >> 32).to(tl.uint64)
    c3 = tl.zeros((BLOCK,), tl.uint64)
    for i in tl.static_range(ROUNDS):
        if i > 0:
            k0 = (k0 + tl.full((), STEP0, tl.uint64)) & mask
            k1 = (k1 + tl.full((), STEP1, tl.uint64)) & mask
        p0 = c0 * tl.full((), M0, tl.uint64)
        p1 = c2 * tl.full((), M1, tl.uint64)
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & mask, (p0 >> 32) ^ c3 ^ k1, p0 & mask
    u = ((c0 >> 8) + 1).to(tl.float32) * (1.0 / 16777216.0)
    tl.store(out_ptr + row * width + cols, u, mask=inside)
