"""Routing a transformers model's modules through gpu/linear.py and gpu/attention.py.

Rewiring changes nothing by itself: every rewired forward takes its kernel path only when a runner
asks for it, and is the model's own otherwise (prefill, Hugging Face's generate on the same model
object in a benchmark).

- Linear layers (install_linear): nn.Linear modules become SkinnyLinear, gated MLPs get a forward
  that calls gate_up (the two input projections and the activation in one pass), and the q, k and v
  projections of an attention module are fused: their weights are concatenated once into one
  buffer (the modules' weights become views of it, so no memory is added), the q call computes all
  three in one pass and the k and v calls return slices of it. They take the kernel for inputs of
  at most linear.MAX_ROWS rows (every captured shape: each row computed the same way whatever the
  row count) while the model's LinearSwitch is active (a runner's step_context).
- Attention (switch_attention): the model's attention implementation becomes "specgen", registered
  with transformers' AttentionInterface: gpu/attention.py when the runner passes
  `specgen_position`, SDPA (with SDPA's mask) otherwise, or for soft-capped attention (Gemma 2),
  which SDPA cannot compute, the model's eager computation over that mask.
- Rotary embedding in the kernel (install_rope): Llama / Mistral / Qwen2 / Qwen3 / Gemma 2 attention modules
  get a forward that, when the runner also passes `specgen_rope=True`, hands the un-rotated query,
  new keys and values to the kernel, which rotates them and writes the cache itself: two fewer
  kernels a layer.
- Rotary tables (install_rotary): a step's cos and sin are one gather from a table the module's
  own forward filled for every position of the runner's cache, instead of the eight or so small
  kernels the forward launches per step; values are the forward's bit for bit (each is an
  elementwise function of one position).
- The step's mask (mask_free, STEP_MASK_SHAPE): when every attention call of a step is the kernel's,
  which reads the position and not the mask, a runner hands the model an already-built 4D
  placeholder, which transformers passes through as it is, so no mask is built per step.
- RMSNorm (install_norm): Llama / Mistral / Qwen2 / Qwen3 RMSNorm modules, and Gemma's (1 + w) ones,
  take gpu/norm.py's kernel, and their decoder layers add the attention output to the residual in
  the same kernel as the norm after it, and the MLP's output in the down projection's epilogue (a
  rewired gated MLP); Gemma 2's layers run the norm after their attention, the add and the norm
  before their MLP in one launch, and the norm after their MLP with its add and the norm the model
  applies next (the next layer's input norm, or the final norm) in another; all while the model's
  switch is engaged with the norm on (a runner's step).
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
import torch.nn.functional as F

from specgen.core.models import softcapped_attention
from specgen.gpu import attention as attention_kernels
from specgen.gpu import linear as linear_kernels
from specgen.gpu import norm as norm_kernels
from specgen.gpu.kernels import (layer_capable, norm_capable, norm_eps, norm_offset, rope_capable, rotary_capable,
                                 sandwich_capable)
from specgen.gpu.linear_table import LinearTable, packaged

NAME = "specgen"  # the attention implementation's name in transformers
# What a decoder layer hands its attention the KV cache as: `cache` from transformers 5.24 on,
# `past_key_values` before (and in families not renamed yet), `past_key_value` in 4.x.
CACHE_KEYWORDS = ("cache", "past_key_values", "past_key_value")


# -- linear layers ----------------------------------------------------------------------------------


class LinearSwitch:
    """Held by every rewired module of one model: whether its forwards take the kernel now, and
    with which split-K choice and counters (those of the runner whose step is running), the
    configurations by shape (gpu/linear_table.py; the package's unless install_linear got one),
    and whether the norm kernel runs too (install_norm)."""

    def __init__(self, table: LinearTable | None = None):
        self.table = table or packaged()
        self.active = False
        self.split_k = False
        self.counters: torch.Tensor | None = None  # linear.split_k_counters(workspace)
        self.norm = False
        self.dependent = False  # launch the kernels dependent on the one before (gpu/dependent.py)
        self.handed: tuple | None = None  # hand()'s: (norm module, its input, the input's version, output)

    @contextlib.contextmanager
    def engaged(self, split_k: bool, counters: torch.Tensor | None, norm: bool | None = None,
                dependent: bool | None = None):
        """The kernel path for the duration (restored after, so contexts nest). norm: whether the
        norm kernel runs (install_norm); dependent: whether the linear and norm kernels launch
        dependent on the kernel before; None: as in the enclosing context (off outside any)."""
        saved = self.active, self.split_k, self.counters, self.norm, self.dependent, self.handed
        self.active, self.split_k, self.counters = True, split_k, counters
        self.norm = self.norm if norm is None else norm
        self.dependent = self.dependent if dependent is None else dependent
        try:
            yield
        finally:
            self.active, self.split_k, self.counters, self.norm, self.dependent, self.handed = saved

    def hand(self, norm, source: torch.Tensor, normed: torch.Tensor) -> None:
        """`normed` is norm's output for `source`, computed ahead by the launch before it (a Gemma 2
        layer's last norm launch also normalises its output with the next layer's input norm)."""
        self.handed = (norm, source, _version(source), normed)

    def take(self, norm, x: torch.Tensor) -> torch.Tensor | None:
        """hand()'s output if norm's call is the one it was computed for: the same tensor, not
        modified in place since (a hook between the layers may replace or modify it). One use."""
        handed, self.handed = self.handed, None
        if handed is None or handed[0] is not norm or handed[1] is not x or _version(x) != handed[2]:
            return None
        return handed[3]

    def norms(self) -> bool:
        return self.active and self.norm

    def takes(self, x: torch.Tensor) -> bool:
        return self.active and 0 < x.numel() and x.numel() // x.shape[-1] <= linear_kernels.MAX_ROWS


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place modification counter; inference tensors (a runner's) keep none, and
    there the hand-off relies on identity alone, as no module between two layers writes into one."""
    return -1 if t.is_inference() else t._version


def _linear(switch: LinearSwitch, x, weight, bias):
    return linear_kernels.linear(x, weight, bias, split_k=switch.split_k, counters=switch.counters,
                                 table=switch.table, dependent=switch.dependent)


class SkinnyLinear(torch.nn.Linear):
    """nn.Linear whose forward runs gpu/linear.py's kernel while its switch is active."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        switch = self._specgen_switch
        if switch.takes(x):
            return _linear(switch, x, self.weight, self.bias)
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
        switch = self._specgen_switch
        if not switch.takes(x):
            return F.linear(x, self.weight, self.bias)
        fused, role = self._specgen_fused, self._specgen_role
        lo, hi = fused.bounds[role]
        if role == 0:
            y = _linear(switch, x, fused.weight, fused.bias)
            fused.pending = (x, y)
            return y[..., lo:hi]
        pending = fused.pending
        if pending is not None and pending[0] is x:
            if role == len(fused.bounds) - 1:
                fused.pending = None
            return pending[1][..., lo:hi]
        return _linear(switch, x, self.weight, self.bias)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    if self._specgen_switch.takes(x):
        return self.down_proj(_gate_up(self, x))
    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _gate_up(mlp, x: torch.Tensor) -> torch.Tensor:
    """A rewired gated MLP's input projections and activation in one kernel."""
    switch = mlp._specgen_switch
    return linear_kernels.gate_up(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp._specgen_act,
                                  split_k=switch.split_k, counters=switch.counters, table=switch.table,
                                  dependent=switch.dependent)


@functools.cache
def _skinny_mlp_class(base: type) -> type:
    return type(f"Skinny{base.__name__}", (base,), {"forward": _mlp_forward})


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


def linear_switch(model) -> LinearSwitch | None:
    """The switch of a model whose linear layers were rewired, else None."""
    for module in model.modules():
        switch = vars(module).get("_specgen_switch")
        if switch is not None:
            return switch
    return None


def install_linear(model, table: LinearTable | None = None) -> LinearSwitch:
    """Route the model's linear layers (and gated MLPs) through the kernel for short inputs while
    the returned switch is active; fuse each attention module's q/k/v weights into one. table: the
    configurations by shape (gpu/kernels.py's ResolvedKernels.linear_table), else the package's.
    Idempotent: a model rewired before returns its switch (with `table`, when given)."""
    switch = linear_switch(model)
    if switch is not None:
        if table is not None:
            switch.table = table
        return switch
    switch = LinearSwitch(table)
    for module in list(model.modules()):
        parts = _qkv(module)
        if parts is not None:
            fused = _Fused(parts)
            for role, part in enumerate(parts):
                part._specgen_switch = switch
                part._specgen_fused = fused
                part._specgen_role = role
                part.__class__ = SkinnyQKV
    for module in model.modules():
        if "_specgen_switch" in vars(module):
            continue
        if type(module) is torch.nn.Linear and module.weight.stride(-1) == 1:
            module._specgen_switch = switch
            module.__class__ = SkinnyLinear
            continue
        act = _gated_mlp(module)
        if act is not None and "forward" not in vars(module):
            module._specgen_switch = switch
            module._specgen_act = act
            module.__class__ = _skinny_mlp_class(type(module))
    return switch


# -- RMSNorm and the residual add before it ---------------------------------------------------------


def _norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    if self._specgen_switch.norms() and x.numel() > 0:
        if self._specgen_switch.handed is not None:
            normed = self._specgen_switch.take(self, x)
            if normed is not None:
                return normed
        return norm_kernels.rms_norm(x, self.weight, norm_eps(self), self._specgen_switch.dependent,
                                     offset=norm_offset(self))
    return self._specgen_norm_base.forward(self, x)


def _layer_arguments(layer, hidden_states, args: tuple, kwargs: dict) -> dict | None:
    """A rewired decoder layer's arguments by name, as the module's own forward would read them, when
    its norm path runs (the switch engaged with the norm, a non-empty input, names it can read);
    None: the module's own forward runs."""
    if not layer._specgen_switch.norms() or hidden_states.numel() == 0:
        return None
    return _by_name(layer._specgen_layer_base, args, kwargs)


def _layer_forward(self, hidden_states, *args, **kwargs):
    named = _layer_arguments(self, hidden_states, args, kwargs)
    if named is None:
        return self._specgen_layer_base.forward(self, hidden_states, *args, **kwargs)
    attended, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **named)
    post = self.post_attention_layernorm
    normed, residual = norm_kernels.add_rms_norm(attended, hidden_states, post.weight, post.variance_epsilon,
                                                 self._specgen_switch.dependent)
    return _mlp_plus(self.mlp, normed, residual)


def _sandwich_forward(self, hidden_states, *args, **kwargs):
    """Gemma 2's layer: its attention's norm, the residual add and the norm before its MLP in one
    launch; its MLP's norm, the add after it and the norm the model applies next to the layer's
    output (the next layer's input norm, or the final norm: `_specgen_following`) in another
    (gpu/norm.py's offset_norm_add). The layer hands that last norm's output to the norm module,
    which then takes it instead of a launch of its own: one launch fewer a layer, the same bits."""
    named = _layer_arguments(self, hidden_states, args, kwargs)
    if named is None:
        return self._specgen_layer_base.forward(self, hidden_states, *args, **kwargs)
    dependent = self._specgen_switch.dependent
    attended, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **named)
    post, pre, after = self.post_attention_layernorm, self.pre_feedforward_layernorm, self.post_feedforward_layernorm
    summed, normed = norm_kernels.offset_norm_add(attended, hidden_states, post.weight, norm_eps(post),
                                                  (pre.weight, norm_eps(pre)), dependent)
    following = _following(self, summed)
    second = None if following is None else (following.weight, norm_eps(following))
    out, ahead = norm_kernels.offset_norm_add(self.mlp(normed), summed, after.weight, norm_eps(after), second,
                                              dependent)
    if following is not None:
        self._specgen_switch.hand(following, out, ahead)
    return out


def _following(layer, x: torch.Tensor):
    """The norm install_norm linked to the layer's output, if it can be computed ahead here: on x's
    device, and its own forward will run (no hook replaced it). Not inside compile, whose graphs
    would carry the hand-off across their boundaries."""
    following = vars(layer).get("_specgen_following")
    if following is None or torch.compiler.is_compiling():
        return None
    norm = following[0]
    return norm if unhooked(norm) and norm.weight.device == x.device else None


def _mlp_plus(mlp, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + mlp(x): for a rewired gated MLP the add is the down projection's epilogue. The
    MLP's and down projection's own calls are skipped, so either one with hooks (a user's, or
    accelerate's, which replaces the instance's forward) keeps them."""
    switch = vars(mlp).get("_specgen_switch")
    down = getattr(mlp, "down_proj", None)
    if (switch is None or "_specgen_act" not in vars(mlp) or not isinstance(down, SkinnyLinear)
            or not (unhooked(mlp) and unhooked(down)) or not switch.takes(x)):
        return residual + mlp(x)
    return linear_kernels.linear(_gate_up(mlp, x), down.weight, down.bias, split_k=switch.split_k,
                                 counters=switch.counters, table=switch.table, residual=residual,
                                 dependent=switch.dependent)


def unhooked(module) -> bool:
    """No forward hooks and no instance forward (accelerate's hooks replace it): the module's own call."""
    return not (module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module))


@functools.cache
def _norm_class(base: type, forward) -> type:
    return type(f"Fused{base.__name__}", (base,), {"forward": forward})


def install_norm(model, switch: LinearSwitch) -> int:
    """Route the model's RMSNorm modules (kernels.norm_capable) through gpu/norm.py, and its
    decoder layers' residual adds (kernels.layer_capable) into the norm after them, whenever
    `switch` (install_linear's) is engaged with the norm on. Returns how many modules were
    switched; idempotent."""
    switched = 0
    for module in model.modules():
        for key, capable, forward in (("_specgen_norm_base", norm_capable, _norm_forward),
                                      ("_specgen_layer_base", layer_capable, _layer_forward),
                                      ("_specgen_layer_base", sandwich_capable, _sandwich_forward)):
            if key in vars(module) or not capable(module):
                continue
            setattr(module, key, type(module))
            module._specgen_switch = switch
            module.__class__ = _norm_class(type(module), forward)
            switched += 1
    _link_following_norms(model)
    return switched


def _link_following_norms(model) -> None:
    """Each Gemma 2 layer rewired to _sandwich_forward (transformers may wrap a class's forward, so
    the base's name tells, not the function) learns which norm the model applies next to
    its output: the next layer's input norm, or after the last layer the final norm of the module
    holding the layers (transformers' `norm`), if that norm is on the kernel in Gemma's form (the
    form the layer's launch computes it in). Held in a tuple, so that it is no submodule."""
    for parent in model.modules():
        for child in parent.children():
            if not isinstance(child, torch.nn.ModuleList):
                continue
            layers = list(child)
            for i, layer in enumerate(layers):
                if "_specgen_layer_base" not in vars(layer) or not sandwich_capable(layer):
                    continue
                following = (getattr(layers[i + 1], "input_layernorm", None) if i + 1 < len(layers)
                             else getattr(parent, "norm", None))
                if following is not None and "_specgen_norm_base" in vars(following) and norm_offset(following):
                    layer._specgen_following = (following,)


# -- attention --------------------------------------------------------------------------------------


@functools.cache
def register() -> str:
    """Register the attention function and its mask (SDPA's) with transformers, once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


def switch_attention(model) -> None:
    """Make the model call attention() below (SDPA whenever a call does not pass the position)."""
    name = register()
    if model.config._attn_implementation == name:
        return
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # older transformers: the config attribute is what the attention layers read
        model.config._attn_implementation = name


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
              specgen_position=None, sliding_window=None, softcap=None, specgen_dependent=False, **kwargs):
    """transformers' attention-function protocol: query [B, H, q, D], key/value [B, KVH, C, D]
    (the whole cache) -> ([B, q, H, D], None). softcap: Gemma 2's attn_logit_softcapping, the
    keyword its attention module passes (transformers 5.17 to 5.23 at least); specgen_dependent:
    the runner's dependent launch (gpu/dependent.py)."""
    kwargs.pop("specgen_rope", None)  # a step whose module has no rotary path: the cache is written
    if specgen_position is None or query.shape[2] > attention_kernels.MAX_GRAPH_QUERY or kwargs.get("s_aux") is not None:
        if _placeholder(attention_mask):  # a runner's bug, never a user's: SDPA would attend to everything
            raise RuntimeError(f"a step without a mask made an attention call the kernel cannot take "
                               f"({query.shape[2]} query tokens, position {'given' if specgen_position is not None else 'missing'})")
        if softcap:  # SDPA cannot soft-cap: transformers 5.17 drops the keyword, later versions refuse it
            return softcapped_attention(module, query, key, value, attention_mask, dropout, scaling, softcap), None
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, sliding_window=sliding_window, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return attention_kernels.decode_attention(query, key, value, specgen_position, scale, sliding_window or 0,
                                              softcap=softcap or 0.0, dependent=specgen_dependent), None


# -- a step's inputs: rotary tables and no mask ------------------------------------------------------


class RotaryTable:
    """cos and sin of one rotary embedding module for positions 0 .. capacity - 1, side by side
    ([capacity, 2, D] in the model's dtype), computed once by the module's own forward."""

    def __init__(self, module, capacity: int, dtype: torch.dtype):
        device = module.inv_freq.device
        base = vars(module).get("_specgen_rotary_base", type(module))
        with torch.inference_mode():
            positions = torch.arange(capacity, device=device)[None]
            cos, sin = base.forward(module, torch.empty(0, dtype=dtype, device=device), positions)
            self.table = torch.stack([cos[0], sin[0]], dim=1)
        self.capacity = capacity
        self.current = None  # (cos, sin) a runner's step gathered already (gpu/step_io.py), for its forward

    def rows(self) -> torch.Tensor:
        """The table as [capacity, 2 * D]: gpu/step_io.py's view of it."""
        return self.table.view(self.capacity, -1)

    def lookup(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward's (cos, sin) [B, n, D] for position_ids [B, n] below the capacity: views of one gather."""
        rows = self.table[position_ids]
        return rows[..., 0, :], rows[..., 1, :]


def _rotary_forward(self, x, position_ids):
    table = self._specgen_table
    if table is None:
        return self._specgen_rotary_base.forward(self, x, position_ids)
    if table.current is not None:
        return table.current
    return table.lookup(position_ids)


@functools.cache
def _rotary_class(base: type) -> type:
    return type(f"Tabled{base.__name__}", (base,), {"forward": _rotary_forward})


def install_rotary(model) -> list:
    """Give the model's rotary embeddings (kernels.rotary_capable) a forward that reads a
    RotaryTable while one is set (rotary_tables()); returns those modules. Idempotent."""
    modules = []
    for module in model.modules():
        if not rotary_capable(module):
            continue
        if "_specgen_rotary_base" not in vars(module):
            module._specgen_rotary_base = type(module)
            module._specgen_table = None
            module.__class__ = _rotary_class(type(module))
        modules.append(module)
    return modules


@contextlib.contextmanager
def rotary_tables(tables: dict):
    """Each module (install_rotary's) reads its table for the duration: a runner's warm-ups and
    captures (the graphs keep the tables' memory, which the runner holds)."""
    saved = {module: module._specgen_table for module in tables}
    for module, table in tables.items():
        module._specgen_table = table
    try:
        yield
    finally:
        for module, table in saved.items():
            module._specgen_table = table


STEP_MASK_SHAPE = (1, 1, 1, 1)  # the placeholder's shape: no real mask of a step has one key


def mask_free(model) -> bool:
    """Whether every attention call of this model's steps takes the kernel, so a step needs no
    mask: switch_attention took effect (a model without transformers' attention interface keeps its
    own attention, which reads the mask) and no module has attention sinks (gpt-oss's `sinks`,
    which only SDPA takes here)."""
    if getattr(model.config, "_attn_implementation", None) != NAME:
        return False
    return not any(isinstance(getattr(module, "sinks", None), torch.Tensor) for module in model.modules())


def _placeholder(mask) -> bool:
    return isinstance(mask, torch.Tensor) and tuple(mask.shape) == STEP_MASK_SHAPE


# -- rotary embedding and the cache write inside the kernel ---------------------------------------


@functools.cache
def _rope_class(base: type) -> type:
    return type(f"Rope{base.__name__}", (base,), {"forward": _rope_forward})


def install_rope(model) -> int:
    """Give the model's rope-capable attention modules (kernels.rope_capable) a forward that, in a
    runner's step with `specgen_rope=True`, hands the un-rotated query, new keys and values to the
    kernel. Other calls keep the module's own forward. Returns how many modules were switched;
    idempotent."""
    switched = 0
    for module in model.modules():
        if "_specgen_rope_base" in vars(module) or not rope_capable(module):
            continue
        module._specgen_rope_base = type(module)
        module.__class__ = _rope_class(type(module))
        switched += 1
    return switched


@functools.cache
def _positional_names(base: type) -> tuple:
    """The names of base.forward's parameters after hidden_states that a caller may pass by position."""
    params = list(inspect.signature(base.forward).parameters.values())[2:]  # after self, hidden_states
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in params if p.kind in kinds)


def _by_name(base: type, args: tuple, kwargs: dict) -> dict | None:
    """kwargs with base.forward's positional arguments after hidden_states named, or None when
    there are more of them than it names."""
    if not args:
        return kwargs
    names = _positional_names(base)
    return {**dict(zip(names, args)), **kwargs} if len(args) <= len(names) else None


def _rope_forward(self, hidden_states, *args, **kwargs):
    base = self._specgen_rope_base
    named = _by_name(base, args, kwargs)  # read them by name, as the module's own forward would
    if named is None:
        return base.forward(self, hidden_states, *args, **kwargs)
    kwargs = named
    rope = kwargs.pop("specgen_rope", False)
    position = kwargs.get("specgen_position")
    embeddings = kwargs.get("position_embeddings")
    layer = kwargs.pop("specgen_slot", None)  # gpu/compiled.py's layer entry looked it up: no layer_idx here
    if layer is None:
        cache = next((kwargs[name] for name in CACHE_KEYWORDS if kwargs.get(name) is not None), None)
        layers = getattr(cache, "layers", None)
        layer = layers[self.layer_idx] if layers is not None and self.layer_idx < len(layers) else None
    tokens = hidden_states.shape[1]
    if (not rope or position is None or embeddings is None or layer is None
            or not getattr(layer, "is_initialized", False) or tokens > attention_kernels.MAX_GRAPH_QUERY
            or embeddings[0].shape[-1] != self.head_dim or kwargs.get("s_aux") is not None):
        return base.forward(self, hidden_states, **kwargs)
    batch, dim = hidden_states.shape[0], self.head_dim
    query = self.q_proj(hidden_states).view(batch, tokens, -1, dim)
    key = self.k_proj(hidden_states).view(batch, tokens, -1, dim)
    value = self.v_proj(hidden_states).view(batch, tokens, -1, dim)
    if hasattr(self, "q_norm"):  # Qwen3: RMSNorm over each head, before the rotary embedding
        query, key = self.q_norm(query), self.k_norm(key)
    cos, sin = embeddings
    window = getattr(self, "sliding_window", None)
    if window is None and base.__name__ == "MistralAttention":  # it passes the config's window per call
        window = getattr(self.config, "sliding_window", None)
    out = attention_kernels.decode_attention(query.transpose(1, 2), layer.keys, layer.values, position, self.scaling,
                                             window or 0, (key.transpose(1, 2), value.transpose(1, 2), cos, sin),
                                             softcap=getattr(self, "attn_logit_softcapping", None) or 0.0,
                                             dependent=kwargs.get("specgen_dependent", False))
    return self.o_proj(out.reshape(batch, tokens, -1)), None
