"""gpu/norm.py: the RMSNorm kernel (with the residual add before it) against its torch reference,
bit for bit, and inside models through gpu/rewire.py's install_norm.

The kernel keeps every rounding step of transformers' RMSNorm and takes the sum of float32 squares
in float64, so it equals its reference exactly, and equals the module exactly wherever the module's
float32 sum is exact (inputs on a coarse grid below; 16-bit models in practice: the tiny bfloat16
models' logits are identical). On CPU the kernel runs in the Triton interpreter (tests/triton_cpu.py).
"""

from __future__ import annotations

import copy

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels, runner
from specgen.gpu import linear as L
from specgen.gpu import norm as N
from specgen.gpu import rewire
from specgen.gpu.reference import offset_norm_add_reference, rms_norm_reference

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SHAPES = [(1, 64), (5, 4096), (3, 100), (16, 2048)]  # rows, columns: one row, a power of two, an odd width


def _data(rows, n, dtype, seed=0, weight_dtype=None):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=gen) * 3
    residual = torch.randn(rows, n, generator=gen)
    weight = torch.randn(n, generator=gen)
    return x.to(dtype).to(DEVICE), residual.to(dtype).to(DEVICE), weight.to(weight_dtype or dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_equals_reference(shape, dtype):
    x, residual, weight = _data(*shape, dtype)
    out, summed = N.add_rms_norm(x, residual, weight, 1e-5)
    want, want_summed = rms_norm_reference(x, weight, 1e-5, residual)
    assert out.dtype == dtype and summed.dtype == dtype
    assert torch.equal(summed, want_summed) and torch.equal(out, want)
    assert torch.equal(N.rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6)[0])


def test_float32_weight_on_16_bit_rows():
    """weight * x.to(dtype) promotes: a float32 weight gives float32 rows, as in the module."""
    x, _, weight = _data(4, 96, torch.bfloat16, weight_dtype=torch.float32)
    out = N.rms_norm(x, weight, 1e-6)
    assert out.dtype == torch.float32 and torch.equal(out, rms_norm_reference(x, weight, 1e-6)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_module_rounding_reproduced_exactly(dtype):
    """On inputs whose float32 sum of squares is exact in any order (multiples of 1/8 below 8), the
    kernel equals transformers' LlamaRMSNorm (after the residual add) bit for bit, on any device."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(1)
    x, residual = (torch.randint(-32, 32, (5, 4096), generator=gen).to(dtype).to(DEVICE) / 8 for _ in range(2))
    module = LlamaRMSNorm(4096, eps=1e-5).to(DEVICE)
    module.weight.data = torch.randn(4096, generator=gen).to(dtype).to(DEVICE)
    out, summed = N.add_rms_norm(x, residual, module.weight, 1e-5)
    assert torch.equal(summed, residual + x)
    assert torch.equal(out, module(residual + x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_offset_form_equals_reference(shape, dtype):
    """Gemma's form, (x * rsqrt) * (1 + weight) in float32, rounded once: kernel and reference agree
    bit for bit, and the output keeps x's dtype even with a float32 weight (the module's type_as)."""
    x, _, weight = _data(*shape, dtype)
    assert torch.equal(N.rms_norm(x, weight, 1e-6, offset=True), rms_norm_reference(x, weight, 1e-6, offset=True)[0])
    x, _, weight = _data(*shape, dtype, weight_dtype=torch.float32)
    out = N.rms_norm(x, weight, 1e-6, offset=True)
    assert out.dtype == dtype and torch.equal(out, rms_norm_reference(x, weight, 1e-6, offset=True)[0])


@pytest.mark.parametrize("family", ["Gemma", "Gemma2"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_offset_form_reproduces_gemma_modules_exactly(family, dtype):
    """On inputs whose float32 sum of squares is exact, the offset form equals transformers'
    GemmaRMSNorm and Gemma2RMSNorm bit for bit."""
    import importlib

    gen = torch.Generator().manual_seed(4)
    x = torch.randint(-32, 32, (5, 2304), generator=gen).to(dtype).to(DEVICE) / 8
    module = importlib.import_module(f"transformers.models.{family.lower()}.modeling_{family.lower()}")
    norm = getattr(module, f"{family}RMSNorm")(2304, eps=1e-6).to(DEVICE)
    norm.weight.data = (torch.randn(2304, generator=gen) / 4).to(dtype).to(DEVICE)
    assert torch.equal(N.rms_norm(x, norm.weight, 1e-6, offset=True), norm(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_norm_then_add_equals_reference(shape, dtype):
    """Gemma 2's layer in one launch: residual + RMSNorm(x), then RMSNorm of that with a second
    weight, or without it the sum alone; bit for bit the reference, and each the module's steps."""
    x, residual, weight = _data(*shape, dtype)
    weight2 = _data(*shape, dtype, seed=5)[2]
    summed, normed = N.offset_norm_add(x, residual, weight, 1e-6, (weight2, 1e-5))
    want_summed, want_normed = offset_norm_add_reference(x, residual, weight, 1e-6, (weight2, 1e-5))
    assert torch.equal(summed, want_summed) and torch.equal(normed, want_normed)
    assert summed.dtype == normed.dtype == dtype
    alone, none = N.offset_norm_add(x, residual, weight, 1e-6)
    assert none is None and torch.equal(alone, want_summed)
    assert torch.equal(want_summed, residual + N.rms_norm(x, weight, 1e-6, offset=True))
    assert torch.equal(want_normed, N.rms_norm(want_summed, weight2, 1e-5, offset=True))


def test_rows_are_computed_alike_whatever_the_row_count():
    x, residual, weight = _data(5, 2048, torch.bfloat16, seed=2)
    out, summed = N.add_rms_norm(x, residual, weight, 1e-5)
    for i in range(5):
        one, one_summed = N.add_rms_norm(x[i:i + 1], residual[i:i + 1], weight, 1e-5)
        assert torch.equal(one, out[i:i + 1]) and torch.equal(one_summed, summed[i:i + 1])


def test_leading_dims_and_strided_rows():
    """Qwen3's per-head norm: [B, T, H, D] views of a wider projection output."""
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(1, 3, 4 * 16 + 8, generator=gen).to(torch.bfloat16).to(DEVICE)
    x = wide[..., :64].view(1, 3, 4, 16)
    weight = torch.randn(16, generator=gen).to(torch.bfloat16).to(DEVICE)
    out = N.rms_norm(x, weight, 1e-6)
    assert out.shape == (1, 3, 4, 16) and torch.equal(out, rms_norm_reference(x, weight, 1e-6)[0])


def test_bad_shapes_are_refused():
    x, residual, weight = _data(2, 64, torch.float32)
    with pytest.raises(AssertionError):
        N.rms_norm(x, weight[:32], 1e-6)
    with pytest.raises(AssertionError):
        N.add_rms_norm(x, residual[:1], weight, 1e-6)


# -- inside models ------------------------------------------------------------------------------------


def _tiny(family: str, dtype):
    import transformers

    config = getattr(transformers, f"{family}Config")(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, initializer_range=0.5,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(3)
    return getattr(transformers, f"{family}ForCausalLM")(config).to(DEVICE).to(dtype).eval()


def _feed(each, feeds, norm: bool) -> list:
    """Logits of each feed; with norm, the runner's steps run with the norm kernel on (the runner's
    own engagement, which passes no norm value, keeps the enclosing one)."""
    each.reset()
    out = []
    for ids in feeds:
        with each.switch.engaged(False, None, norm=norm):
            out.append(each.forward(ids.to(DEVICE)).clone())
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family,dtype,modules,launches,adds", [("Llama", torch.bfloat16, 7, 5, 2),
                                                                ("Qwen3", torch.bfloat16, 11, 9, 2),
                                                                ("Gemma2", torch.bfloat16, 11, 5, 0),
                                                                ("Llama", torch.float32, 7, 5, 2)])
def test_runner_with_norm_kernel_equals_the_model(family, dtype, modules, launches, adds, monkeypatch):
    """A prefill, then 5- and 1-token steps of a rewired model (2 layers: 2 norms and 1 fused add
    each, the MLP's add in its down projection, the final norm; Qwen3's per-head q/k norms; Gemma
    2's four (1 + w) norms a layer and its two adds in two launches, the next layer's input norm or
    the final norm joining the second, the first layer's input norm in one) against the same weights without it, both
    with the linear kernel: identical bfloat16 logits; float32 ones within the float32 sum's order."""
    model = _tiny(family, dtype)
    plain_model = copy.deepcopy(model)
    assert rewire.install_norm(copy.deepcopy(model), rewire.LinearSwitch()) == modules
    fast = runner(model, kernels=kernels(linear=True, norm=True))  # installs them itself
    assert rewire.install_norm(model, fast.switch) == 0  # idempotent
    plain = runner(plain_model, kernels=kernels(linear=True))
    calls = []
    real = N._launch
    gen = torch.Generator().manual_seed(0)
    feeds = [torch.randint(0, 96, (n,), generator=gen) for n in (12, 5, 1)]
    want = _feed(plain, feeds, norm=False)
    monkeypatch.setattr(N, "_launch", lambda x, *a: calls.append(x.shape) or real(x, *a))
    added = []
    real_linear = L._launch
    monkeypatch.setattr(L, "_launch", lambda *a: added.append(a[9] is not None) or real_linear(*a))  # residual
    got = _feed(fast, feeds, norm=True)
    assert len(calls) == 3 * launches  # per layer: norm, add + norm (Qwen3: q and k norms); final norm
    assert sum(added) == 3 * adds  # per layer: the MLP's residual add in the down projection
    for a, b in zip(got, want):
        if dtype == torch.float32:
            assert (a - b).abs().max().item() < 1e-4 * max(1.0, b.abs().max().item())
        else:
            assert torch.equal(a, b)


def test_install_changes_nothing_outside_an_engaged_norm():
    """Outside a norm engagement (no runner, or a runner without the norm) the model's own norms
    and layers run, bit for bit."""
    model = _tiny("Llama", torch.float32)
    ids = torch.randint(0, 96, (1, 4), device=DEVICE)
    with torch.no_grad():
        before = model(ids).logits
        switch = rewire.install_linear(model)
        rewire.install_norm(model, switch)
        calls = []
        real = N._launch
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(N, "_launch", lambda x, *a: calls.append(x.shape) or real(x, *a))
            assert torch.equal(model(ids).logits, before)
            with switch.engaged(split_k=False, counters=None):
                model(ids)
            assert calls == []
            with switch.engaged(split_k=False, counters=None, norm=True):
                inside = model(ids).logits
            assert len(calls) == 2 * 2 + 1 and not switch.norms()
        assert (inside - before).abs().max().item() < 1e-4


def test_gemma2_norm_computed_ahead_is_taken_only_for_its_tensor():
    """A Gemma 2 layer's last launch also computes the next norm (the next layer's input norm, the
    final norm after the last layer) and hands it on. A hook that replaces a layer's output makes
    the next norm compute its own: one launch more, and the hook's effect in the logits."""
    model = _tiny("Gemma2", torch.float32)
    ids = torch.randint(0, 96, (1, 4), device=DEVICE)
    switch = rewire.install_linear(model)
    rewire.install_norm(model, switch)
    launches = []
    real = N._launch
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(N, "_launch", lambda x, *a: launches.append(x.shape) or real(x, *a))
        plain = model(ids).logits
        with switch.engaged(split_k=False, counters=None, norm=True):
            fused = model(ids).logits
        assert len(launches) == 5 and switch.handed is None  # 2 layers: 3 + 2 launches; none left over
        handle = model.model.layers[0].register_forward_hook(lambda module, args, out: out * 0.5)
        hooked_plain = model(ids).logits
        with switch.engaged(split_k=False, counters=None, norm=True):
            hooked = model(ids).logits
        handle.remove()
    assert len(launches) == 5 + 6
    assert (fused - plain).abs().max().item() < 1e-4 * max(1.0, plain.abs().max().item())
    assert (hooked - hooked_plain).abs().max().item() < 1e-4 * max(1.0, hooked_plain.abs().max().item())
    assert (hooked_plain - plain).abs().max().item() > 1e-2


def test_hooked_mlp_keeps_its_call_and_the_separate_add():
    """A hook on an MLP or its down projection (a user's, accelerate's) still runs in an engaged
    step: those layers take the unfused add, the others the down projection's epilogue; same logits."""
    model = _tiny("Llama", torch.float32)
    ids = torch.randint(0, 96, (1, 4), device=DEVICE)
    switch = rewire.install_linear(model)
    rewire.install_norm(model, switch)
    seen = []
    with torch.no_grad(), switch.engaged(split_k=False, counters=None, norm=True):
        want = model(ids).logits
        handles = [model.model.layers[0].mlp.register_forward_hook(lambda *a: seen.append("mlp")),
                   model.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda *a: seen.append("down"))]
        got = model(ids).logits
    for handle in handles:
        handle.remove()
    assert seen == ["mlp", "down"]
    assert (got - want).abs().max().item() < 1e-5 * max(1.0, want.abs().max().item())


def test_norm_paths_trace_without_graph_breaks(monkeypatch):
    """The rewired layer and norm compile into one graph (dynamo, fullgraph) making the same kernel
    calls as eager, as in a compiled captured step. The kernel is swapped for its torch reference:
    the CPU interpreter cannot run inside a trace."""
    import torch._dynamo

    model = _tiny("Llama", torch.float32)
    switch = rewire.install_linear(model)
    rewire.install_norm(model, switch)
    calls = []

    def fake(x, residual, weight, eps, dependent, offset=False, after=False, weight2=None, eps2=0.0):
        assert not after  # Llama's layers
        calls.append(residual is not None)
        return rms_norm_reference(x, weight, eps, residual, offset)

    monkeypatch.setattr(N, "_launch", fake)
    monkeypatch.setattr(rewire.linear_kernels, "linear", lambda x, w, b=None, config=None, **_:
                        torch.nn.functional.linear(x, w, b))
    monkeypatch.setattr(rewire.linear_kernels, "gate_up", lambda x, g, u, act, config=None, **_:
                        torch.nn.functional.silu(torch.nn.functional.linear(x, g)) * torch.nn.functional.linear(x, u))
    ids = torch.randint(0, 96, (1, 5), device=DEVICE)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad(), switch.engaged(split_k=False, counters=None, norm=True):
        want = model(ids).logits
        eager_calls, calls[:] = list(calls), []
        got = compiled(ids).logits
    assert eager_calls == [False, True] * 2 + [False]  # per layer: norm, add + norm; the final norm
    assert calls == eager_calls
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_captured_graphs_with_norm_match_its_eager_steps(dtype):
    """Captured 1- and 5-token steps with the norm kernel against the same runner's eager steps."""
    model = _tiny("Llama", dtype)
    eager_model = copy.deepcopy(model)
    resolved = kernels(attention=True, rope=True, linear=True, norm=True)
    fast = runner(model, kernels=resolved, use_graphs=True)
    rewire.install_norm(model, fast.switch)
    with fast.switch.engaged(False, None, norm=True):
        fast.add_shapes((1, 5))
    assert fast.graphs
    eager = runner(eager_model, kernels=resolved)
    rewire.install_norm(eager_model, eager.switch)
    gen = torch.Generator().manual_seed(5)
    feeds = [torch.randint(0, 96, (n,), generator=gen) for n in (20, 1, 5, 5, 1, 3)]
    got = _feed(fast, feeds, norm=True)
    want = _feed(eager, feeds, norm=True)
    tol = 1e-4 if dtype == torch.float32 else 0.1  # the prefill replays 5-token chunks where eager runs 20 rows
    for a, b in zip(got, want):
        assert (a - b).abs().max().item() < tol * max(1.0, b.abs().max().item())
