"""Routing an EAGLE-3 head's calls (core/eagle.py) through the step kernels.

Why: a head's drafting call is one decoder layer plus fc and lm_head, about 20M parameters: its
weights take microseconds to read on an H200, so a call costs what it launches. On torch's ops it
launches about fifty small kernels (norms, rotary, the cache writes, a masked attention over the
whole static cache, the gated MLP's three products), about 80 µs a call with compile and 190 µs
without on the bench pair (`git show 9b5844a:docs/benchmarks.md`, "EAGLE-3 heads on the bench
pair (H200)"), which made the head's draft phase dearer than a
two-layer draft model's on the same kernels. Here a call is the models' own kernels:

- fc, the fused q/k/v projection, o_proj, the gated MLP and lm_head: gpu/linear.py, through
  gpu/rewire.py's install_linear (the same SkinnyLinear / fused-QKV / gate_up rewiring as a model);
- the four norms: gpu/norm.py, each residual add inside the norm after it (the layer's last add
  with the head's final norm);
- attention: gpu/attention.py with the rotary embedding and the cache write inside the kernel,
  over the live keys only (the head's cache is [1, Hkv, C, D], the kernel's layout), at the
  position of the call's first row: a call's rows are consecutive positions (the extend over the
  previous round's rows, or one drafted step).

Like every rewired forward, these take the kernel path only while the switch is engaged (the
drafter's round calls, core/heads.py); prefill and training keep the module's own forward.
Numerics differ from the torch path by rounding only (the kernel rotates in float32 with one
rounding); the head only proposes, and the target verifies every proposal.
"""

from __future__ import annotations

import functools

import torch

from specgen.gpu import attention as attention_kernels
from specgen.gpu import norm as norm_kernels
from specgen.gpu.kernels import ResolvedKernels
from specgen.gpu.rewire import LinearSwitch, install_linear


def install_head(head, kernels: ResolvedKernels) -> LinearSwitch:
    """Rewire `head` (an Eagle3Head) for `kernels` (the target runner's resolution: the head uses
    the kernels its target uses). Returns the switch to engage around its calls; idempotent.
    Its one-row calls (a round's drafting steps after the first) take the table's draft picks, as
    a draft model's do (LinearTable.for_drafts): at one row a matrix-vector program is faster than
    the tensor-core tile the target's verification shares, and a head's numerics never decide the
    output."""
    switch = install_linear(head, kernels.linear_table.for_drafts())
    layer = head.layers[0]
    if "_specgen_layer_base" not in vars(layer):
        layer._specgen_layer_base = type(layer)
        layer._specgen_switch = switch
        layer._specgen_attention = kernels.attention and kernels.rope
        layer._specgen_final_norm = head.norm
        layer.__class__ = _subclass(type(layer), _layer_forward)
    for norm in (head.norm, layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm):
        if "_specgen_norm_base" not in vars(norm):
            norm._specgen_norm_base = type(norm)
            norm._specgen_switch = switch
            norm.__class__ = _subclass(type(norm), _norm_forward)
    return switch


@functools.cache
def _subclass(base: type, forward) -> type:
    return type(f"Kernel{base.__name__}", (base,), {"forward": forward})


def _norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    pending = vars(self).pop("_specgen_pending", None)
    if pending is not None and pending[0] is x:  # the layer's output: normed with its last add
        return pending[1]
    if self._specgen_switch.norms() and x.numel() > 0:
        return norm_kernels.rms_norm(x, self.weight, self.eps, self._specgen_switch.dependent)
    return self._specgen_norm_base.forward(self, x)


def _layer_forward(self, embeds, h, positions, rope, cache):
    """Eagle3Layer.forward with the kernels: the same operations in the same order."""
    switch = self._specgen_switch
    if not switch.takes(h):
        return self._specgen_layer_base.forward(self, embeds, h, positions, rope, cache)
    normed = self.hidden_norm(h)
    residual = normed if self.norm_before_residual else h
    x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [N, 2H]
    if self._specgen_attention and h.shape[0] <= attention_kernels.MAX_GRAPH_QUERY and cache[0].dim() == 4:
        attended = _attention(self.self_attn, x, positions, rope, cache, switch.dependent)
    else:
        attended = self.self_attn(x, positions, rope, cache)
    post = self.post_attention_layernorm
    if not switch.norms():
        h = residual + attended
        return h + self.mlp(post(h))
    normed, h = norm_kernels.add_rms_norm(attended, residual, post.weight, post.eps, switch.dependent)
    final = self._specgen_final_norm  # the head norms this layer's output next: one launch for both
    normed, out = norm_kernels.add_rms_norm(self.mlp(normed), h, final.weight, final.eps, switch.dependent)
    final._specgen_pending = (out, normed)
    return out


def _attention(attn, x, positions, rope, cache, dependent: bool):
    """The head's attention in gpu/attention.py: x [N, 2H] at positions[0] .. positions[0] + N - 1."""
    n, dim = x.shape[0], attn.head_dim
    query = attn.q_proj(x).view(1, n, attn.heads, dim).transpose(1, 2)  # one fused q/k/v pass
    key = attn.k_proj(x).view(1, n, attn.kv_heads, dim).transpose(1, 2)
    value = attn.v_proj(x).view(1, n, attn.kv_heads, dim).transpose(1, 2)
    cos, sin = (part.squeeze(1).unsqueeze(0) for part in rope)  # [N, 1, D] views -> [1, N, D]
    out = attention_kernels.decode_attention(query, cache[0], cache[1], positions[0], dim ** -0.5, 0,
                                             (key, value, cos, sin), dependent=dependent)
    return attn.o_proj(out.reshape(n, attn.heads * dim))
