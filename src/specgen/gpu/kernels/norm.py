"""RMSNorm, with the residual add before it, in one launch per call for captured steps.

Why: transformers' RMSNorm is seven elementwise and reduction kernels (cast up, square, mean, add
eps, rsqrt, scale, cast back, times the weight) and each decoder layer adds two residual adds; in a
captured step of a large model each of those small kernels costs a launch gap of its own, which
is most of what separates a CUDA-graph step from a compiled one. Here one program owns one row,
so a row is computed the same way whatever the number of rows.

Rounding follows the module (LlamaRMSNorm and the Mistral/Qwen2/Qwen3 copies): the residual add in
the model's dtype; x in float32; x * rsqrt(mean(x^2) + eps) in float32, cast back to the input's
dtype; then times the weight in the weight's and input's common dtype. With `offset` (GemmaRMSNorm,
Gemma2RMSNorm), the module's other form: x * rsqrt(mean(x^2) + eps) times (1 + weight), all in
float32, rounded once to the input's dtype. One difference: the sum of
squares is accumulated in float64 (each square rounded to float32 first, as the module does), so
the variance is the correctly rounded float32 mean whatever the summation order. The module's
float32 sum depends on torch's reduction order, which can also change with the number of rows;
the two agree wherever that float32 sum is exact.

Torch reference: gpu/kernels/reference.py. Calls from a model step: gpu/ops.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous

MAX_COLUMNS = 1 << 16  # one row per program, held in registers


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dependent: bool = False,
             offset: bool = False) -> torch.Tensor:
    """The module's RMSNorm of x [..., N] with weight [N]; offset: Gemma's, scaled by 1 + weight.
    dependent: launched dependent on the kernel before (gpu/kernels/dependent.py)."""
    return _launch(x, None, weight, eps, dependent, offset)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, dependent: bool = False):
    """(RMSNorm(residual + x), residual + x): a decoder layer's add and the norm after it."""
    return _launch(x, residual, weight, eps, dependent)


def offset_norm_add(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                    second: tuple[torch.Tensor, float] | None = None, dependent: bool = False):
    """(residual + RMSNorm(x), RMSNorm2(residual + RMSNorm(x)) or None), Gemma's form throughout: a
    Gemma 2 layer's norm after its attention or MLP, the residual add after that norm, and, with
    second = (weight, eps), the norm before its MLP, in one launch."""
    weight2, eps2 = second if second is not None else (None, 0.0)
    out, summed = _launch(x, residual, weight, eps, dependent, True, True, weight2, eps2)
    return summed, out


def _launch(x, residual, weight, eps, dependent, offset=False, after=False, weight2=None, eps2=0.0):
    return run(x, residual, weight, eps, dependent, offset, after, weight2, eps2)


def out_dtype(x: torch.Tensor, weight: torch.Tensor, offset: bool) -> torch.dtype:
    """The module's output dtype: the input's (Gemma's), else the weight's and input's common one."""
    return x.dtype if offset else torch.promote_types(weight.dtype, x.dtype)


def run(x, residual, weight, eps, dependent, offset=False, after=False, weight2=None, eps2=0.0):
    """(normed or None, summed or None), one launch.
    Without `after`: normed = RMSNorm(residual + x), summed = residual + x (with a residual). With
    `after` (Gemma's form only): summed = residual + RMSNorm(x), normed = RMSNorm(summed) with
    weight2 and eps2, or None without weight2."""
    n = x.shape[-1]
    assert weight.shape == (n,) and weight.is_contiguous(), f"weight {tuple(weight.shape)} for {n} columns"
    assert 0 < n <= MAX_COLUMNS, f"{n} columns > MAX_COLUMNS {MAX_COLUMNS}"
    assert not after or (offset and residual is not None), "a norm before the add takes Gemma's form and a residual"
    assert weight2 is None or (after and weight2.shape == (n,) and weight2.is_contiguous())
    x2 = _rows(x, n)
    rows = x2.shape[0]
    normed = not after or weight2 is not None
    out = torch.empty(x.shape, dtype=out_dtype(x, weight, offset), device=x.device) if normed else None
    if residual is None:
        r2 = summed = x2  # unread and unwritten
    else:
        assert residual.shape == x.shape and residual.dtype == x.dtype, "residual and x differ in shape or dtype"
        r2 = _rows(residual, n)
        summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out, summed if residual is not None else None
    block = triton.next_power_of_2(n)
    _norm_kernel[(rows,)](
        x2, r2, weight, weight2 if weight2 is not None else weight, out if normed else summed, summed, n,
        x2.stride(0), r2.stride(0), eps, eps2,
        HAS_RESIDUAL=residual is not None, OFFSET=offset, AFTER=after, SECOND=weight2 is not None, BLOCK=block,
        DEPENDENT=dependent, num_warps=min(16, max(1, block // 512)),
        # the modules round each product before adding: no fused multiply-add
        **launch_options(dependent, fp_fusion=False),
    )
    return out, summed if residual is not None else None


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """t as [rows, n] with unit column stride (a copy only when no such view exists)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


@triton.jit
def _norm_kernel(
    x_ptr,  # [M, N]
    r_ptr,  # [M, N] the residual (HAS_RESIDUAL)
    w_ptr,  # [N]
    w2_ptr,  # [N] the second norm's weight (SECOND)
    out_ptr,  # [M, N] contiguous: the normed rows (unwritten when AFTER and not SECOND)
    sum_ptr,  # [M, N] contiguous: residual + x, or with AFTER residual + RMSNorm(x) (HAS_RESIDUAL)
    N, sxm, srm, eps, eps2,
    HAS_RESIDUAL: tl.constexpr, OFFSET: tl.constexpr, AFTER: tl.constexpr, SECOND: tl.constexpr,
    BLOCK: tl.constexpr, DEPENDENT: tl.constexpr,
):
    """Program m: row m, every rounding step of the modules in their order. One row is all tail: the
    next kernel may be scheduled at once (gpu/kernels/dependent.py)."""
    wait_previous(DEPENDENT)
    release_next(DEPENDENT)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * sxm + cols, mask=ok, other=0.0)
    if AFTER:  # Gemma 2's layer: the norm, the residual add (in the model's dtype), the next norm
        y = _normed(x.to(tl.float32), w_ptr, cols, ok, N, eps, OFFSET, dtype, dtype)
        r = tl.load(r_ptr + row * srm + cols, mask=ok, other=0.0)
        summed = rounded(r.to(tl.float32) + y, dtype)
        tl.store(sum_ptr + row * N + cols, summed.to(dtype), mask=ok)
        if SECOND:
            out = _normed(summed, w2_ptr, cols, ok, N, eps2, OFFSET, dtype, out_ptr.dtype.element_ty)
            tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        if HAS_RESIDUAL:
            r = tl.load(r_ptr + row * srm + cols, mask=ok, other=0.0)
            x = rounded(r.to(tl.float32) + x.to(tl.float32), dtype)
            tl.store(sum_ptr + row * N + cols, x.to(dtype), mask=ok)
        out = _normed(x.to(tl.float32), w_ptr, cols, ok, N, eps, OFFSET, dtype, out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _normed(xf, w_ptr, cols, ok, N, eps, OFFSET: tl.constexpr, IN_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """One row's RMSNorm from its float32 values, rounded as the module rounds (as float32)."""
    squares = (xf * xf).to(tl.float64)  # each square rounded in float32, as the module's pow(2)
    variance = (tl.sum(squares, axis=0) / N).to(tl.float32)
    # eps arrives as float64 when inductor traces the call: the module adds it in float32
    inverse = tl.math.rsqrt(variance + tl.cast(eps, tl.float32))
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if OFFSET:  # Gemma: (x * inverse) * (1 + w) in float32, one rounding
        return rounded((xf * inverse) * (1.0 + w), OUT_DTYPE)
    else:
        return rounded(w * rounded(xf * inverse, IN_DTYPE), OUT_DTYPE)


@triton.jit
def rounded(x, DTYPE: tl.constexpr):
    """float32 x rounded to DTYPE (to nearest, ties to even), as float32. bfloat16 by hand: the
    Triton interpreter truncates float32 -> bfloat16 casts, where the GPU and torch round; the
    rounded value then converts exactly either way."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))  # noqa: PLR0124  NaN stays NaN
    else:
        return x.to(DTYPE).to(tl.float32)
