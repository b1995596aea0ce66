"""gpu/policy.py: the profile's [kernels] settings resolved for a device and a model; and
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
from specgen.gpu.policy import ResolvedKernels, resolve, split_k_pays
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
    assert resolved.as_dict() == {"attention": "sdpa", "linear": "torch", "linear_table": "package", "rope": "off",
                                  "norm": "off", "head": "off", "step_io": "off", "dependent_launch": "off",
                                  "split_k": "off", "round": "off"}


def test_explicit_kernels_win_on_cpu_and_fusions_follow_them():
    """What the CPU tests ask for: the kernels in the Triton interpreter; each fusion follows the
    kernel it belongs to (split-K and the round's kernels only on CUDA)."""
    resolved = resolve(KernelSpec(attention="kernel", linear="kernel"), CPU, _tiny())
    assert resolved == ResolvedKernels(attention=True, linear=True, rope=True, split_k=False, warp=False, norm=True,
                                       head=True, step_io=True)
    assert resolve(KernelSpec(attention="kernel"), CPU, _tiny("Gemma2", head_dim=16)).rope  # soft-capped too
    only_linear = resolve(KernelSpec(linear="kernel"), CPU, _tiny("Qwen3"))
    assert only_linear.norm and only_linear.head and not only_linear.rope


@pytest.mark.parametrize("fusion", ["rope", "norm", "head", "step_io"])
def test_disable_turns_off_one_fusion_and_nothing_else(fusion):
    spec = KernelSpec(attention="kernel", linear="kernel")
    on = resolve(spec, CPU, _tiny()).fusions()
    off = resolve(dataclasses.replace(spec, disable=(fusion,)), CPU, _tiny()).fusions()
    assert on[fusion] and not off[fusion]
    assert {k: v for k, v in off.items() if k != fusion} == {k: v for k, v in on.items() if k != fusion}


@pytest.mark.parametrize(
    ("spec", "model", "message"),
    [
        (KernelSpec(attention="kernel"), ("Llama", {"hidden_size": 1024, "num_attention_heads": 2,
                                                    "num_key_value_heads": 1}), "head_dim 512"),
        (KernelSpec(attention="kernel"), ("Llama", {"attention_chunk_size": 8}), "attention_chunk_size"),
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


def test_linear_launches_count_the_models_tall_calls_the_table_serves():
    """linear_launches: of the (projection, row class) pairs whose configuration (this runner's
    table and split-K) is a tensor-core one, those the table lists a launch for; a draft's table
    counts its own picks."""
    from specgen.gpu.tuning import linear_table as T

    model = _tiny(dtype=torch.bfloat16)  # qkv (128, 64), o (64, 64), gate_up (128, 64, gated), down, lm_head
    resolved = resolve(KernelSpec(linear="kernel"), CPU, model)
    assert resolved.projections == tuple(T.model_shapes(model.config)) and resolved.launches == (0, 15)
    qkv, o, split = (128, 64, False), (64, 64, False), (True, 16, 32, 4, 4, 2)
    mv = (False, 2, 64, 4, 1)  # a matrix-vector pick takes no launch
    table = T.LinearTable(((o, mv, mv), (qkv, T.NARROW, split)), "tuned", launches=(
        (qkv, T.NARROW, 64, (64, 16, 256, 4, 4)), (qkv, T.NARROW, 512, (64, 16, 256, 4, 4)),
        (qkv, T.WIDE, 128, (64, 32, 256, 4, 4)),  # another configuration's: unused
        ((64, 128, False), T.NARROW, 128, (32, 16, 256, 4, 4))))
    tuned = dataclasses.replace(resolved, linear_table=table)
    assert tuned.launches == (3, 12)
    assert tuned.as_dict()["linear_launches"] == "3 of 12 (projection, row class)"
    assert dataclasses.replace(tuned, split_k=True).launches == (1, 12)  # qkv runs its split pick
    # a draft's tall calls take tensor-core tiles where its pick is matrix-vector (for_drafts)
    assert dataclasses.replace(tuned, linear_table=table.for_drafts()).launches == (3, 15)


def test_linear_launches_say_why_none_apply():
    float32 = resolve(KernelSpec(linear="kernel"), CPU, _tiny())
    assert float32.launches is None and float32.as_dict()["linear_launches"] == "none (float32 weights)"
    assert "linear_launches" not in resolve(KernelSpec(linear="torch"), CPU, _tiny(dtype=torch.bfloat16)).as_dict()
    # a config without the projections' sizes: reported unknown, the run goes on
    text = SimpleNamespace(hidden_size=64, num_attention_heads=4)
    odd = SimpleNamespace(config=SimpleNamespace(get_text_config=lambda decoder: text),
                          get_output_embeddings=lambda: SimpleNamespace(weight=torch.empty(0, dtype=torch.bfloat16)))
    resolved = resolve(KernelSpec(attention="sdpa", linear="kernel"), CPU, odd)
    assert resolved.linear and resolved.launches is None
    assert resolved.as_dict()["linear_launches"].startswith("unknown")


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
    """gpu/policy.py, gpu/workspace.py and gpu/kernels/reference.py import without Triton (the torch backend
    resolves settings and the CPU tests use the references); so do core's modules."""
    code = ("import sys; sys.modules['triton'] = None; "
            "import specgen.gpu.policy, specgen.gpu.workspace, specgen.gpu.kernels.reference, specgen.gpu.runner; "
            "import specgen.core.backend, specgen.core.decode, specgen.core.engine; "
            "from specgen.core.settings import KernelSpec; from specgen.gpu.policy import triton_available; "
            "assert not triton_available()")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_auto_on_cuda_takes_the_kernels_the_model_allows(monkeypatch):
    """On a CUDA device `auto` is every kernel where the model allows it and every fusion not
    disabled (no GPU call is needed to decide these; split-K's device facts are tested above)."""
    from specgen.gpu import policy as kernels

    cuda = torch.device("cuda")
    spec = KernelSpec(disable=("split_k",))
    monkeypatch.setattr(kernels, "_properties", lambda device: H200)
    everything = ResolvedKernels(True, True, True, False, True, norm=True, head=True, step_io=True,
                                 dependent_launch=True)
    assert resolve(spec, cuda, _tiny()) == everything
    assert resolve(KernelSpec(), cuda, _tiny()).split_k  # the H200's bandwidth pays for it
    # Gemma 2: soft-capped attention with its rotary and its (1 + w) norms in the kernels
    assert resolve(spec, cuda, _tiny("Gemma2", head_dim=16)) == everything
    assert not resolve(spec, cuda, _tiny("Llama", attention_chunk_size=8)).attention
    assert not resolve(spec, cuda, _tiny().to(torch.float64)).linear
    assert not resolve(KernelSpec(disable=("round",)), cuda, _tiny()).warp
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    assert resolve(spec, cuda, _tiny()) == ResolvedKernels(False, False, False, False, False)
    for key in ("attention", "linear"):
        with pytest.raises(UsageError, match=f'{key} = "kernel" needs Triton'):
            resolve(KernelSpec(**{key: "kernel"}), CPU, _tiny())


def test_dependent_launch_needs_hopper_and_step_kernels(monkeypatch):
    """On for sm_90+ GPUs whose steps run specgen's kernels (step_io alone is one), unless disabled."""
    from specgen.gpu import policy as kernels

    cuda = torch.device("cuda")
    gpu = {"props": H200}
    monkeypatch.setattr(kernels, "_properties", lambda device: gpu["props"])
    assert resolve(KernelSpec(), cuda, _tiny()).dependent_launch
    assert not resolve(KernelSpec(disable=("dependent_launch",)), cuda, _tiny()).dependent_launch
    plain = KernelSpec(attention="sdpa", linear="torch", disable=("step_io",))
    assert not resolve(plain, cuda, _tiny()).dependent_launch
    assert resolve(KernelSpec(attention="sdpa", linear="torch"), cuda, _tiny()).dependent_launch  # step_io alone
    gpu["props"] = SimpleNamespace(**{**vars(H200), "major": 8})  # an A100
    assert not resolve(KernelSpec(), cuda, _tiny()).dependent_launch
    assert not resolve(KernelSpec(attention="kernel"), CPU, _tiny()).dependent_launch
