"""Which kernels a run uses: the profile's [kernels] settings resolved for one device and model.

`resolve(spec, device, model)` turns core/settings.py's KernelSpec (strings, `auto` by default)
into ResolvedKernels (booleans). An explicit value wins; one the device or model cannot take is a
UsageError that says what to set instead. `auto` is decided from facts about the device and the
model, never from the GPU's name. On CPU every `auto` resolves off (the Triton interpreter is for
tests, which ask for kernels explicitly).

This module also holds those facts about models (which attention the kernel computes, which
modules take the rotary path), so it imports torch only: resolving needs no Triton.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from specgen.core.errors import UsageError
from specgen.core.settings import KernelSpec
from specgen.gpu import linear_table
from specgen.gpu.linear_table import LinearTable

LINEAR_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Attention modules whose forward is q/k/v projections -> (Qwen3: per-head q/k RMSNorm) ->
# rotate-half rotary embedding -> cache update -> attention (Gemma 2: soft-capped) -> o_proj, which
# gpu/rewire.py's rotary path reproduces inside the kernel.
ROPE_CLASSES = ("LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention", "Gemma2Attention")
ROPE_ATTRIBUTES = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "layer_idx")
# RMSNorm modules computing weight * (x * rsqrt(mean(x^2) + eps)).to(dtype) (gpu/norm.py's kernel),
# or, OFFSET_NORM_CLASSES, ((x * rsqrt(mean(x^2) + eps)) * (1 + weight)).to(dtype) (its `offset`);
# and decoder layers whose forward is norm -> attention -> add -> norm -> MLP -> add, which
# gpu/rewire.py reproduces with the add and the norm after it in one kernel.
OFFSET_NORM_CLASSES = ("GemmaRMSNorm", "Gemma2RMSNorm")
NORM_CLASSES = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", *OFFSET_NORM_CLASSES)
LAYER_CLASSES = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")
# Decoder layers whose forward is norm -> attention -> norm -> add -> norm -> MLP -> norm -> add
# (Gemma 2's four norms), which gpu/rewire.py reproduces with each add between the norms around it.
SANDWICH_LAYER_CLASSES = ("Gemma2DecoderLayer",)
SANDWICH_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm")
# Rotary embeddings whose forward(x, position_ids) is cos and sin of position x fixed frequencies
# (rope types without a dynamic update): a step reads them from a table (gpu/rewire.py).
ROTARY_CLASSES = ("LlamaRotaryEmbedding", "MistralRotaryEmbedding", "Qwen2RotaryEmbedding", "Qwen3RotaryEmbedding",
                  "Gemma2RotaryEmbedding", "GemmaRotaryEmbedding")
# Split-K's threshold on peak memory bandwidth, see split_k_pays().
SPLIT_K_BANDWIDTH = 4.0e12  # bytes/s
SPLIT_K_MEMORY = 100 * 2**30  # bytes, when torch does not report the memory clock and bus width
SPLIT_K_PLAUSIBLE = 1.0e12  # bytes/s: every sm_90 part has more; a smaller product is not a bandwidth


@dataclass(frozen=True)
class ResolvedKernels:
    """The kernels one runner (and the round around it) uses."""

    attention: bool  # gpu/attention.py for steps of up to 64 tokens, else SDPA
    linear: bool  # gpu/linear.py for steps of up to 16 tokens, else F.linear
    rope: bool  # rotary embedding and cache write inside the attention kernel
    split_k: bool  # the linear kernel splits K for the shapes that gain from it
    warp: bool  # gpu/warp.py and gpu/verify.py, else core/sampling.py and core/rejection.py
    # the linear kernel's configurations by shape: this machine's tuned table over the package's;
    # runners hand it to gpu/rewire.py's install_linear
    linear_table: LinearTable = field(default_factory=linear_table.packaged)
    norm: bool = False  # gpu/norm.py for RMSNorm and the residual add before it (with the linear kernel)
    head: bool = False  # an EAGLE-3 head's round calls on these kernels (gpu/rewire_head.py; a target's)
    step_io: bool = False  # gpu/step_io.py: a step's positions, embedding and rotary rows, then its logits copy
    dependent_launch: bool = False  # the step kernels above launched dependent on the one before (gpu/dependent.py)

    def as_dict(self) -> dict[str, str]:
        """The resolved values in the profile's words, for reports (`bench --format json`, `-v`)."""
        return {
            "attention": "kernel" if self.attention else "sdpa",
            "linear": "kernel" if self.linear else "torch",
            "rope": "kernel" if self.rope else "model",
            "split_k": "on" if self.split_k else "off",
            "warp": "kernel" if self.warp else "torch",
            "linear_table": self.linear_table.source,
            "norm": "kernel" if self.norm else "torch",
            "head": "kernel" if self.head else "torch",
            "step_io": "kernel" if self.step_io else "torch",
            "dependent_launch": "on" if self.dependent_launch else "off",
        }


def resolve(spec: KernelSpec, device: torch.device, model) -> ResolvedKernels:
    """spec's values for `model` on `device`; raises UsageError for a value they cannot take."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    attention = _attention(spec.attention, cuda, model)
    linear = _linear(spec.linear, cuda, model)
    step_io = _step_io(spec.step_io, cuda)
    return ResolvedKernels(
        attention=attention,
        linear=linear,
        rope=_rope(spec.rope, attention, model),
        split_k=_split_k(spec.split_k, linear, device),
        warp=_warp(spec.warp, cuda),
        linear_table=_table(spec.tables) if linear else linear_table.packaged(),
        norm=_norm(spec.norm, linear, model),
        head=_head(spec.head, linear),
        step_io=step_io,
        dependent_launch=_dependent(spec.dependent_launch, attention or linear or step_io, device),
    )


def _attention(value: str, cuda: bool, model) -> bool:
    if value == "sdpa":
        return False
    reason = attention_unsupported(model.config)
    if value == "kernel" and reason is not None:
        raise UsageError(f"[kernels] attention = \"kernel\": the attention kernel cannot compute this model's "
                         f"attention ({reason})", hint='Set attention = "auto" or "sdpa" in [kernels].')
    return _triton("attention", value, "sdpa") or (cuda and reason is None and triton_available())


def _linear(value: str, cuda: bool, model) -> bool:
    if value == "torch":
        return False
    dtype = model.get_output_embeddings().weight.dtype
    if value == "kernel" and dtype not in LINEAR_DTYPES:
        raise UsageError(f"[kernels] linear = \"kernel\": the linear kernel does not take {dtype} weights",
                         hint='Set linear = "auto" or "torch" in [kernels], or load the model in bfloat16.')
    return _triton("linear", value, "torch") or (cuda and dtype in LINEAR_DTYPES and triton_available())


def _table(folder: str) -> LinearTable:
    try:
        return linear_table.for_run(folder)
    except linear_table.TableError as exc:
        raise UsageError(f"the linear kernel's tuned table cannot be read: {exc}",
                         hint="Run `specgen tune-kernels` again, or delete that file.") from None


def _rope(value: str, attention: bool, model) -> bool:
    if value == "model":
        return False
    capable = attention and (_owned(model) or rope_modules(model) > 0)
    if value == "kernel" and not capable:
        why = "it needs the attention kernel" if not attention else \
            f"the model has no attention module of {', '.join(ROPE_CLASSES)}"
        raise UsageError(f"[kernels] rope = \"kernel\": {why}", hint='Set rope = "auto" or "model" in [kernels].')
    return capable


def _owned(model) -> bool:
    """specgen's own model (core/step/): its table (gpu/ops.py) runs rotary and norms in the kernels."""
    from specgen.core.step.model import OwnedModel

    return isinstance(model, OwnedModel)


def _split_k(value: str, linear: bool, device: torch.device) -> bool:
    if value == "off":
        return False
    if value == "on" and not linear:
        raise UsageError('[kernels] split_k = "on" needs the linear kernel, which this run does not use',
                         hint='Set split_k = "auto" or "off", or linear = "kernel", in [kernels].')
    return value == "on" or (linear and device.type == "cuda" and split_k_pays(_properties(device)))


def _warp(value: str, cuda: bool) -> bool:
    if value == "torch":
        return False
    return _triton("warp", value, "torch") or (cuda and triton_available())


def _step_io(value: str, cuda: bool) -> bool:
    if value == "torch":
        return False
    return _triton("step_io", value, "torch") or (cuda and triton_available())


def _dependent(value: str, kernels: bool, device: torch.device) -> bool:
    if value == "off":
        return False
    why = None
    if not kernels:
        why = "it changes how the step kernels launch, and this run uses none of them"
    elif device.type != "cuda" or _properties(device).major < 9:
        why = "it needs an NVIDIA GPU of compute capability 9.0 or later (Hopper)"
    if value == "on" and why is not None:
        raise UsageError(f'[kernels] dependent_launch = "on": {why}', hint='Set dependent_launch = "auto" or "off" in [kernels].')
    return why is None


def _norm(value: str, linear: bool, model) -> bool:
    if value == "torch":
        return False
    capable = linear and (_owned(model) or norm_modules(model) > 0)
    if value == "kernel" and not capable:
        why = "it runs in the linear kernel's steps, which this run does not use" if not linear else \
            f"the model has no RMSNorm of {', '.join(NORM_CLASSES)}"
        raise UsageError(f"[kernels] norm = \"kernel\": {why}", hint='Set norm = "auto" or "torch" in [kernels].')
    return capable


def _head(value: str, linear: bool) -> bool:
    if value == "torch":
        return False
    if value == "kernel" and not linear:
        raise UsageError('[kernels] head = "kernel": a head runs on the linear kernel, which this run does not use',
                         hint='Set head = "auto" or "torch", or linear = "kernel", in [kernels].')
    return linear


def _triton(key: str, value: str, other: str) -> bool:
    """Whether `value` asks for the kernel explicitly; UsageError when Triton is not installed."""
    if value == "kernel" and not triton_available():
        raise UsageError(f'[kernels] {key} = "kernel" needs Triton, which is not installed',
                         hint=f'Set {key} = "auto" or "{other}" in [kernels], or install triton.')
    return value == "kernel"


def split_k_pays(props) -> bool:
    """Whether split-K is on under `auto` for a GPU with these torch.cuda device properties.

    Measured (`git show 1b54921:docs/benchmarks.md`, "Llama-3-8B-shaped step against the bandwidth
    floor"): faster on an H200 (141 GB of HBM3e, 4.8 TB/s) and slower on an H100 80GB (HBM3,
    3.35 TB/s), the same sm_90 chip with the same 132 SMs. Split-K puts more programs in flight per
    output column block; that pays only where each SM has more bandwidth to fill than one program
    per block can draw, so the fact that decides is peak memory bandwidth, taken from the memory
    clock and bus width where torch reports them, else from the memory size (on sm_90, more than 100
    GiB means HBM3e). Other architectures were not measured: off.
    """
    if (props.major, props.minor) != (9, 0):
        return False
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0  # CUDA's memoryClockRate, kHz
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    bandwidth = 2 * clock_khz * 1e3 * bus_bits / 8  # double data rate, bytes/s
    if bandwidth > SPLIT_K_PLAUSIBLE:
        return bandwidth >= SPLIT_K_BANDWIDTH
    # not reported (CUDA 13 dropped the field from cudaDeviceProp), or in other units
    return props.total_memory > SPLIT_K_MEMORY


def _properties(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_properties(index)


def attention_unsupported(config) -> str | None:
    """None when the attention kernel computes this model's attention exactly, else why not.
    Logit soft-capping (attn_logit_softcapping) is the kernel's `softcap`; final_logit_softcapping
    is the model's own op on its logits."""
    text = config.get_text_config(decoder=True)
    if getattr(text, "attention_chunk_size", None):
        return "attention_chunk_size is set"
    if getattr(text, "use_bidirectional_attention", False):
        return "bidirectional attention"
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if head_dim > 256:
        return f"head_dim {head_dim} > 256"
    return None


def rope_capable(module) -> bool:
    """An attention module whose forward gpu/rewire.py's rotary path reproduces (its own class,
    before rewiring, is one of ROPE_CLASSES: a subclass may change what the forward does)."""
    base = vars(module).get("_specgen_rope_base", type(module))
    return base.__name__ in ROPE_CLASSES and all(hasattr(module, name) for name in ROPE_ATTRIBUTES)


def rope_modules(model) -> int:
    return sum(rope_capable(module) for module in model.modules())


def rotary_capable(module) -> bool:
    """A rotary embedding whose values depend on the position alone (its own class is one of
    ROTARY_CLASSES and its rope type has no dynamic update: "dynamic" and "longrope" change their
    frequencies with the sequence's length)."""
    base = vars(module).get("_specgen_rotary_base", type(module))
    kind = getattr(module, "rope_type", None)
    return (base.__name__ in ROTARY_CLASSES and isinstance(kind, str) and "dynamic" not in kind
            and kind != "longrope" and isinstance(getattr(module, "inv_freq", None), torch.Tensor))


def norm_capable(module) -> bool:
    """An RMSNorm whose forward gpu/norm.py computes (its own class is one of NORM_CLASSES)."""
    if module is None:
        return False
    base = vars(module).get("_specgen_norm_base", type(module))
    return base.__name__ in NORM_CLASSES and hasattr(module, "weight") and norm_eps(module) is not None


def norm_eps(module) -> float | None:
    """An RMSNorm's epsilon: `variance_epsilon` (Llama and its copies) or `eps` (Gemma's)."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return float(eps) if isinstance(eps, (int, float)) else None


def norm_offset(module) -> bool:
    """Whether an RMSNorm scales by 1 + weight (Gemma's form, OFFSET_NORM_CLASSES)."""
    return vars(module).get("_specgen_norm_base", type(module)).__name__ in OFFSET_NORM_CLASSES


def layer_capable(module) -> bool:
    """A decoder layer whose forward gpu/rewire.py reproduces with the residual add in the norm kernel."""
    base = vars(module).get("_specgen_layer_base", type(module))
    return base.__name__ in LAYER_CLASSES and all(
        norm_capable(getattr(module, name, None)) for name in ("input_layernorm", "post_attention_layernorm"))


def sandwich_capable(module) -> bool:
    """A Gemma 2 decoder layer (SANDWICH_LAYER_CLASSES) whose four norms take Gemma's form in the
    norm kernel: gpu/rewire.py runs each residual add in the norm kernel beside the norms around it."""
    base = vars(module).get("_specgen_layer_base", type(module))
    return base.__name__ in SANDWICH_LAYER_CLASSES and all(
        norm_capable(getattr(module, name, None)) and norm_offset(getattr(module, name)) for name in SANDWICH_NORMS)


def norm_modules(model) -> int:
    return sum(norm_capable(module) for module in model.modules())


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
