"""gpu/rewire.py's step inputs, and gpu/runner.py's steps that use them: rotary embeddings read from
a table the module filled, positions handed to the model, and no mask where every attention call
is the kernel's. Each must leave a step's logits bit for bit what the model computes by itself.
On CPU the kernels run in the Triton interpreter (tests/triton_cpu.py).
"""

from __future__ import annotations

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels, runner
from specgen.gpu import rewire

FAMILIES = {  # config class, extra config values
    "Llama": ("Llama", {}),
    "Llama-3.1": ("Llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 256}}),
    "Qwen2": ("Qwen2", {}),
    "Qwen3": ("Qwen3", {}),
    "Gemma2": ("Gemma2", {"attn_logit_softcapping": 50.0, "sliding_window": 8}),
}


def _tiny(name: str, dtype=torch.bfloat16):
    import transformers

    family, extra = FAMILIES[name]
    config = getattr(transformers, f"{family}Config")(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, initializer_range=0.5,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(3)
    return getattr(transformers, f"{family}ForCausalLM")(config).to(DEVICE).to(dtype).eval()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_rotary_table_rows_are_the_modules_values(name):
    model = _tiny(name)
    (module,) = rewire.install_rotary(model)
    assert rewire.install_rotary(model) == [module]  # idempotent
    table = rewire.RotaryTable(module, 300, torch.bfloat16)
    x = torch.zeros(1, 3, 64, dtype=torch.bfloat16, device=DEVICE)
    for start in (0, 7, 255, 297):
        positions = torch.arange(start, start + 3, device=DEVICE)[None]
        want = module(x, positions)  # no table set: the module's own forward
        got = table.lookup(positions)
        assert all(torch.equal(g, w) and g.shape == w.shape and g.dtype == w.dtype for g, w in zip(got, want))
    with rewire.rotary_tables({module: table}):
        assert all(torch.equal(g, w) for g, w in zip(module(x, positions), want))
    assert module._specgen_table is None


def test_dynamic_rope_types_keep_their_forward():
    """A rope type whose frequencies follow the sequence's length cannot be tabulated once."""
    model = _tiny("Llama")
    model.model.rotary_emb.rope_type = "dynamic"
    assert rewire.install_rotary(model) == []


def _step(each, ids: torch.Tensor) -> torch.Tensor:
    """The runner's step function (what a GPU captures) over ids, after whatever the runner holds."""
    logits = torch.full((ids.shape[0], each.width), float("-inf"), device=DEVICE)
    with torch.inference_mode(), each.step_context(ids.shape[0]):
        each.step(ids.to(DEVICE), logits)
    each.length += ids.shape[0]
    return logits


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Llama-3.1", "Gemma2"])
def test_steps_without_mask_or_rotary_kernels_equal_the_models_own(name, monkeypatch):
    """After the same prefill, the step function (placeholder mask, tabled rotary, handed positions)
    gives the logits of the model deriving all three itself, bit for bit, for 5- and 1-token
    steps; it builds no mask and calls no rotary forward."""
    from transformers import masking_utils

    model = _tiny(name)
    each = runner(model, kernels=kernels(attention=True, linear=True, rope=name != "Gemma2"), capacity=128)
    assert each.step_mask is not None and len(each.tables) == 1
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 96, (12,), generator=gen)
    feeds = [torch.randint(0, 96, (n,), generator=gen) for n in (5, 1, 3)]
    each.reset()
    each.forward(prompt, want_logits=False)
    want = [each.forward(ids).clone() for ids in feeds]  # eager: the model's own mask, positions, rotary
    counted = []
    masks = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS
    real_mask, rotary = masks[rewire.NAME], type(model.model.rotary_emb).__mro__[1]
    monkeypatch.setattr(rotary, "forward", lambda *a, real=rotary.forward: counted.append("rotary") or real(*a))
    masks.register(rewire.NAME, lambda *a, **k: counted.append("mask") or real_mask(*a, **k))
    try:
        each.reset()
        each.forward(prompt, want_logits=False)  # eager again: counts the model's own
        assert {"mask", "rotary"} <= set(counted)
        counted.clear()
        got = [_step(each, ids).clone() for ids in feeds]
    finally:
        masks.register(rewire.NAME, real_mask)
    assert counted == []
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_a_placeholder_mask_never_reaches_sdpa():
    """A step call the kernel cannot take fails loudly instead of attending to every key."""
    query = torch.zeros(1, 4, 65, 16)
    key = value = torch.zeros(1, 2, 128, 16)
    placeholder = torch.zeros(rewire.STEP_MASK_SHAPE, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="without a mask"):
        rewire.attention(torch.nn.Module(), query, key, value, placeholder, specgen_position=torch.tensor(0))


def test_models_with_attention_sinks_keep_their_mask():
    """Only a model whose attention calls are all the kernel's goes without: one whose attention
    was not switched, or one with attention sinks, keeps its mask."""
    model = _tiny("Llama")
    assert not rewire.mask_free(model)  # not switched yet: its own attention reads the mask
    assert runner(model, kernels=kernels(linear=True)).step_mask is None
    rewire.switch_attention(model)
    assert rewire.mask_free(model)
    model.model.layers[0].self_attn.sinks = torch.nn.Parameter(torch.zeros(4))
    assert not rewire.mask_free(model)
    assert runner(model, kernels=kernels(attention=True)).step_mask is None


def test_positional_arguments_are_read_by_name():
    """A rewired forward reads a caller's positional arguments by the module's own parameter names,
    and hands back to the module's forward a call with more of them than it names."""
    class Layer:
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
            return hidden_states

    assert rewire._by_name(Layer, (), {"cache": 1}) == {"cache": 1}
    assert rewire._by_name(Layer, ("pe", "mask"), {"cache": 1}) == {"position_embeddings": "pe",
                                                                    "attention_mask": "mask", "cache": 1}
    assert rewire._by_name(Layer, ("pe", "mask", "extra"), {}) is None
