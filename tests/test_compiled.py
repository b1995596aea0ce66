"""gpu/compiled.py: `compile = true` compiles one decoder layer, and that trace serves every layer.

Dynamo cannot trace the Triton interpreter, so on the CPU the step kernels are stood in for by
torch functions of the same signatures (below): what is tested is the layers' rewiring and dynamo's
guards (one trace per step shape for all layers, the K/V picked outside the compiled code), with
inductor compiling for the CPU. tests/test_gpu.py compiles the real kernels on a GPU.
"""

from __future__ import annotations

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch
import torch.nn.functional as F

from gpu_helpers import kernels, runner
from specgen.gpu import attention, compiled, linear, norm, reference

STEP_KERNELS = dict(attention=True, linear=True, rope=True, norm=True)


def _tiny(layers: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(DEVICE).eval()


def _attend(query, key, value, position, scale):
    group = query.shape[1] // key.shape[1]
    scores = torch.einsum("bhtd,bhnd->bhtn", query.float(), key.float().repeat_interleave(group, dim=1)) * scale
    at = position + torch.arange(query.shape[2], device=query.device)[:, None]
    keys = torch.arange(key.shape[2], device=query.device)[None, :]
    weights = torch.softmax(scores.masked_fill(keys > at, float("-inf")), dim=-1)
    out = torch.einsum("bhtn,bhnd->bhtd", weights, value.float().repeat_interleave(group, dim=1))
    return out.transpose(1, 2).to(query.dtype)


def _decode_attention(query, key, value, position, scale, window=0, rope=None, softcap=0.0, dependent=False):
    """The kernel's contract in torch ops dynamo traces (no host read of the position)."""
    assert window == 0 and softcap == 0.0
    if rope is not None:
        k_new, v_new, cos, sin = rope
        at = position + torch.arange(query.shape[2], device=query.device)
        key.index_copy_(2, at, reference.rotate_reference(k_new, cos, sin))
        value.index_copy_(2, at, v_new)
        query = reference.rotate_reference(query, cos, sin)
    return _attend(query, key, value, position, scale)


def _linear(x, weight, bias=None, config=None, *, split_k=False, counters=None, table=None, residual=None,
            dependent=False):
    out = F.linear(x, weight, bias)
    return out if residual is None else residual + out


def _gate_up(x, gate, up, activation, config=None, *, split_k=False, counters=None, table=None, dependent=False):
    return reference.gate_up_reference(x, gate, up, activation)


@pytest.fixture
def traceable(monkeypatch):
    """The step kernels as torch functions, and dynamo's caches and counters from scratch."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(attention, "decode_attention", _decode_attention)
    monkeypatch.setattr(linear, "linear", _linear)
    monkeypatch.setattr(linear, "gate_up", _gate_up)
    monkeypatch.setattr(norm, "rms_norm", lambda x, w, eps, dependent=False, offset=False:
                        reference.rms_norm_reference(x, w, eps, offset=offset)[0])
    monkeypatch.setattr(norm, "add_rms_norm", lambda x, r, w, eps, dependent=False: reference.rms_norm_reference(x, w, eps, r))
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def _steps(each, shapes) -> list[torch.Tensor]:
    out = []
    with torch.inference_mode():
        each.reset()
        each.forward(torch.arange(7, device=DEVICE), want_logits=False)  # a prompt: uncompiled
        for n in shapes:
            logits = torch.zeros(n, 96, device=DEVICE)
            with each.step_context(n):
                each.step(torch.arange(n, device=DEVICE) + 3, logits)
            out.append(logits)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("step_io", [False, True])  # gpu/step_io.py's buffers feed layer 0 and the rotary rows
def test_one_trace_per_step_shape_serves_every_layer(traceable, tmp_path, step_io):
    """Four layers, two step shapes: two graphs, and the steps' logits are the uncompiled runner's."""
    model = _tiny()
    fast = runner(model, kernels=kernels(**STEP_KERNELS, step_io=step_io), capacity=128, compile=True,
                  compile_cache_folder=str(tmp_path))
    assert fast.compiled.layers == 4
    shapes = (3, 1, 1, 3)
    got = _steps(fast, shapes)
    assert traceable["stats"]["unique_graphs"] == 2
    plain = runner(model, kernels=kernels(**STEP_KERNELS), capacity=128)  # the same layers, not engaged
    want = _steps(plain, shapes)
    assert traceable["stats"]["unique_graphs"] == 2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_layers_take_the_compiled_call_only_when_engaged(monkeypatch, tmp_path):
    model = _tiny(layers=2)
    calls = []
    each = runner(model, kernels=kernels(**STEP_KERNELS), capacity=128, compile=True, plain_shapes=(4,),
                  compile_cache_folder=str(tmp_path))
    monkeypatch.setattr(each.compiled, "call", lambda layer, *a, **kw: calls.append((layer, kw["specgen_slot"])) or
                        layer._specgen_compiled_base.forward(layer, *a, **kw))
    _steps(each, (1,))
    assert calls == list(zip(model.model.layers, each.cache.layers))  # each layer once, with its K/V
    calls.clear()
    _steps(each, (4,))  # a plain shape (the backend's prefill chunk), and the prompt before it
    assert calls == [] and not each.compiled.active


def test_a_layer_with_its_own_forward_keeps_it(tmp_path):
    """accelerate's hooks replace an instance's forward: that layer runs it, uncompiled."""
    model = _tiny(layers=3)
    hooked = model.model.layers[1]
    hooked.forward = type(hooked).forward.__get__(hooked)
    region = compiled.install(model)
    assert region.layers == 2
    assert [type(layer).__name__ for layer in model.model.layers] == [
        "CompiledLlamaDecoderLayer", "LlamaDecoderLayer", "CompiledLlamaDecoderLayer"]
    again = compiled.install(model)  # another runner on the same model: its own switch, same classes
    assert again.layers == 2 and model.model.layers[0]._specgen_compiled is again
    assert type(model.model.layers[0]).__mro__[1].__name__ == "LlamaDecoderLayer"


def test_a_model_without_decoder_layers_compiles_nothing():
    class Bare(torch.nn.Module):
        pass

    assert compiled.install(Bare()).layers == 0
