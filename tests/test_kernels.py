"""gpu/kernels.py: the profile's [kernels] settings resolved for a device and a model; and
gpu/workspace.py, the kernels' per-device state."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from specgen.core.errors import UsageError
from specgen.core.settings import KernelSpec
from specgen.gpu.kernels import ResolvedKernels, resolve, split_k_pays
from specgen.gpu.workspace import MIN_ELEMENTS, Workspace

CPU = torch.device("cpu")


def _tiny(family: str = "Llama", dtype=torch.float32, **extra):
    import transformers

    values = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    config = getattr(transformers, f"{family}Config")(**{**values, **extra})
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    return model.to(dtype).eval()


def test_auto_resolves_everything_off_on_cpu():
    resolved = resolve(KernelSpec(), CPU, _tiny())
    assert resolved == ResolvedKernels(attention=False, linear=False, rope=False, split_k=False, warp=False,
                                       norm=False, head=False)
    assert resolved.as_dict() == {"attention": "sdpa", "linear": "torch", "rope": "model", "split_k": "off",
                                  "warp": "torch", "linear_table": "package", "norm": "torch", "head": "torch",
                                  "step_io": "torch", "dependent_launch": "off"}


def test_explicit_values_win_on_cpu():
    """What the CPU tests ask for: the kernels in the Triton interpreter."""
    spec = KernelSpec(attention="kernel", linear="kernel", rope="kernel", split_k="on", warp="kernel", step_io="kernel")
    resolved = resolve(spec, CPU, _tiny())
    assert resolved == ResolvedKernels(attention=True, linear=True, rope=True, split_k=True, warp=True, norm=True,
                                       head=True, step_io=True)
    assert resolved.as_dict() == {"attention": "kernel", "linear": "kernel", "rope": "kernel", "split_k": "on",
                                  "warp": "kernel", "linear_table": "package", "norm": "kernel", "head": "kernel",
                                  "step_io": "kernel", "dependent_launch": "off"}


def test_norm_auto_follows_the_linear_kernel():
    assert resolve(KernelSpec(linear="kernel"), CPU, _tiny()).norm  # Llama's RMSNorm
    assert resolve(KernelSpec(linear="kernel"), CPU, _tiny("Qwen3")).norm
    assert not resolve(KernelSpec(linear="kernel", norm="torch"), CPU, _tiny()).norm
    assert not resolve(KernelSpec(linear="torch"), CPU, _tiny()).norm


def test_soft_capped_attention_takes_the_kernel_and_its_rotary():
    """Gemma 2 (attention logit soft-capping): the attention kernel on request, and its rotary path."""
    resolved = resolve(KernelSpec(attention="kernel"), CPU, _tiny("Gemma2", head_dim=16))
    assert resolved.attention and resolved.rope


def test_head_auto_follows_the_linear_kernel():
    assert resolve(KernelSpec(linear="kernel"), CPU, _tiny()).head
    assert resolve(KernelSpec(linear="kernel", attention="sdpa", norm="torch"), CPU, _tiny()).head
    assert not resolve(KernelSpec(linear="kernel", head="torch"), CPU, _tiny()).head
    assert not resolve(KernelSpec(linear="torch"), CPU, _tiny()).head


def test_rope_auto_follows_the_attention_kernel():
    assert resolve(KernelSpec(attention="kernel"), CPU, _tiny()).rope  # Llama: rotary path
    assert not resolve(KernelSpec(attention="kernel", rope="model"), CPU, _tiny()).rope
    assert not resolve(KernelSpec(attention="sdpa"), CPU, _tiny()).rope


@pytest.mark.parametrize(
    ("spec", "model", "message"),
    [
        (KernelSpec(attention="kernel"), ("Llama", {"hidden_size": 1024, "num_attention_heads": 2,
                                                    "num_key_value_heads": 1}), "head_dim 512"),
        (KernelSpec(attention="kernel"), ("Llama", {"attention_chunk_size": 8}), "attention_chunk_size"),
        (KernelSpec(attention="sdpa", rope="kernel"), ("Llama", {}), "needs the attention kernel"),
        (KernelSpec(linear="torch", split_k="on"), ("Llama", {}), "needs the linear kernel"),
        (KernelSpec(linear="torch", norm="kernel"), ("Llama", {}), "runs in the linear kernel's steps"),
        (KernelSpec(linear="torch", head="kernel"), ("Llama", {}), "a head runs on the linear kernel"),
    ],
)
def test_values_the_model_cannot_take_are_usage_errors(spec, model, message):
    family, extra = model
    with pytest.raises(UsageError, match=message) as caught:
        resolve(spec, CPU, _tiny(family, **extra))
    assert caught.value.exit_code == 2 and "[kernels]" in caught.value.message and caught.value.hint


def test_linear_kernel_refuses_weights_it_does_not_take():
    model = _tiny().to(torch.float64)
    with pytest.raises(UsageError, match="float64"):
        resolve(KernelSpec(linear="kernel"), CPU, model)
    assert not resolve(KernelSpec(), CPU, model).linear


H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=79 * 2**30,
                       memory_clock_rate=2_619_000, memory_bus_width=5120)
H200 = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=140 * 2**30,
                       memory_clock_rate=3_201_000, memory_bus_width=6144)


def test_split_k_auto_follows_bandwidth_not_the_name():
    """Measured: faster on the H200, slower on the H100 80GB; decided by peak bandwidth (memory
    clock x bus width), or memory size where torch does not report those; off where unmeasured."""
    assert split_k_pays(H200) and not split_k_pays(H100)
    renamed = SimpleNamespace(**{**vars(H100), "name": "NVIDIA H200"})
    assert not split_k_pays(renamed)  # the name plays no part
    unreported = [SimpleNamespace(**{**vars(gpu), "memory_clock_rate": 0, "memory_bus_width": 0}) for gpu in (H100, H200)]
    assert [split_k_pays(gpu) for gpu in unreported] == [False, True]
    in_mhz = [SimpleNamespace(**{**vars(gpu), "memory_clock_rate": gpu.memory_clock_rate // 1000}) for gpu in (H100, H200)]
    assert [split_k_pays(gpu) for gpu in in_mhz] == [False, True]  # implausible: the memory size decides
    a100 = SimpleNamespace(major=8, minor=0, total_memory=80 * 2**30, memory_clock_rate=1_593_000, memory_bus_width=5120)
    blackwell = SimpleNamespace(**{**vars(H200), "major": 10})
    assert not split_k_pays(a100) and not split_k_pays(blackwell)


def test_workspace_buffers_grow_and_every_buffer_stays_alive():
    workspace = Workspace(CPU)
    first = workspace.scratch("part", 10)
    assert first.numel() == MIN_ELEMENTS and first.dtype == torch.float32
    assert workspace.scratch("part", MIN_ELEMENTS) is first  # fits: the same buffer
    grown = workspace.scratch("part", MIN_ELEMENTS + 1)
    assert grown is not first and grown.numel() == MIN_ELEMENTS + 1 and workspace.get("part") is grown
    assert any(b is first for b in workspace.buffers) and any(b is grown for b in workspace.buffers)
    counters = workspace.zeros("counters", 5)
    assert counters.dtype == torch.int32 and int(counters.abs().sum()) == 0
    assert workspace.get("missing") is None


def test_workspace_error_flag_and_clear():
    workspace = Workspace("cpu")
    assert workspace.error.shape == (1,) and workspace.error.dtype == torch.int32 and int(workspace.error) == 0
    assert any(b is workspace.error for b in workspace.buffers)
    workspace.error.fill_(3)
    workspace.clear_error()
    assert int(workspace.error) == 0


def test_resolving_and_references_need_no_triton():
    """gpu/kernels.py, gpu/workspace.py and gpu/reference.py import without Triton (the torch backend
    resolves settings and the CPU tests use the references); so do core's modules."""
    code = ("import sys; sys.modules['triton'] = None; "
            "import specgen.gpu.kernels, specgen.gpu.workspace, specgen.gpu.reference, specgen.gpu.runner; "
            "import specgen.core.backend, specgen.core.decode, specgen.core.engine; "
            "from specgen.core.settings import KernelSpec; from specgen.gpu.kernels import triton_available; "
            "assert not triton_available()")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_auto_on_cuda_takes_the_kernels_the_model_allows(monkeypatch):
    """On a CUDA device `auto` is today's default: every kernel where the model allows it (no GPU
    call is needed to decide these; split-K's device facts are tested above)."""
    from specgen.gpu import kernels

    cuda = torch.device("cuda")
    spec = KernelSpec(split_k="off")
    monkeypatch.setattr(kernels, "_properties", lambda device: H200)
    assert resolve(spec, cuda, _tiny()) == ResolvedKernels(True, True, True, False, True, norm=True, head=True,
                                                           step_io=True, dependent_launch=True)
    # Gemma 2: soft-capped attention with its rotary and its (1 + w) norms in the kernels
    assert resolve(spec, cuda, _tiny("Gemma2", head_dim=16)) == ResolvedKernels(True, True, True, False, True, norm=True,
                                                                                head=True, step_io=True,
                                                                                dependent_launch=True)
    assert not resolve(spec, cuda, _tiny("Llama", attention_chunk_size=8)).attention
    assert not resolve(spec, cuda, _tiny().to(torch.float64)).linear
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    assert resolve(spec, cuda, _tiny()) == ResolvedKernels(False, False, False, False, False)
    for key in ("attention", "linear", "warp", "step_io"):
        with pytest.raises(UsageError, match=f'{key} = "kernel" needs Triton'):
            resolve(KernelSpec(**{key: "kernel"}), CPU, _tiny())


def test_dependent_launch_needs_hopper_and_step_kernels(monkeypatch):
    """`auto`: on for sm_90+ GPUs whose steps run specgen's kernels; `on` where it cannot apply is a
    usage error naming the reason; `off` always wins."""
    from specgen.gpu import kernels

    cuda = torch.device("cuda")
    gpu = {"props": H200}
    monkeypatch.setattr(kernels, "_properties", lambda device: gpu["props"])
    assert resolve(KernelSpec(), cuda, _tiny()).dependent_launch
    assert not resolve(KernelSpec(dependent_launch="off"), cuda, _tiny()).dependent_launch
    plain = KernelSpec(attention="sdpa", linear="torch", step_io="torch")
    assert not resolve(plain, cuda, _tiny()).dependent_launch
    assert resolve(KernelSpec(attention="sdpa", linear="torch"), cuda, _tiny()).dependent_launch  # step_io alone
    gpu["props"] = SimpleNamespace(**{**vars(H200), "major": 8})  # an A100
    assert not resolve(KernelSpec(), cuda, _tiny()).dependent_launch
    with pytest.raises(UsageError, match='dependent_launch = "on": it needs an NVIDIA GPU of compute capability 9.0'):
        resolve(KernelSpec(dependent_launch="on"), cuda, _tiny())
    gpu["props"] = H200
    assert resolve(KernelSpec(dependent_launch="on"), cuda, _tiny()).dependent_launch
    with pytest.raises(UsageError, match="uses none of them"):
        resolve(dataclasses.replace(plain, dependent_launch="on"), cuda, _tiny())
    with pytest.raises(UsageError, match="compute capability"):
        resolve(KernelSpec(dependent_launch="on", attention="kernel"), CPU, _tiny())
