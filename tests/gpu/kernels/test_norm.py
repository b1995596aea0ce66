"""gpu/kernels/norm.py: the RMSNorm kernel (with the residual add before it) against its torch reference,
bit for bit, and inside specgen's own model step (gpu/ops.py's table).

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
from specgen.gpu.kernels import linear as L
from specgen.gpu.kernels import norm as N
from specgen.gpu.kernels.reference import offset_norm_add_reference, rms_norm_reference

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


def _feed(each, feeds) -> list:
    """Logits of each feed, from the start."""
    each.reset()
    return [each.forward(ids.to(DEVICE)).clone() for ids in feeds]


@pytest.mark.slow
@pytest.mark.parametrize("family,dtype,launches,adds", [("Llama", torch.bfloat16, 5, 4),
                                                        ("Qwen3", torch.bfloat16, 9, 4),
                                                        ("Gemma2", torch.bfloat16, 7, 0),
                                                        ("Llama", torch.float32, 5, 4)])
def test_runner_with_norm_kernel_equals_the_model(family, dtype, launches, adds, monkeypatch):
    """A prefill, then 5- and 1-token steps of specgen's own model (2 layers) with the norm kernel
    against the same weights without it, both with the linear kernel: per layer Llama's two norms
    (Qwen3's per-head q/k norms too), Gemma 2's input norm, its add between two (1 + w) norms in
    one launch and its post-feedforward norm; the final norm; each residual add in its
    projection's epilogue (Gemma 2 adds after its norms). Identical bfloat16 logits; float32 ones
    within the float32 sum's order."""
    model = _tiny(family, dtype)
    fast = runner(copy.deepcopy(model), kernels=kernels(linear=True, norm=True))
    plain = runner(model, kernels=kernels(linear=True))
    calls = []
    real = N._launch
    gen = torch.Generator().manual_seed(0)
    feeds = [torch.randint(0, 96, (n,), generator=gen) for n in (12, 5, 1)]
    want = _feed(plain, feeds)
    monkeypatch.setattr(N, "_launch", lambda x, *a: calls.append(x.shape) or real(x, *a))
    added = []
    real_linear = L._launch
    monkeypatch.setattr(L, "_launch", lambda *a: added.append(a[9] is not None) or real_linear(*a))  # residual
    got = _feed(fast, feeds)
    assert len(calls) == 3 * launches
    assert sum(added) == 3 * adds
    for a, b in zip(got, want):
        if dtype == torch.float32:
            assert (a - b).abs().max().item() < 1e-4 * max(1.0, b.abs().max().item())
        else:
            assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_captured_graphs_with_norm_match_its_eager_steps(dtype):
    """Captured 1- and 5-token steps with the norm kernel against the same runner's eager steps."""
    model = _tiny("Llama", dtype)
    resolved = kernels(attention=True, rope=True, linear=True, norm=True)
    fast = runner(copy.deepcopy(model), kernels=resolved, shapes=(1, 5), use_graphs=True)
    assert fast.graphs
    eager = runner(model, kernels=resolved)
    gen = torch.Generator().manual_seed(5)
    feeds = [torch.randint(0, 96, (n,), generator=gen) for n in (20, 1, 5, 5, 1, 3)]
    got = _feed(fast, feeds)
    want = _feed(eager, feeds)
    tol = 1e-4 if dtype == torch.float32 else 0.1  # the prefill replays 5-token chunks where eager runs 20 rows
    for a, b in zip(got, want):
        assert (a - b).abs().max().item() < tol * max(1.0, b.abs().max().item())
