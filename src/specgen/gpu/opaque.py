"""The step kernels as opaque operators inside torch.compile (`[speculation] compile`).

Why: traced as plain Python, a kernel call inside a compiled layer becomes inductor's own copy of
the Triton kernel, launched by inductor's launcher, which passes none of specgen's launch options:
compile lost programmatic dependent launch (gpu/dependent.py), and with it the bench pair ran
10-16% slower compiled than not (`git show 1b54921:docs/benchmarks.md`, "Dependent launch (H200)"). Here
each call of linear / gate_up, the norms and attention is one operator node: dynamo records it without
tracing in, inductor calls it from its generated code, and the operator launches specgen's kernel
exactly as a run without compile does (same configuration, same grid, the attribute included).
Inductor still compiles whatever torch ops a layer runs between them.

The kernel modules route here themselves while dynamo traces (`torch.compiler.is_compiling()`), so
call sites do not change; outside compile nothing passes through the dispatcher. Each operator
takes tensors and numbers only: the linear kernel's configuration is picked (by shape) before the
call and passed as integers.

Mutation, as the schemas say: attention writes the new keys and values into the cache (declared).
The linear kernel's split-K arrival counters are written and left zero again by every call, and
calls run in stream order, so no call can observe another's: they are not declared, which spares
inductor a copy of the buffer around every call.
"""

from __future__ import annotations

import torch

from specgen.gpu import attention as attention_kernels
from specgen.gpu import linear as linear_kernels
from specgen.gpu import norm as norm_kernels


@torch.library.custom_op("specgen::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, up: torch.Tensor | None, bias: torch.Tensor | None,
               residual: torch.Tensor | None, counters: torch.Tensor | None, config: list[int], act: int,
               dependent: bool) -> torch.Tensor:
    return linear_kernels.run(x, weight, up, bias, act, unpack(config), counters, residual, dependent)


@_linear_op.register_fake
def _(x, weight, up, bias, residual, counters, config, act, dependent):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


@torch.library.custom_op("specgen::norm", mutates_args=())
def _norm_op(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
             dependent: bool, offset: bool, after: bool, weight2: torch.Tensor | None,
             eps2: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, summed = norm_kernels.run(x, residual, weight, eps, dependent, offset, after, weight2, eps2)
    # an operator returns tensors: an empty one stands for None
    return (out if out is not None else x.new_empty(0)), (summed if summed is not None else x.new_empty(0))


@_norm_op.register_fake
def _(x, residual, weight, eps, dependent, offset, after, weight2, eps2):
    normed = not after or weight2 is not None
    out = x.new_empty(x.shape, dtype=norm_kernels.out_dtype(x, weight, offset)) if normed else x.new_empty(0)
    return out, x.new_empty(x.shape) if residual is not None else x.new_empty(0)


@torch.library.custom_op("specgen::attention", mutates_args=("key", "value"))
def _attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, position: torch.Tensor,
                  scale: float, window: int, k_new: torch.Tensor | None, v_new: torch.Tensor | None,
                  cos: torch.Tensor | None, sin: torch.Tensor | None, softcap: float,
                  dependent: bool) -> torch.Tensor:
    rope = None if k_new is None else (k_new, v_new, cos, sin)
    return attention_kernels.run(query, key, value, position, scale, window, rope, softcap, dependent)


@_attention_op.register_fake
def _(query, key, value, position, scale, window, k_new, v_new, cos, sin, softcap, dependent):
    batch, heads, tokens, dim = query.shape
    return query.new_empty(batch, tokens, heads, dim)


def pack(config: tuple) -> list[int]:
    """A linear configuration (dot, block_n, block_k, warps, stages[, split]) as an operator's int[]."""
    return [int(value) for value in config]


def unpack(config: list[int]) -> tuple:
    return (bool(config[0]), *config[1:])


def linear(x, weight, up, bias, residual, counters, config: tuple, act: int, dependent: bool) -> torch.Tensor:
    return _linear_op(x, weight, up, bias, residual, counters, pack(config), act, dependent)


def norm(x, residual, weight, eps: float, dependent: bool, offset: bool = False, after: bool = False,
         weight2=None, eps2: float = 0.0):
    out, summed = _norm_op(x, residual, weight, float(eps), dependent, offset, after, weight2, float(eps2))
    return out if not after or weight2 is not None else None, summed if residual is not None else None


def attention(query, key, value, position, scale: float, window: int, rope, softcap: float,
              dependent: bool) -> torch.Tensor:
    k_new, v_new, cos, sin = rope if rope is not None else (None,) * 4
    return _attention_op(query, key, value, position, float(scale), int(window), k_new, v_new, cos, sin,
                         float(softcap), dependent)
