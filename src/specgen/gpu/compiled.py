"""`[speculation] compile`: torch.compile over one decoder layer, whose trace serves every layer.

Why a layer and not the whole step: dynamo traces what it compiles again at every start (the
compile cache holds inductor's output, not dynamo's trace), and a step of a 32-layer model is 32
copies of one layer, so tracing whole steps made a cached start of the Llama-3.1 8B/1B pair spend
about 40 s in dynamo. A layer's call takes its weights as inputs (dynamo inlines nn.Modules and
guards on their types, tensor shapes and constants, not on which module it is), so one trace per
step shape serves every layer of a model; what the step runs outside its layers (the embedding,
the last norm, the LM head, the logits copy) is a handful of specgen's kernels either way.

The one constant that differs between layers in a call is the attention's layer_idx, which picks
the layer's K/V from the cache: a constant dynamo specialises on, so each layer would trace again.
The region's entry (outside the compiled code) picks the cache layer and hands it to the attention
as `specgen_slot` (gpu/rewire.py's rotary path reads it). An attention module that looks its K/V
up itself (the step kernels off) still traces once per layer: correct, only slower to start.

Rewiring is by class, like gpu/rewire.py's: a layer takes the compiled call only while its
runner's CompiledLayers is engaged (inside a step_context), and its class's own forward otherwise.
A layer whose instance forward was replaced (accelerate's hooks) keeps it, uncompiled.

specgen's own kernels inside a layer are not compiled again: each call is one operator node
(gpu/opaque.py), launched as without compile, dependent launch included; inductor compiles what
runs between them. With every op of a layer on the step kernels, a compiled step runs what an
uncompiled one does (docs/benchmarks.md, "Compile with the step kernels as operators (H200)").
"""

from __future__ import annotations

import contextlib
import functools

import torch

from specgen.gpu.rewire import CACHE_KEYWORDS

# Cache entries per compiled function: a step shape per model per layer variant (Gemma 2's sliding
# and global layers), or per layer where attention looks its K/V up itself; past dynamo's default
# limit of 8, a frame would silently run uncompiled.
RECOMPILE_LIMIT = 1024


class CompiledLayers:
    """One model's decoder layers, compiled: `engaged()` routes their calls through `call`."""

    def __init__(self):
        self.active = False
        self.layers = 0  # how many of the model's layers take the compiled call
        self.call = torch.compile(_layer_body, dynamic=False)

    @contextlib.contextmanager
    def engaged(self):
        previous, self.active = self.active, True
        try:
            yield
        finally:
            self.active = previous


def _layer_body(layer, hidden_states, *args, **kwargs):
    """What dynamo traces: the layer's forward as its class before this rewiring defines it."""
    return layer._specgen_compiled_base.forward(layer, hidden_states, *args, **kwargs)


def _compiled_forward(self, hidden_states, *args, **kwargs):
    region = self._specgen_compiled
    if not region.active:
        return self._specgen_compiled_base.forward(self, hidden_states, *args, **kwargs)
    attention = getattr(self, "self_attn", None)
    cache = next((kwargs[name] for name in CACHE_KEYWORDS if kwargs.get(name) is not None), None)
    layers = getattr(cache, "layers", None)
    index = getattr(attention, "layer_idx", None)
    if "_specgen_rope_base" in vars(attention or object()) and layers is not None and isinstance(index, int) \
            and index < len(layers):
        kwargs["specgen_slot"] = layers[index]
    return region.call(self, hidden_states, *args, **kwargs)


@functools.cache
def _compiled_class(base: type) -> type:
    return type(f"Compiled{base.__name__}", (base,), {"forward": _compiled_forward})


def install(model) -> CompiledLayers:
    """Give the model's decoder layers the compiled call while the returned object is engaged.
    Idempotent: a second install (another runner on the same model) hands the layers a new object."""
    import specgen.gpu.opaque  # noqa: F401  (registers the step kernels' operators before dynamo traces a layer)

    region = CompiledLayers()
    _raise_recompile_limit()
    layers = getattr(getattr(model, "model", None), "layers", None)  # transformers' models
    for module in layers if isinstance(layers, torch.nn.ModuleList) else ():
        if "forward" in vars(module):  # accelerate's hooks (or the user's): keep them, uncompiled
            continue
        if "_specgen_compiled_base" not in vars(module):
            module._specgen_compiled_base = type(module)
            module.__class__ = _compiled_class(type(module))
        module._specgen_compiled = region
        region.layers += 1
    return region


def _raise_recompile_limit() -> None:
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(RECOMPILE_LIMIT, getattr(config, name)))
