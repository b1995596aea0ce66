"""Linear layers for decode and verification steps: a Triton kernel that streams each weight once.

Why: a decode step of a large target reads every weight once, so its floor is weight bytes over
memory bandwidth. cuBLAS picks different kernels for 1 row and for the 5 rows of a k = 4
verification, and neither reaches the floor on a Llama-3-8B shape on an H200 (docs/benchmarks.md):
the 1-token step took 1.44x the floor; inductor's matrix-vector reduction reaches 1.23x for one
row, but the 5-token step stays on cuBLAS at 1.18x the 1-token step. Here one program owns
BLOCK_N output columns, walks K once, and multiplies each weight tile by every row (up to
MAX_ROWS, padded to 16 for a tensor-core product) while it is loaded, so 5 rows cost what 1 row
costs. With one configuration for 1 and for 5 rows (every N > 2048), each row is computed the same
way whatever the number of rows.

Split-K (a configuration's 6th entry, picked by shape): K in chunks, one program per chunk and
column block, each storing a float32 partial; the last program of a column block to finish (an
arrival counter per block, reset by that program) sums the partials in chunk order and applies the
epilogue. More programs in flight per column for the shapes whose column blocks barely fill the
GPU (docs/benchmarks.md, "Split-K").

`gate_up` fuses the MLP's two input projections and its activation: act(x W_g^T) * (x W_u^T), one
pass over both weights with no [rows, 2 x intermediate] round trip; the rounding steps of the
unfused module (each projection, the activation, the product in the model's dtype) are kept.

The q, k and v projections of an attention module are fused the same way: their weights are
concatenated once into one buffer (the modules' weights become views of it, so no memory is
added), the q call computes all three in one pass and the k and v calls return slices of it.

`install(model)` swaps the classes of a model's nn.Linear and gated-MLP modules for subclasses
whose forward takes this path for inputs of at most MAX_ROWS rows, inside `active()` only, and is
the original otherwise (prefill, other users of the model object); `uninstall` restores them.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 16
ACTIVATIONS = {"silu": 1, "gelu_pytorch_tanh": 2, "gelu_tanh": 2}  # HF hidden_act -> kernel code
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Split-K where it was measured to gain (an H200; on an H100 the same configurations cost 35 us a
# step): SPECGEN_SPLIT_K=0 never, =all on every GPU. Set per device by tune(), which runners call.
SPLIT_K = os.environ.get("SPECGEN_SPLIT_K", "1")
SPLIT_K_GPUS = ("H200",)
SPLIT_K_ON = False
# (DOT, BLOCK_N, BLOCK_K, num_warps, num_stages), measured with bench_linear.py on an H200 over
# Llama-3-8B's projections (docs/benchmarks.md): one tensor-core configuration is within 5% of the
# best for 1 and for 5 rows on every shape with N > 2048; narrower outputs (k/v projections that
# could not be fused) want narrower tiles, and a single row there the register path.
WIDE = (True, 32, 256, 4, 4)
NARROW = (True, 16, 256, 4, 4)
NARROW_ONE_ROW = (False, 2, 2048, 4, 1)
# Split-K, a 6th entry: K in that many chunks, one program each per column block, the last to finish
# sums them. Measured with bench_linear.py --split-k on an H200 (docs/benchmarks.md, "Split-K"): the
# long-K down projection (4096 x 14336: 128 column blocks), the gate/up pair and a 4096-wide
# projection with 128 column blocks gain; q+k+v fused (6144 wide) does not.
SPLIT_LONG_K = (True, 32, 128, 4, 4, 3)  # K >= 3 N
SPLIT_GATED = (True, 32, 128, 4, 3, 4)  # gate_up
SPLIT_FEW_COLUMNS = (True, 32, 128, 4, 5, 2)  # at most 128 column blocks of 32

COUNTER_SLOTS = 1 << 16  # split-K arrival counters per device: column blocks of one call at most
_COUNTERS: dict[tuple, torch.Tensor] = {}  # by (device type, index)


def counters(device: torch.device) -> torch.Tensor:
    """The device's split-K arrival counters (int32, zero between calls: the last program of each
    column block resets its own). Runners create them before capture and compile, so graphs and
    compiled steps hold one buffer; calls on a device run in stream order, so one serves them all."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" share one buffer
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device.type, device.index)
    buffer = _COUNTERS.get(key)
    if buffer is None:
        buffer = _COUNTERS[key] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return buffer


def tune(device: torch.device) -> bool:
    """Choose split-K for this device's calls (see SPLIT_K): whether it is on."""
    global SPLIT_K_ON
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    SPLIT_K_ON = SPLIT_K == "all" or (SPLIT_K != "0" and any(gpu in name for gpu in SPLIT_K_GPUS))
    return SPLIT_K_ON


def _config(rows: int, n: int, k: int, gated: bool = False):
    """By shape only where N > 2048, so one row is computed the same way whatever the row count."""
    if rows > MAX_ROWS:
        raise ValueError(f"{rows} rows > MAX_ROWS {MAX_ROWS}")
    if n > 2048:
        if SPLIT_K_ON and k >= 2048:
            if gated:
                return SPLIT_GATED
            if k >= 3 * n:
                return SPLIT_LONG_K
            if n <= 128 * 32:
                return SPLIT_FEW_COLUMNS
        return WIDE
    if rows == 1:
        return NARROW_ONE_ROW[:2] + (min(NARROW_ONE_ROW[2], triton.next_power_of_2(k)),) + NARROW_ONE_ROW[3:]
    return NARROW


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           config: tuple | None = None) -> torch.Tensor:
    """F.linear for inputs of at most MAX_ROWS rows: x [..., K], weight [N, K] -> [..., N]."""
    return _launch(x, weight, None, bias, 0, config)


def gate_up(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str,
            config: tuple | None = None) -> torch.Tensor:
    """act(x gate^T) * (x up^T) with the rounding of the unfused module: x [..., K] -> [..., N]."""
    return _launch(x, gate, up, None, ACTIVATIONS[activation], config)


def _launch(x, weight, up, bias, act, config):
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    assert rows <= MAX_ROWS and weight.stride(-1) == 1
    dot, block_n, block_k, warps, stages, *rest = config or _config(rows, n, k, act > 0)
    block_m = 16 if dot else triton.next_power_of_2(rows)
    columns = triton.cdiv(n, block_n)
    k_chunk = block_k * triton.cdiv(triton.cdiv(k, rest[0] if rest else 1), block_k)
    split_k = triton.cdiv(k, k_chunk)  # chunks of whole tiles: every chunk has columns of K
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    second = up if up is not None else weight
    assert second.shape == weight.shape and second.stride() == weight.stride()
    if split_k > 1:
        assert columns <= COUNTER_SLOTS
        part = torch.empty(2 if act else 1, split_k, block_m, n, dtype=torch.float32, device=x.device)
        count = counters(x.device)
    else:
        part = count = out  # unused
    _linear_kernel[(columns, split_k)](
        x2, weight, second, bias if bias is not None else weight, out, part, count,
        rows, n, k, k_chunk, x2.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, ACT=act, EVEN_K=k % block_k == 0, DOT=dot,
        F32_DOT=x.dtype == torch.float32 or _INTERPRETED,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        num_warps=warps, num_stages=stages,
    )
    return out.reshape(*lead, n)


def linear_reference(x, weight, bias=None):
    return F.linear(x, weight, bias)


def gate_up_reference(x, gate, up, activation: str):
    """What the unfused module computes: act(F.linear(x, gate)) * F.linear(x, up) in x's dtype."""
    g = F.linear(x, gate)
    act = F.silu(g) if ACTIVATIONS[activation] == 1 else F.gelu(g, approximate="tanh")
    return act * F.linear(x, up)


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
    out_ptr,  # [M, N]
    part_ptr,  # [2 if ACT else 1, SPLIT_K, BLOCK_M, N] float32 partial sums (SPLIT_K > 1)
    count_ptr,  # [>= column blocks] int32 arrivals, zero on entry and on exit (SPLIT_K > 1)
    M, N, K, k_chunk, sxm, swn, som,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr, F32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):
    """Program (p, s) computes out[:, p * BLOCK_N : (p + 1) * BLOCK_N] over K (SPLIT_K == 1) or
    over its s-th chunk of k_chunk columns of K, one weight tile at a time: a tensor-core product
    with the rows padded to BLOCK_M = 16 (DOT), or products summed along K in registers (one row:
    a matrix-vector product). With SPLIT_K > 1 the last program of a column block to finish sums
    the chunks' partials in chunk order (the same sum whichever arrives last) and stores."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [N]
    col_ok = cols < N
    rows = tl.arange(0, BLOCK_M)
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
    if SPLIT_K == 1:
        _finish(acc, acc_u, b_ptr, out_ptr, rows, row_ok, cols, col_ok, som, HAS_BIAS, ACT)
    else:
        tile = rows[:, None] * N + cols[None, :]  # [M, N] in one [BLOCK_M, N] slab
        tile_ok = row_ok[:, None] & col_ok[None, :]
        slab = BLOCK_M * N
        tl.store(part_ptr + tl.program_id(1) * slab + tile, acc, mask=tile_ok)
        if ACT > 0:
            tl.store(part_ptr + (SPLIT_K + tl.program_id(1)) * slab + tile, acc_u, mask=tile_ok)
        # Every thread's stores come before the barrier; the gpu-scope release of the atomic
        # publishes them; the last program to arrive acquires all chunks' stores. Its loads skip
        # L1 (.cg): the other programs' stores are in L2.
        tl.debug_barrier()
        slot = count_ptr + tl.program_id(0)
        arrived = tl.atomic_add(slot, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            tl.store(slot, 0)  # ready for the next call; no other program touches it in this one
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for chunk in tl.static_range(SPLIT_K):
                acc += tl.load(part_ptr + chunk * slab + tile, mask=tile_ok, other=0.0, cache_modifier=".cg")
                if ACT > 0:
                    acc_u += tl.load(part_ptr + (SPLIT_K + chunk) * slab + tile, mask=tile_ok, other=0.0,
                                     cache_modifier=".cg")
            _finish(acc, acc_u, b_ptr, out_ptr, rows, row_ok, cols, col_ok, som, HAS_BIAS, ACT)


@triton.jit
def _finish(acc, acc_u, b_ptr, out_ptr, rows, row_ok, cols, col_ok, som, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """The epilogue: bias, activation and product in the model's dtype, then the store."""
    dtype = out_ptr.dtype.element_ty
    if HAS_BIAS:
        acc = acc.to(dtype).to(tl.float32) + tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACT > 0:  # each rounding step of act(gate(x)) * up(x) in the model's dtype
        g = _act(acc.to(dtype).to(tl.float32), ACT).to(dtype).to(tl.float32)
        acc = g * acc_u.to(dtype).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * som + cols[None, :], acc.to(dtype), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _accumulate(acc, x, w, DOT: tl.constexpr, F32_DOT: tl.constexpr):
    """acc [M, N] + x [M, K] @ w [N, K]^T in float32."""
    if DOT:
        if F32_DOT:
            return acc + tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        return acc + tl.dot(x, tl.trans(w))
    return acc + tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)


# -- installing into a model ------------------------------------------------------------------------


_ACTIVE = False  # set by a runner around its own forwards (and captures) only


@contextlib.contextmanager
def active(on: bool = True):
    """Installed modules take the kernel path inside this context (when `on`), F.linear outside:
    other users of the same model object (Hugging Face's generate in a benchmark) are unaffected."""
    global _ACTIVE
    saved, _ACTIVE = _ACTIVE, on
    try:
        yield
    finally:
        _ACTIVE = saved


def _small(x: torch.Tensor) -> bool:
    return _ACTIVE and 0 < x.numel() and x.numel() // x.shape[-1] <= MAX_ROWS


class SkinnyLinear(torch.nn.Linear):
    """nn.Linear whose forward runs gpu/linear.py's kernel for inputs of at most MAX_ROWS rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _small(x):
            return linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class _Fused:
    """The q, k and v projections of one attention module, concatenated: one weight [Nq + Nk + Nv, K]
    whose row blocks are the three modules' weights (views, no copy kept)."""

    def __init__(self, parts):
        self.weight = torch.cat([p.weight.detach() for p in parts])
        self.bias = torch.cat([p.bias.detach() for p in parts]) if parts[0].bias is not None else None
        self.bounds = []
        at = 0
        for part in parts:
            rows = part.weight.shape[0]
            self.bounds.append((at, at + rows))
            part.weight = torch.nn.Parameter(self.weight[at:at + rows], requires_grad=False)
            if self.bias is not None:
                part.bias = torch.nn.Parameter(self.bias[at:at + rows], requires_grad=False)
            at += rows
        self.pending = None  # (input, fused output) between the q call and the v call


class SkinnyQKV(SkinnyLinear):
    """q_proj / k_proj / v_proj of one attention module. The q call computes all three outputs in
    one pass over the fused weight; the k and v calls on the same input return their slices."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _small(x):
            return F.linear(x, self.weight, self.bias)
        fused, role = self._specgen_fused, self._specgen_role
        lo, hi = fused.bounds[role]
        if role == 0:
            y = linear(x, fused.weight, fused.bias)
            fused.pending = (x, y)
            return y[..., lo:hi]
        pending = fused.pending
        if pending is not None and pending[0] is x:
            if role == len(fused.bounds) - 1:
                fused.pending = None
            return pending[1][..., lo:hi]
        return linear(x, self.weight, self.bias)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    if _small(x):
        return self.down_proj(gate_up(x, self.gate_proj.weight, self.up_proj.weight, self._specgen_act))
    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


_MLP_CLASSES: dict[type, type] = {}


def _activation(module) -> str | None:
    """The kernel's name for a gated MLP's activation, or None when it is not one the kernel has."""
    act = getattr(module, "act_fn", None)
    if isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU"):
        return "silu"
    if type(act).__name__ in ("PytorchGELUTanh", "GELUTanh") or (
            isinstance(act, torch.nn.GELU) and act.approximate == "tanh"):
        return "gelu_tanh"
    return None


def _gated_mlp(module) -> str | None:
    parts = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(p, torch.nn.Linear) and p.bias is None for p in parts):
        return None
    if parts[0].weight.shape != parts[1].weight.shape or parts[0].weight.stride() != parts[1].weight.stride():
        return None
    return _activation(module)


def _qkv(module) -> list | None:
    parts = [getattr(module, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    if not all(type(p) is torch.nn.Linear for p in parts):
        return None
    first = parts[0].weight
    if any(p.weight.shape[1] != first.shape[1] or p.weight.dtype != first.dtype or p.weight.device != first.device
           or (p.bias is None) != (parts[0].bias is None) for p in parts):
        return None
    return parts


def install(model) -> int:
    """Route the model's linear layers (and gated MLPs) through the kernel for short inputs; fuse
    each attention module's q/k/v weights into one. Returns how many modules were switched;
    idempotent."""
    switched = 0
    for module in list(model.modules()):
        parts = _qkv(module)
        if parts is not None:
            fused = _Fused(parts)
            for role, part in enumerate(parts):
                part._specgen_class = torch.nn.Linear
                part._specgen_fused = fused
                part._specgen_role = role
                part.__class__ = SkinnyQKV
            switched += 3
    for module in model.modules():
        if hasattr(module, "_specgen_class"):
            continue
        if type(module) is torch.nn.Linear and module.weight.stride(-1) == 1:
            module._specgen_class = torch.nn.Linear
            module.__class__ = SkinnyLinear
            switched += 1
            continue
        act = _gated_mlp(module)
        if act is not None and "forward" not in vars(module):
            base = type(module)
            if base not in _MLP_CLASSES:
                _MLP_CLASSES[base] = type(f"Skinny{base.__name__}", (base,), {"forward": _mlp_forward})
            module._specgen_class = base
            module._specgen_act = act
            module.__class__ = _MLP_CLASSES[base]
            switched += 1
    return switched


def uninstall(model) -> None:
    for module in model.modules():
        base = module.__dict__.pop("_specgen_class", None)
        if base is not None:  # fused q/k/v weights stay views of one buffer: same values
            module.__class__ = base
            for key in ("_specgen_act", "_specgen_fused", "_specgen_role"):
                module.__dict__.pop(key, None)


def installed(model) -> bool:
    return any(hasattr(module, "_specgen_class") for module in model.modules())
