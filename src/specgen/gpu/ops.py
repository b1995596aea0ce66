"""The kernel table on CUDA: specgen's Triton kernels behind the ops of core/step/ops.py.

An owned model step (core/step/) calls its ops through one table; this one launches
gpu/kernels/linear.py, gpu/kernels/norm.py and gpu/kernels/attention.py, each with the launch options the run resolved
(gpu/policy.py: the linear configurations by shape, split-K and its counters, dependent launch)
held here once instead of passed with every call. Where a kernel is turned off, or a call is
outside what the kernel takes (more rows than a captured step has, biases the fused gate/up
projection lacks), the op is the reference's own, so both tables compute
every model. Each kernel's exactness against its torch reference is tested where the kernel is
(tests/gpu/kernels/test_linear.py, test_norm.py, test_attention.py, test_compact.py); tests/gpu/test_gpu_ops.py runs whole
steps.
"""

from __future__ import annotations

import torch

from specgen.core.step.ops import TorchOps
from specgen.gpu.kernels import attention as attention_kernels
from specgen.gpu.kernels import compact as compact_kernels
from specgen.gpu.kernels import linear as linear_kernels
from specgen.gpu.kernels import norm as norm_kernels
from specgen.gpu.kernels import step_io
from specgen.gpu.policy import ResolvedKernels


MAX_STEP = 64  # rows of the longest captured step (gpu/runner.py's MAX_GRAPH_TOKENS)


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


class TritonOps(TorchOps):
    name = "triton"

    def __init__(self, kernels: ResolvedKernels, counters: dict | None = None, table=None, rows: int = MAX_STEP):
        """counters: split-K's arrival counters by device (gpu/kernels/linear.py; a model over several GPUs
        has a set on each); table: the linear kernel's configurations (default: the policy's); rows:
        the most rows of one call that the kernels take (a runner's: its longest captured step; a
        batch's table: its verification's B x (k + 1), so that every row of it is computed as
        a one-request step computes it), more running on the reference."""
        self.kernels = kernels
        self.rows = rows
        self.table = None  # [capacity, 2, d]: cos and sin of every position, in the model's dtype
        self.embeds = None  # [rows, H]: a step's embedding rows (step_io), sized at its first call
        self.dependent = kernels.dependent_launch
        self.counters = counters or {}
        self.split_k = kernels.split_k and bool(self.counters)
        self.linear_table = table or kernels.linear_table

    def _launch(self, x: torch.Tensor) -> dict:
        """The linear kernel's launch options for a call on x's device."""
        return dict(split_k=self.split_k, counters=self.counters.get(x.device), table=self.linear_table,
                    dependent=self.dependent)

    def tabulate(self, inv_freq: torch.Tensor, dtype: torch.dtype, capacity: int) -> None:
        """Compute the rotary (cos, sin) of positions 0 .. capacity - 1 once, as the reference
        computes them a step at a time: a step then gathers its rows (one launch, not six)."""
        with torch.inference_mode():
            cos, sin = super().rotary(torch.arange(capacity, device=inv_freq.device)[None], inv_freq, dtype)
            self.table = torch.stack([cos[0], sin[0]], dim=1)
            self.rotary_rows = torch.zeros(self.rows, 2 * cos.shape[-1], dtype=dtype, device=inv_freq.device)

    def inputs(self, rows, weight, scale, inv_freq):
        """One launch (gpu/kernels/step_io.py) for the rows' embeddings and rotary rows, and a chain's or a
        batch's pending positions; any layout of at most `rows` rows in all."""
        b, n = rows.ids.shape
        if (not self.kernels.step_io or self.table is None or b * n > self.rows
                or self.table.dtype != weight.dtype):
            return super().inputs(rows, weight, scale, inv_freq)
        if self.embeds is None or self.embeds.shape[1] != weight.shape[1]:
            with torch.inference_mode():  # as the reference's gathers return inside a step
                self.embeds = torch.zeros(self.rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
        positions = rows.positions.reshape(-1)  # pending: the buffer's view, written here
        if not rows.pending:
            positions = positions.contiguous()
        rounded = float(torch.tensor(scale, dtype=weight.dtype)) if scale is not None else None
        step_io.inputs(rows.ids.reshape(-1).contiguous(), rows.start, positions, weight, self.embeds,
                       self.table.view(len(self.table), -1), self.rotary_rows, dependent=self.dependent,
                       scale=rounded, per=n, fill=rows.pending)
        both = self.rotary_rows[:b * n].view(b, n, 2, -1)
        return self.embeds[:b * n].view(b, n, -1), (both[..., 0, :], both[..., 1, :])

    def rotary(self, positions, inv_freq, dtype):
        if self.table is None or self.table.dtype != dtype:
            return super().rotary(positions, inv_freq, dtype)
        rows = self.table[positions]  # [B, n, 2, d]
        return rows[..., 0, :], rows[..., 1, :]

    def linear(self, x, weight, bias=None, residual=None):
        if not self.kernels.linear or _rows(x) > self.rows:
            return super().linear(x, weight, bias, residual)
        return linear_kernels.linear(x, weight, bias, residual=residual, **self._launch(x))

    def qkv(self, x, attn):
        fused = getattr(attn, "fused", None)
        if fused is None or not self.kernels.linear or _rows(x) > self.rows:
            return super().qkv(x, attn)
        return linear_kernels.linear(x, fused.weight, fused.bias, **self._launch(x)).split(fused.widths, dim=-1)

    def gate_up(self, x, gate, up, activation, gate_bias=None, up_bias=None):
        if (not self.kernels.linear or gate_bias is not None or _rows(x) > self.rows
                or activation not in linear_kernels.ACTIVATIONS):
            return super().gate_up(x, gate, up, activation, gate_bias, up_bias)
        return linear_kernels.gate_up(x, gate, up, activation, **self._launch(x))

    def norm(self, x, weight, eps, offset=False):
        if not self.kernels.norm:
            return super().norm(x, weight, eps, offset)
        return norm_kernels.rms_norm(x, weight, eps, dependent=self.dependent, offset=offset)

    def norm_add_norm(self, x, residual, weight, eps, after, after_eps):
        if not self.kernels.norm:
            return super().norm_add_norm(x, residual, weight, eps, after, after_eps)
        return norm_kernels.offset_norm_add(x, residual, weight, eps, second=(after, after_eps),
                                            dependent=self.dependent)

    def attention(self, q, k, v, cache, layer, rows, rotary, scale, window=None, softcap=None):
        b, n, heads, d = q.shape
        if not self.kernels.attention or n > attention_kernels.MAX_GRAPH_QUERY:
            return super().attention(q, k, v, cache, layer, rows, rotary, scale, window, softcap)
        keys, values = cache.keys[layer], cache.values[layer]
        if self.kernels.rope:  # the kernel rotates q and k and writes k, v into the cache itself
            rope = (k.transpose(1, 2), v.transpose(1, 2), *rotary)
            query = q.transpose(1, 2)
        else:
            q, k = self.rope(q, rotary), self.rope(k, rotary)
            self.write(k, v, cache, layer, rows)
            rope, query = None, q.transpose(1, 2)
        out = attention_kernels.decode_attention(query, keys, values, rows.start, scale, window or 0, rope=rope,
                                                 softcap=softcap or 0.0, dependent=self.dependent,
                                                 tail=rows.tail, depth=rows.depth)
        return out.reshape(b, n, heads * d)  # [B, n, h, d] from the kernel

    def compact(self, cache, src, dst):
        """One launch for every layer's keys and values and the positions (gpu/kernels/compact.py),
        where the cache's layers lie in one allocation on src's device (a cache over several GPUs,
        or a sequence's view of a batch's cache, takes the reference)."""
        planes = getattr(cache, "planes", None) or {}
        if len(planes) != 1 or next(iter(planes.values())).device != src.device:
            return super().compact(cache, src, dst)
        (device, stack), = planes.items()
        compact_kernels.compact(stack, cache.copies[device], src.long(), dst.long(), dependent=self.dependent)
