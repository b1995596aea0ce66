"""Which kernels a run uses: the profile's [kernels] settings resolved for one device and model.

`resolve(spec, device, model)` turns core/settings.py's KernelSpec (strings, `auto` by default)
into ResolvedKernels (booleans). An explicit value wins; one the device or model cannot take is a
UsageError that says what to set instead. `auto` is decided from facts about the device and the
model, never from the GPU's name. On CPU every `auto` resolves off (the Triton interpreter is for
tests, which ask for kernels explicitly).

It imports torch only: resolving needs no Triton.
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
    # gpu/ops.py's table launches with it
    linear_table: LinearTable = field(default_factory=linear_table.packaged)
    norm: bool = False  # gpu/norm.py for RMSNorm and the residual add before it (with the linear kernel)
    head: bool = False  # an EAGLE-3 head's round calls on these kernels (gpu/ops.py's table; a target's)
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
    if value == "kernel" and not attention:
        why = "it needs the attention kernel"
        raise UsageError(f"[kernels] rope = \"kernel\": {why}", hint='Set rope = "auto" or "model" in [kernels].')
    return attention


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
    if value == "kernel" and not linear:
        why = "it runs in the linear kernel's steps, which this run does not use"
        raise UsageError(f"[kernels] norm = \"kernel\": {why}", hint='Set norm = "auto" or "torch" in [kernels].')
    return linear


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


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
