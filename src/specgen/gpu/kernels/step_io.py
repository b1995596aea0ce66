"""A captured step's inputs and outputs, one kernel launch each (the step_io fusion of `[kernels]`).

Why: around its layers a step launched five small kernels: the positions (position + 0 .. n-1),
the embedding gather, the rotary table's gather, the copy of the logits into the runner's float32
buffer and the position's advance. Each is a launch gap of a microsecond or two; on a small draft
(the bench pair's: 25 kernels a step) they were a fifth of its launches, and what whole-step
torch.compile fused away. Here `inputs` writes the positions, the embedding rows (scaled, for
Gemma's embedding, which launched a multiplication of its own too) and the rotary rows in one
launch, and `finish` copies the logits and advances the position in another.

Every value is a copy (the float32 logits hold the model's dtype exactly) or, for Gemma's scale,
the product torch computes, so a step's logits are bit for bit those of the separate kernels.
Torch reference: gpu/kernels/reference.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous
from specgen.gpu.kernels.norm import rounded

BLOCK = 1024  # columns per program


def inputs(ids: torch.Tensor, position: torch.Tensor, positions: torch.Tensor, weight: torch.Tensor | None = None,
           embeds: torch.Tensor | None = None, table: torch.Tensor | None = None,
           rows: torch.Tensor | None = None, dependent: bool = False, scale: float | None = None,
           per: int | None = None, fill: bool = True) -> None:
    """positions[:n] = position + arange(n); with weight: embeds[:n] = weight[ids], times `scale`
    if given (Gemma's scaled embedding: each product in float32, rounded once to the weight's
    dtype, as torch multiplies two tensors of that dtype; `scale` is the scale in that dtype); with
    table ([capacity, R], the rows of a RotaryTable flattened): rows[:n] = table[positions[:n]].
    ids [n] int64 (B sequences' rows, `per` each: row r's position is position[r // per] + r % per,
    position [] or [B] int64), or with fill=False the positions as given (a tree's, read, not
    written); every buffer contiguous and at least n rows long.
    dependent: launched dependent on the kernel before (gpu/kernels/dependent.py), as `finish` too."""
    n = ids.shape[0]
    assert ids.dtype == position.dtype == positions.dtype == torch.int64 and positions.shape[0] >= n
    assert ids.is_contiguous() and positions.is_contiguous()
    per = per or max(n, 1)
    assert position.numel() in (1, triton.cdiv(n, per))
    width = 1
    if weight is not None:
        assert embeds is not None and embeds.dtype == weight.dtype and embeds.shape[0] >= n
        assert embeds.shape[-1] == weight.shape[1] and embeds.is_contiguous() and weight.stride(1) == 1
        width = max(width, weight.shape[1])
    if table is not None:
        assert rows is not None and rows.dtype == table.dtype and rows.shape[0] >= n
        assert table.dim() == rows.dim() == 2 and table.shape[1] == rows.shape[1]
        assert table.is_contiguous() and rows.is_contiguous()
        width = max(width, table.shape[1])
    if n == 0:
        return
    starts = position.reshape(-1)
    _inputs_kernel[(n, triton.cdiv(width, BLOCK))](
        ids, starts, positions,
        weight if weight is not None else positions, embeds if embeds is not None else positions,
        table if table is not None else positions, rows if rows is not None else positions,
        weight.shape[1] if weight is not None else 0, weight.stride(0) if weight is not None else 0,
        table.shape[1] if table is not None else 0, 1.0 if scale is None else float(scale),
        per, 0 if starts.numel() == 1 else starts.stride(0),
        EMBED=weight is not None, SCALED=scale is not None, ROWS=table is not None, FILL=fill, BLOCK=BLOCK,
        DEPENDENT=dependent, **launch_options(dependent),
    )


def finish(logits: torch.Tensor, out: torch.Tensor, position: torch.Tensor, advance: int,
           dependent: bool = False) -> None:
    """out[:, :cols] = logits[:, :cols] in float32 (cols = the narrower of the two), and
    position += advance. logits [n, V] with unit column stride, out [n, width] float32."""
    n, cols = logits.shape[0], min(logits.shape[1], out.shape[1])
    assert out.dtype == torch.float32 and out.shape[0] == n > 0 and cols > 0 and position.dtype == torch.int64
    assert logits.stride(1) == 1 and out.stride(1) == 1
    _finish_kernel[(n, triton.cdiv(cols, BLOCK))](
        logits, out, position, cols, logits.stride(0), out.stride(0), advance, BLOCK=BLOCK, DEPENDENT=dependent,
        **launch_options(dependent),
    )


@triton.jit
def _inputs_kernel(ids_ptr, position_ptr, positions_ptr, weight_ptr, embeds_ptr, table_ptr, rows_ptr,
                   hidden, weight_stride, row_width, scale, per, position_stride,
                   EMBED: tl.constexpr, SCALED: tl.constexpr, ROWS: tl.constexpr, FILL: tl.constexpr,
                   BLOCK: tl.constexpr, DEPENDENT: tl.constexpr):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    t = tl.program_id(0)
    block = tl.program_id(1)
    if FILL:
        at = tl.load(position_ptr + (t // per) * position_stride) + t % per
        if block == 0:
            tl.store(positions_ptr + t, at)
    else:
        at = tl.load(positions_ptr + t)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    if EMBED:
        token = tl.load(ids_ptr + t)
        ok = cols < hidden
        values = tl.load(weight_ptr + token * weight_stride + cols, mask=ok)
        if SCALED:
            values = rounded(values.to(tl.float32) * tl.cast(scale, tl.float32), values.dtype).to(values.dtype)
        tl.store(embeds_ptr + t * hidden + cols, values, mask=ok)
    if ROWS:
        ok = cols < row_width
        values = tl.load(table_ptr + at * row_width + cols, mask=ok)
        tl.store(rows_ptr + t * row_width + cols, values, mask=ok)


@triton.jit
def _finish_kernel(logits_ptr, out_ptr, position_ptr, cols, logits_stride, out_stride, advance,
                   BLOCK: tl.constexpr, DEPENDENT: tl.constexpr):
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0)
    block = tl.program_id(1)
    c = block * BLOCK + tl.arange(0, BLOCK)
    ok = c < cols
    values = tl.load(logits_ptr + row * logits_stride + c, mask=ok)
    tl.store(out_ptr + row * out_stride + c, values.to(tl.float32), mask=ok)
    if (row == 0) & (block == 0):
        tl.store(position_ptr, tl.load(position_ptr) + advance)
