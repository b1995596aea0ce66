"""A cache's compaction in one launch: core/step/ops.py's TorchOps.compact (the reference), which
moves the keys and values of slots src [B, m] to slots dst [B, m] in every layer, and the slots'
positions, reading every source before writing any destination (the two may overlap: a tree's
accepted path moves down onto slots it may have come from).

Why: the reference is an indexing pair per layer and per table, some 130 launches for a 32-layer
model, after every tree round. The cache's layers are views of one allocation (core/step/cache.py's
`planes` [2, L, B, g, S, d]), so one program per (table, layer, sequence, head) finds its plane by
stride: it loads its m source rows, waits for its threads (a barrier), then stores them; programs
own disjoint planes, so no program reads what another writes. One more program moves the
positions. Bits are copied, never converted: equal to the reference in every dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous


def compact(planes: torch.Tensor, positions: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
            dependent: bool = False) -> None:
    """planes [2, L, B, g, S, d] (a SlotCache's, on one device), positions [B, S] int64; src and dst
    [b, m] int64 slots of the first b <= B sequences."""
    _, layers, batch, heads, slots, dim = planes.shape
    rows, m = src.shape
    assert planes.is_contiguous() and positions.shape == (batch, slots) and positions.is_contiguous()
    assert dst.shape == src.shape and src.dtype == dst.dtype == torch.int64 and rows <= batch
    assert src.device == dst.device == planes.device == positions.device
    if m == 0:
        return
    _compact_kernel[(2 * layers * rows * heads + 1,)](
        planes, positions, src.contiguous(), dst.contiguous(), batch, rows, heads, slots, m, dim,
        M_BLOCK=max(2, triton.next_power_of_2(m)), D_BLOCK=max(16, triton.next_power_of_2(dim)),
        DEPENDENT=dependent, num_warps=1, **launch_options(dependent),
    )


@triton.jit(do_not_specialize=["batch", "rows", "heads", "slots", "m"])
def _compact_kernel(
    planes_ptr,  # [2 L, B, g, S, d] any dtype
    positions_ptr,  # [B, S] int64
    src_ptr,  # [b, m] int64
    dst_ptr,  # [b, m] int64
    batch,
    rows,  # b: the sequences moved
    heads,
    slots,
    m,
    dim,
    M_BLOCK: tl.constexpr,
    D_BLOCK: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    pid = tl.program_id(0)
    last = tl.num_programs(0) - 1
    r = tl.arange(0, M_BLOCK)
    on = r < m
    if pid < last:  # one plane: (table, layer) = pid // (b g), sequence and head from the rest
        table = pid // (rows * heads)
        seq = (pid // heads) % rows
        head = pid % heads
        plane = ((table.to(tl.int64) * batch + seq) * heads + head) * slots * dim
        src = tl.load(src_ptr + seq * m + r, mask=on, other=0)
        dst = tl.load(dst_ptr + seq * m + r, mask=on, other=0)
        cols = tl.arange(0, D_BLOCK)[None, :]
        inside = on[:, None] & (cols < dim)
        moved = tl.load(planes_ptr + plane + src[:, None] * dim + cols, mask=inside)
        tl.debug_barrier()  # every source row read before any destination row is written
        tl.store(planes_ptr + plane + dst[:, None] * dim + cols, moved, mask=inside)
    else:  # the slots' positions, a sequence at a time
        for s in range(rows):  # names apart from the branch above's (an if's two sides yield their common names)
            row = positions_ptr + s * slots  # B S < 2^31
            here = tl.load(row + tl.load(src_ptr + s * m + r, mask=on, other=0), mask=on)
            tl.debug_barrier()
            tl.store(row + tl.load(dst_ptr + s * m + r, mask=on, other=0), here, mask=on)
