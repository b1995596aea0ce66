"""Linear layers for decode and verification steps: a Triton kernel that streams each weight once.

Why: a decode step of a large target reads every weight once, so its floor is weight bytes over
memory bandwidth. cuBLAS picks different kernels for 1 row and for the 5 rows of a k = 4
verification, and neither reaches the floor on a Llama-3-8B shape on an H200
(`git show 1b54921:docs/benchmarks.md`, "Linear and attention kernels"). Here one program owns
BLOCK_N output columns and a tile of rows, walks K once, and multiplies each weight tile by every
row of its tile while it is loaded, so 5 rows cost what 1 row costs.

Row invariance (bit-exact greedy decoding): a row's output is computed the same way whatever the
number of rows in the call, so a (k+1)-row verification gives each row bitwise the logits of the
one-row step at that position. The configuration is picked by shape (N, K, gated), never by the row
count (gpu/tuning/linear_table.py). Tensor-core configurations (DOT) cut rows into tiles of 16, 32
or 64 rows (tile_rows: by the call's row count), each tile one program along the grid's first axis;
split-K sums the chunks in chunk order. A row's products are the same tensor-core sums over the
same K tiles in the same order whatever the tile's height: on an H200 every row of 16-, 32- and
64-row tiles is bitwise the one-row call's, for every projection of Llama-3-8B with split-K off and
on (benchmarks/bench_kernels.py `tiles`; tests/gpu/kernels/test_exact.py checks it on each GPU).
Why the taller tiles: each tile reads the weights again (from L2 after the first), so a tree's 33
rows in three 16-row tiles cost what 64 rows cost (q/o: 19.8 against 12.8 µs in one 64-row tile).
Calls of more than 32 rows may take a launch from the table instead of the configuration's tile:
other tile rows (up to 128), BLOCK_N, BLOCK_K, warps and stages, the same chunks of K, so the same
sums (gpu/tuning/linear_table.py). Why: a configuration is chosen at 1 and 5 rows, where a 64-row
tile of it is not the fastest spread of 80 (Llama-3-8B gate/up 104 µs in two 64-row tiles of its
pick, 71 in one 128-row tile of BLOCK_N 64, BLOCK_K 64, 8 warps; docs/benchmarks.md, "Launches for
tall calls (H200)").

Matrix-vector configurations (not DOT, `_gemv_kernel`): a program owns BLOCK_N columns over the
whole of K, issues the loads of all its weights at once (K in BLOCK_K pieces, unrolled), multiplies
them by one row in float32 element by element and reduces once; further rows repeat the same code
one after another, reading the weights again from L1 or L2. Why: a 1B-class draft's projections
are 4 to 34 MB, 1 to 8 µs of memory time, and a tensor-core tile walking K with split-K's handoff
adds 2 to 3 µs of latency to each (loop start-up, the partials' store, the arrival counter, the
last program's loads); here a program is one round trip to memory and one reduction, with no
split-K (`git show 1b54921:docs/benchmarks.md`, "Matrix-vector projections (H200)").

Split-K (a configuration's 6th entry): K in chunks, one program per chunk, row tile and column
block, each storing a float32 partial; the last program of a (row tile, column block) to finish (an
arrival counter each, reset by that program) sums the partials in chunk order and applies the
epilogue. More programs in flight per column for the shapes whose column blocks barely fill the GPU.

`gate_up` fuses the MLP's two input projections and its activation: act(x W_g^T) * (x W_u^T), one
pass over both weights with no [rows, 2 x intermediate] round trip; the rounding steps of the
unfused module (each projection, the activation, the product in the model's dtype) are kept.

Torch references: gpu/kernels/reference.py. Calls from a model step: gpu/ops.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

# BATCH_ROWS, the most rows one call takes: a batch's verification step, B x (k + 1) rows, or a group
# of prompts' prefill chunks, through the same kernel so that each row gets the bits it gets in a
# one-request step (core/round/batch_round.py, core/round/batch_prefill.py)
from specgen.core.step.ops import BATCH_ROWS
from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous
from specgen.gpu.tuning.linear_table import TILES, LinearTable, chunk_width, keeps_sums, packaged
from specgen.gpu.kernels.norm import rounded
from specgen.gpu.workspace import Workspace

# The rows of a captured step (gpu/runner.py's MAX_GRAPH_TOKENS): prefill chunks too, so a prompt's
# cache is computed the same way whichever captured shape a prefill replays.
MAX_ROWS = 64
DOT_ROWS = 16  # rows per tensor-core tile, at least
TILE_ROWS = 64  # at most: calls of more rows take several tiles
ACTIVATIONS = {"silu": 1, "gelu_pytorch_tanh": 2, "gelu_tanh": 2}  # HF hidden_act -> kernel code
# Rows one matrix-vector program computes one after another (its weights loaded once from memory):
# a verification's k + 1 rows in one program per column block, a prefill chunk in a few.
GEMV_ROWS = 8
# Columns a program at least takes in the Triton interpreter (CPU tests): see run()
INTERPRETED_COLUMNS = 128
# sm_90's shared memory a block may take (227 KiB): the table's configurations are tuned for 16-bit
# weights; a float32 model's tiles are twice as large and may need fewer pipeline stages to fit.
SHARED_BYTES = 232448
COUNTER_SLOTS = 1 << 16  # split-K arrival counters: (row tile, column block) pairs of one call at most


def split_k_counters(workspace: Workspace) -> torch.Tensor:
    """The device's split-K arrival counters (int32, zero between calls: the last program of each
    row tile and column block resets its own). Calls on a device run in stream order, so one buffer
    serves them all; runners take it before any capture or compile, so graphs hold that one."""
    return workspace.zeros("linear_split_k", COUNTER_SLOTS, torch.int32)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: tuple | None = None,
           *, split_k: bool = False, counters: torch.Tensor | None = None,
           table: LinearTable | None = None, residual: torch.Tensor | None = None,
           dependent: bool = False) -> torch.Tensor:
    """F.linear for inputs of at most BATCH_ROWS rows (a captured step's: MAX_ROWS): x [..., K], weight [N, K] -> [..., N].
    config: forced, else table's (packaged()'s) pick for the shape; split_k: allow split-K
    configurations (they need `counters`, split_k_counters(workspace)); residual [..., N]: return
    residual + F.linear(x, weight, bias), the sum in x's dtype as a decoder layer's add computes
    it (one launch fewer than the add after the projection); dependent: launch it dependent on the
    kernel before (gpu/kernels/dependent.py)."""
    return _launch(x, weight, None, bias, 0, config, split_k, counters, table, residual, dependent)


def gate_up(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str, config: tuple | None = None,
            *, split_k: bool = False, counters: torch.Tensor | None = None,
            table: LinearTable | None = None, dependent: bool = False) -> torch.Tensor:
    """act(x gate^T) * (x up^T) with the rounding of the unfused module: x [..., K] -> [..., N]."""
    return _launch(x, gate, up, None, ACTIVATIONS[activation], config, split_k, counters, table, None, dependent)


def _launch(x, weight, up, bias, act, config, split_k, counters, table, residual, dependent):
    n, k = weight.shape
    table = table or packaged()
    rows = x.numel() // k if k else 1
    config = config or table.pick(n, k, act > 0, split_k, rows)
    launch = table.launch(n, k, act > 0, config, rows) if x.element_size() <= 2 else None
    return run(x, weight, up, bias, act, config, counters, residual, dependent, launch=launch)


def tile_rows(rows: int) -> int:
    """A tensor-core tile's rows for a call of `rows` rows: the least of 16, 32 and 64 that holds
    them (64 above). A row's bits do not depend on it (module docstring); a call's time does: a
    64-row tile costs more than a 16-row one at 1 row with split-K (16.7 against 12.3 µs, Llama-3-8B
    q/o, H200) and less than several 16-row ones."""
    return min(TILE_ROWS, max(DOT_ROWS, triton.next_power_of_2(rows)))


def fitting_stages(stages: int, block_n: int, block_k: int, gated: bool, itemsize: int,
                   block_m: int = DOT_ROWS) -> int:
    """Pipeline stages that fit SHARED_BYTES. 16-bit tiles (tensor-core products): a tile of x (one
    copy per product: two for gate_up) and of the weight(s) per stage; a 64-row gate_up tile of (64,
    128) at 4 stages asked for 4 x (2 x 64 + 2 x 64) x 128 x 2 = 262,144 bytes on an H200. float32
    tiles (products without tensor cores): stages - 1 tiles of x and of the weight(s), which the 8B
    picks' float32 launches fit. Stages change when tiles load, never what is summed."""
    weights = block_n * (2 if gated else 1)
    if itemsize == 2:
        need = lambda s: s * ((2 if gated else 1) * block_m + weights) * block_k * itemsize  # noqa: E731
    else:
        need = lambda s: (s - 1) * (block_m + weights) * block_k * itemsize  # noqa: E731
    while stages > 2 and need(stages) > SHARED_BYTES:
        stages -= 1
    return stages


def run(x, weight, up, bias, act, config, counters, residual, dependent, tile: int | None = None,
        launch: tuple | None = None):
    """One launch with a picked configuration; tile: a tensor-core tile's rows, 16, 32 or 64
    (tile_rows()'s when None; benchmarks/bench_kernels.py `tiles` forces each); launch: (tile rows,
    BLOCK_N, BLOCK_K, warps, stages) in place of the configuration's tile, keeping its sums (16-bit
    tensor-core calls: gpu/tuning/linear_table.py's launches)."""
    n, k = weight.shape
    lead = x.shape[:-1]
    assert x.shape[-1] == k, f"x has {x.shape[-1]} columns, weight {k}"
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    assert rows <= BATCH_ROWS and weight.ndim == 2 and weight.stride(-1) == 1
    assert bias is None or (bias.shape == (n,) and bias.is_contiguous())
    if residual is not None:
        assert residual.shape == (*lead, n) and residual.dtype == x.dtype, "residual and output differ in shape or dtype"
        residual = residual.reshape(rows, n)
        if residual.stride(-1) != 1:
            residual = residual.contiguous()
    dot, block_n, block_k, warps, stages, *rest = config
    # the chunks' boundaries are the configuration's whatever the launch: a row's sums are its
    k_chunk = chunk_width(k, config)
    if launch is not None and dot and x.element_size() <= 2:
        assert keeps_sums(k, config, launch), f"{launch} does not keep the sums of {config}"
        tile, block_n, launch_k, warps, stages = launch
        # The interpreter sums a tile's products per row with numpy, whose order follows BLOCK_K:
        # there the configuration's BLOCK_K stays (a tensor core's sums do not depend on it, which
        # the cuda tests check)
        block_k = block_k if INTERPRETED else launch_k
    if INTERPRETED:
        # The interpreter's time is per program and operation, not per element: a call's columns in
        # a few programs (INTERPRETED_COLUMNS each) rather than the GPU's narrow blocks. A row's sums
        # run over K alone, in the same pieces and order whatever the block's columns.
        block_n = max(block_n, min(INTERPRETED_COLUMNS, triton.next_power_of_2(n)))
    # float32 models (the bench's float32 check, tests) keep 16-row tiles: their products do not use
    # tensor cores, so taller tiles buy little, and their stages' shared memory was measured at 16 rows
    block_m = tile or (tile_rows(rows) if x.element_size() <= 2 else DOT_ROWS)
    assert block_m in TILES, f"{block_m} rows a tile"
    if dot:
        stages = fitting_stages(stages, block_n, block_k, up is not None, x.element_size(), block_m)
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    second = up if up is not None else weight
    assert second.shape == weight.shape and second.stride() == weight.stride()
    if not dot:
        assert not rest or rest[0] == 1, f"{config}: matrix-vector configurations do not split K"
        groups = triton.cdiv(rows, GEMV_ROWS)
        _gemv_kernel[(triton.cdiv(n, block_n) * groups,)](
            x2, weight, second, bias if bias is not None else weight, residual if residual is not None else out, out,
            rows, n, k, groups, x2.stride(0), weight.stride(0), out.stride(0),
            residual.stride(0) if residual is not None else 0,
            HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, ACT=act, EVEN_K=k % block_k == 0,
            BLOCK_N=block_n, BLOCK_K=block_k, PIECES=triton.cdiv(k, block_k), ROWS=GEMV_ROWS, DEPENDENT=dependent,
            num_warps=warps, num_stages=1, **launch_options(dependent),
        )
        return out.reshape(*lead, n)
    tiles = triton.cdiv(rows, block_m)
    columns = triton.cdiv(n, block_n)
    chunks = triton.cdiv(k, k_chunk)  # chunks of whole tiles: every chunk has columns of K
    if chunks > 1:
        assert counters is not None and counters.dtype == torch.int32 and counters.numel() >= columns * tiles
        part = torch.empty(2 if act else 1, chunks, tiles * block_m, n, dtype=torch.float32, device=x.device)
    else:
        part = counters = out  # unused
    _linear_kernel[(columns * tiles, chunks)](
        x2, weight, second, bias if bias is not None else weight, residual if residual is not None else out, out,
        part, counters, rows, n, k, k_chunk, tiles, x2.stride(0), weight.stride(0), out.stride(0),
        residual.stride(0) if residual is not None else 0,
        # The interpreter's tl.dot is numpy's matmul, whose result for a row depends on where the row
        # sits in the matrix (OpenBLAS's micro-kernels): there a tile's products are summed per row
        # instead, so the CPU tests see the row invariance that tensor cores give (the cuda tests
        # check those).
        HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, ACT=act, EVEN_K=k % block_k == 0, DOT=not INTERPRETED,
        # float32 products without TF32 for float32 models
        F32_DOT=x.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=chunks, DEPENDENT=dependent,
        num_warps=warps, num_stages=stages, **launch_options(dependent),
    )
    return out.reshape(*lead, n)


@triton.jit
def _act(g, ACT: tl.constexpr):
    if ACT == 1:  # silu
        return g / (1.0 + tl.exp(-g))
    else:  # gelu, tanh approximation; tanh(z) = 2 sigmoid(2z) - 1
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        return g * (1.0 - 1.0 / (1.0 + tl.exp(2.0 * z)))


@triton.jit
def _linear_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    u_ptr,  # [N, K] the up projection when ACT > 0 (else w_ptr again, unread)
    b_ptr,  # [N] when HAS_BIAS
    r_ptr,  # [M, N] added to the output when HAS_RESIDUAL
    out_ptr,  # [M, N]
    part_ptr,  # [2 if ACT else 1, SPLIT_K, tiles x BLOCK_M, N] float32 partial sums (SPLIT_K > 1)
    count_ptr,  # [>= column blocks x tiles] int32 arrivals, zero on entry and on exit (SPLIT_K > 1)
    M, N, K, k_chunk, tiles, sxm, swn, som, srm,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr, F32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Program (c * tiles + t, s) computes rows [t * BLOCK_M, (t + 1) * BLOCK_M) of out[:, c * BLOCK_N :
    (c + 1) * BLOCK_N] over K (SPLIT_K == 1) or over its s-th chunk of k_chunk columns of K, one
    weight tile at a time: a tensor-core product of BLOCK_M = 16, 32 or 64 rows (DOT; in the interpreter each
    row's products summed along K instead). With SPLIT_K > 1 the last program
    of a row tile and column block to finish sums the chunks' partials in chunk order (the same sum
    whichever arrives last) and stores. DEPENDENT: launched dependent on the kernel before
    (gpu/kernels/dependent.py); the next one may be scheduled once the walk over K is done."""
    wait_previous(DEPENDENT)
    pid = tl.program_id(0)
    tile = pid % tiles
    cols = (pid // tiles) * BLOCK_N + tl.arange(0, BLOCK_N)  # [N]
    col_ok = cols < N
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_base = w_ptr + cols[:, None].to(tl.int64) * swn + kk[None, :]
    u_base = u_ptr + cols[:, None].to(tl.int64) * swn + kk[None, :]
    x_base = x_ptr + rows[:, None] * sxm + kk[None, :]
    if SPLIT_K == 1:
        k_lo = 0
        k_hi = K
    else:
        k_lo = tl.program_id(1) * k_chunk
        k_hi = tl.minimum(k_lo + k_chunk, K)
    for start in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            w_mask = col_ok[:, None]
            x_mask = row_ok[:, None]
        else:
            k_ok = (start + kk) < K
            w_mask = col_ok[:, None] & k_ok[None, :]
            x_mask = row_ok[:, None] & k_ok[None, :]
        x = tl.load(x_base + start, mask=x_mask, other=0.0)
        w = tl.load(w_base + start, mask=w_mask, other=0.0)
        acc = _accumulate(acc, x, w, DOT, F32_DOT)
        if ACT > 0:
            u = tl.load(u_base + start, mask=w_mask, other=0.0)
            acc_u = _accumulate(acc_u, x, u, DOT, F32_DOT)
    release_next(DEPENDENT)
    if SPLIT_K == 1:
        _finish(acc, acc_u, b_ptr, r_ptr, out_ptr, rows, row_ok, cols, col_ok, som, srm, HAS_BIAS, HAS_RESIDUAL, ACT)
    else:
        slot_rows = rows[:, None] * N + cols[None, :]  # [M, N] in one [tiles x BLOCK_M, N] slab
        tile_ok = row_ok[:, None] & col_ok[None, :]
        slab = tiles * BLOCK_M * N
        tl.store(part_ptr + tl.program_id(1) * slab + slot_rows, acc, mask=tile_ok)
        if ACT > 0:
            tl.store(part_ptr + (SPLIT_K + tl.program_id(1)) * slab + slot_rows, acc_u, mask=tile_ok)
        # Every thread's stores come before the barrier; the gpu-scope release of the atomic
        # publishes them; the last program to arrive acquires all chunks' stores. Its loads skip
        # L1 (.cg): the other programs' stores are in L2.
        tl.debug_barrier()
        slot = count_ptr + pid
        arrived = tl.atomic_add(slot, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            tl.store(slot, 0)  # ready for the next call; no other program touches it in this one
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for chunk in tl.static_range(SPLIT_K):
                acc += tl.load(part_ptr + chunk * slab + slot_rows, mask=tile_ok, other=0.0, cache_modifier=".cg")
                if ACT > 0:
                    acc_u += tl.load(part_ptr + (SPLIT_K + chunk) * slab + slot_rows, mask=tile_ok, other=0.0,
                                     cache_modifier=".cg")
            _finish(acc, acc_u, b_ptr, r_ptr, out_ptr, rows, row_ok, cols, col_ok, som, srm, HAS_BIAS, HAS_RESIDUAL, ACT)


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    u_ptr,  # [N, K] the up projection when ACT > 0 (else w_ptr again, unread)
    b_ptr,  # [N] when HAS_BIAS
    r_ptr,  # [M, N] added to the output when HAS_RESIDUAL
    out_ptr,  # [M, N]
    M, N, K, groups, sxm, swn, som, srm,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PIECES: tl.constexpr, ROWS: tl.constexpr, DEPENDENT: tl.constexpr,
):
    """Program c * groups + g computes out[r, c * BLOCK_N : (c + 1) * BLOCK_N] for the rows r of group
    g (ROWS of them), one row after another, each by the same code: the K pieces' products summed
    element by element in float32 in piece order, then one sum over the piece's width. The pieces
    are unrolled, so a row's loads are all issued before the first product needs one."""
    wait_previous(DEPENDENT)
    pid = tl.program_id(0)
    group = pid % groups
    cols = (pid // groups) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    kk = tl.arange(0, BLOCK_K)
    w_base = w_ptr + cols[:, None].to(tl.int64) * swn + kk[None, :]
    u_base = u_ptr + cols[:, None].to(tl.int64) * swn + kk[None, :]
    for row in range(group * ROWS, tl.minimum(group * ROWS + ROWS, M)):
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for piece in tl.static_range(PIECES):
            start = piece * BLOCK_K
            if EVEN_K:
                w_mask = col_ok[:, None]
                x_mask = kk >= 0
            else:
                x_mask = (start + kk) < K
                w_mask = col_ok[:, None] & x_mask[None, :]
            xf = tl.load(x_ptr + row * sxm + start + kk, mask=x_mask, other=0.0).to(tl.float32)[None, :]
            acc += tl.load(w_base + start, mask=w_mask, other=0.0).to(tl.float32) * xf
            if ACT > 0:
                acc_u += tl.load(u_base + start, mask=w_mask, other=0.0).to(tl.float32) * xf
        # Once the first row's weights are in, the next kernel's programs may be scheduled (a hint,
        # idempotent): the reduction and the store are this kernel's tail.
        release_next(DEPENDENT)
        rows = row + tl.arange(0, 1)
        _finish(tl.sum(acc, axis=1)[None, :], tl.sum(acc_u, axis=1)[None, :], b_ptr, r_ptr, out_ptr, rows, rows < M,
                cols, col_ok, som, srm, HAS_BIAS, HAS_RESIDUAL, ACT)


@triton.jit
def _finish(acc, acc_u, b_ptr, r_ptr, out_ptr, rows, row_ok, cols, col_ok, som, srm, HAS_BIAS: tl.constexpr,
            HAS_RESIDUAL: tl.constexpr, ACT: tl.constexpr):
    """The epilogue: bias, activation and product in the model's dtype, the residual added to the
    rounded projection (the module's add), then the store."""
    dtype = out_ptr.dtype.element_ty
    if HAS_BIAS:
        acc = acc.to(dtype).to(tl.float32) + tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACT > 0:  # each rounding step of act(gate(x)) * up(x) in the model's dtype
        g = _act(acc.to(dtype).to(tl.float32), ACT).to(dtype).to(tl.float32)
        acc = g * acc_u.to(dtype).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + rows[:, None] * srm + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        # the projection rounded as the plain call stores it; the sum rounded to nearest even on
        # the Triton interpreter too (its casts truncate), as torch's add is
        acc = rounded(acc.to(dtype).to(tl.float32) + r.to(tl.float32), dtype)
    tl.store(out_ptr + rows[:, None] * som + cols[None, :], acc.to(dtype), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _accumulate(acc, x, w, DOT: tl.constexpr, F32_DOT: tl.constexpr):
    """acc [M, N] + x [M, K] @ w [N, K]^T in float32."""
    if DOT:
        if F32_DOT:
            return acc + tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        return acc + tl.dot(x, tl.trans(w))
    return acc + tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)


# Triton made interpreted functions, not JITFunctions, when TRITON_INTERPRET was set as this module
# was imported (CPU tests).
INTERPRETED = not isinstance(_linear_kernel, JITFunction)
