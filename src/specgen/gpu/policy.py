"""Which kernels a run uses: the profile's [kernels] policy resolved for one device and model.

`resolve(spec, device, model)` turns core/settings.py's KernelSpec (the attention and linear
choices, the tables' folder, the fusions `disable` turns off) into ResolvedKernels, the one policy
object runners and the kernel table (gpu/ops.py) read. An explicit value wins; one the device or
model cannot take is a UsageError that says what to set instead. `auto` is decided from facts
about the device and the model, never from the GPU's name. On CPU every `auto` resolves off (the
Triton interpreter is for tests, which ask for kernels explicitly).

It imports torch only: resolving needs no Triton.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from specgen.core.errors import UsageError
from specgen.core.settings import KernelSpec
from specgen.gpu.tuning import linear_table
from specgen.gpu.tuning.linear_table import LinearTable

LINEAR_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Split-K's threshold on peak memory bandwidth, see split_k_pays().
SPLIT_K_BANDWIDTH = 4.0e12  # bytes/s
SPLIT_K_MEMORY = 100 * 2**30  # bytes, when torch does not report the memory clock and bus width
SPLIT_K_PLAUSIBLE = 1.0e12  # bytes/s: every sm_90 part has more; a smaller product is not a bandwidth


@dataclass(frozen=True)
class ResolvedKernels:
    """The kernels one runner (and the round around it) uses."""

    attention: bool  # gpu/kernels/attention.py for steps of up to 64 tokens, else SDPA
    linear: bool  # gpu/kernels/linear.py for steps of up to 64 rows, else F.linear
    rope: bool  # rotary embedding and cache write inside the attention kernel
    split_k: bool  # the linear kernel splits K for the shapes that gain from it
    warp: bool  # gpu/kernels/warp.py and gpu/kernels/verify.py, else core/sampling/warp.py and core/sampling/rejection.py
    # the linear kernel's configurations by shape: this machine's tuned table over the package's;
    # gpu/ops.py's table launches with it
    linear_table: LinearTable = field(default_factory=linear_table.packaged)
    norm: bool = False  # gpu/kernels/norm.py for RMSNorm and the residual add before it (with the linear kernel)
    head: bool = False  # an EAGLE-3 head's round calls on these kernels (gpu/ops.py's table; a target's)
    step_io: bool = False  # gpu/kernels/step_io.py: a step's positions, embedding and rotary rows, then its logits copy
    dependent_launch: bool = False  # the step kernels above launched dependent on the one before (gpu/kernels/dependent.py)
    # What `launches` counts, set by resolve() where the linear kernel runs: the model's projections
    # as its table calls them (linear_table.model_shapes; None where the config names no such sizes)
    # and its weights' dtype. Facts about the model for reports, not choices: not compared.
    projections: tuple | None = field(default=None, compare=False)
    weight_dtype: torch.dtype | None = field(default=None, compare=False)

    @property
    def launches(self) -> tuple[int, int] | None:
        """(the model's (projection, row class) pairs whose tall calls this runner's table gives a
        launch, the pairs that run a tensor-core configuration): LinearTable.coverage under this
        runner's split-K, so a draft's table (for_drafts, replaced in after resolve) counts its own
        picks. None where no launch can apply: the linear kernel off, weights of more than 16 bits
        (gpu/kernels/linear.py launches only 16-bit calls), or projections unknown."""
        if not self.linear or self.projections is None or self.weight_dtype is None or self.weight_dtype.itemsize > 2:
            return None
        return self.linear_table.coverage(self.projections, self.split_k)

    def as_dict(self) -> dict[str, str]:
        """The resolved values, for reports (`bench --format json`, `-v`): the two choices, the
        linear table and, with the linear kernel, how much of the model's tall calls its launches
        cover (linear_launches, e.g. "9 of 15 (projection, row class)"), and each fusion, on or off."""
        launches = {"linear_launches": self._launches_text()} if self.linear else {}
        return {"attention": "kernel" if self.attention else "sdpa", "linear": "kernel" if self.linear else "torch",
                "linear_table": self.linear_table.source, **launches,
                **{name: "on" if value else "off" for name, value in self.fusions().items()}}

    def _launches_text(self) -> str:
        if self.projections is None or self.weight_dtype is None:
            return "unknown (no projection sizes in the model's config)"
        if self.weight_dtype.itemsize > 2:
            return f"none ({str(self.weight_dtype).removeprefix('torch.')} weights)"
        provided, pairs = self.launches
        return f"{provided} of {pairs} (projection, row class)" if pairs else "none (no tensor-core picks)"

    def fusions(self) -> dict[str, bool]:
        """Each fusion of core/settings.py's FUSIONS, on or off."""
        return {"rope": self.rope, "norm": self.norm, "head": self.head, "step_io": self.step_io,
                "dependent_launch": self.dependent_launch, "split_k": self.split_k, "round": self.warp}


def resolve(spec: KernelSpec, device: torch.device, model) -> ResolvedKernels:
    """spec's policy for `model` on `device`; raises UsageError for a value they cannot take.

    attention and linear: an explicit `kernel` wins (on the CPU: the Triton interpreter, for
    tests), `auto` takes the kernel on CUDA where it computes the model. Every fusion is then on
    wherever it applies unless `disable` names it: rope with the attention kernel; norm and head
    with the linear kernel; split_k with the linear kernel where the GPU's bandwidth pays
    (split_k_pays); step_io and round (the round's kernels) on CUDA with Triton, step_io also
    where a step kernel was asked for explicitly; dependent_launch on Hopper or later where a step
    kernel runs."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    off = set(spec.disable)
    attention = _attention(spec.attention, cuda, model)
    linear = _linear(spec.linear, cuda, model)
    triton = triton_available()
    step_io = "step_io" not in off and ((cuda and triton) or "kernel" in (spec.attention, spec.linear))
    return ResolvedKernels(
        attention=attention,
        linear=linear,
        rope=attention and "rope" not in off,
        split_k=linear and "split_k" not in off and cuda and split_k_pays(_properties(device)),
        warp=cuda and triton and "round" not in off,
        linear_table=_table(spec.tables) if linear else linear_table.packaged(),
        norm=linear and "norm" not in off,
        head=linear and "head" not in off,
        step_io=step_io,
        dependent_launch=("dependent_launch" not in off and (attention or linear or step_io) and cuda
                          and _properties(device).major >= 9),
        projections=_projections(model.config) if linear else None,
        weight_dtype=model.get_output_embeddings().weight.dtype if linear else None,
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


def _projections(config) -> tuple | None:
    """The model's projection shapes, for the launch count; None where its config does not name
    their sizes (a report only: no reason to refuse a model the kernels run)."""
    try:
        shapes = tuple(linear_table.model_shapes(config))
    except (AttributeError, TypeError):
        return None
    return shapes if all(isinstance(size, int) for n, k, _ in shapes for size in (n, k)) else None


def _table(folder: str) -> LinearTable:
    try:
        return linear_table.for_run(folder)
    except linear_table.TableError as exc:
        raise UsageError(f"the linear kernel's tuned table cannot be read: {exc}",
                         hint="Run `specgen tune-kernels` again, or delete that file.") from None


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
