"""specgen's own Llama forward (core/llama.py) against transformers' LlamaForCausalLM, and the
loader's choice between them."""

from __future__ import annotations

import json

import pytest
import torch

from specgen.core import llama
from specgen.core.errors import ModelError
from specgen.core.models import cache_keyword

CONFIGS = {  # the shapes Llama checkpoints come in
    "gqa-tied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "mha": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "head-dim-bias": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32, attention_bias=True,
                          mlp_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
}


def save_llama(folder, seed: int = 0, **overrides):
    """A random transformers Llama saved as a checkpoint (safetensors); returns the transformers model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   max_position_embeddings=128, initializer_range=0.2), **overrides})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def ours(folder, dtype=torch.float32):
    config = json.loads((folder / "config.json").read_text())
    return llama.load(folder, llama.shape_of(config), dtype, torch.device("cpu"))


@pytest.mark.parametrize("cache", ["KVCache", "DynamicCache"])
@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_transformers_with_and_without_a_cache(tmp_path, name, cache):
    from transformers import DynamicCache

    reference = save_llama(tmp_path, **CONFIGS[name])
    model = ours(tmp_path)
    ids = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)
        caches = (llama.KVCache() if cache == "KVCache" else DynamicCache()), DynamicCache()
        # prefill 7, then a 3-token round, then roll back 2 (as a rejected round does) and step once
        for start, stop, crop in ((0, 7, None), (7, 10, None), (8, 9, 2)):
            got, want = [], []
            for net, cache, out in zip((model, reference), caches, (got, want)):
                if crop:
                    cache.crop(-crop)
                positions = torch.arange(start, stop)[None]
                out.append(net(input_ids=ids[:, start:stop], **{cache_keyword(type(net).forward): cache},
                               position_ids=positions, cache_position=positions[0], use_cache=True,
                               logits_to_keep=stop - start).logits)
            torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_the_cache_goes_by_the_keyword_forward_takes():
    """transformers 5.24 renamed the models' and layers' `past_key_values` to `cache` (the old name
    warns); 5.17 to 5.23, unrenamed families and this package's Llama take `past_key_values`."""
    def renamed(self, input_ids=None, cache=None, **kwargs): ...

    def before(self, input_ids=None, past_key_values=None, cache_position=None, **kwargs): ...

    def both(self, input_ids=None, past_key_values=None, cache=None, **kwargs): ...

    assert cache_keyword(renamed) == "cache"
    assert cache_keyword(before) == cache_keyword(both) == cache_keyword(llama.LlamaForCausalLM.forward) == \
        "past_key_values"


def test_bfloat16_weights_load_in_the_dtype_asked_for(tmp_path):
    reference = save_llama(tmp_path, **CONFIGS["gqa-tied"])
    model = ours(tmp_path, torch.bfloat16)
    assert model.dtype == torch.bfloat16 and model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        want = reference.to(torch.bfloat16)(ids).logits.float()
        torch.testing.assert_close(model(ids).logits.float(), want, rtol=0.05, atol=0.05)
    assert model.generation_config.eos_token_id == reference.generation_config.eos_token_id


@pytest.mark.parametrize("change", [
    {"model_type": "mistral"}, {"architectures": ["LlamaForSequenceClassification"]}, {"hidden_act": "gelu"},
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}},
    {"rope_scaling": {"type": "linear", "factor": 2.0}}, {"quantization_config": {"quant_method": "gptq"}},
    {"auto_map": {"AutoModelForCausalLM": "custom.Model"}}, {"pretraining_tp": 2},
])
def test_configs_it_does_not_cover_go_to_transformers(tmp_path, change):
    save_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert llama.shape_of(config) is not None
    assert llama.shape_of({**config, **change}) is None


def test_the_loader_picks_specgens_llama_on_the_cpu_unless_told_otherwise(tmp_path):
    from transformers import LlamaForCausalLM

    from specgen.core.models import load_model, own_llama
    from specgen.core.settings import ModelSpec

    save_llama(tmp_path)
    spec = ModelSpec(path=str(tmp_path), device="cpu")
    assert isinstance(load_model(spec), llama.LlamaForCausalLM)
    assert isinstance(load_model(spec, modeling="transformers"), LlamaForCausalLM)
    assert own_llama(tmp_path, spec, torch.device("cuda"), True, "auto") is None  # CUDA rewires transformers'
    assert own_llama(tmp_path, spec, torch.device("cpu"), False, "auto") is None  # pickle weights


def test_runners_give_specgens_llama_its_own_cache(tmp_path):
    from transformers import DynamicCache

    from specgen.core.models import load_model, new_cache
    from specgen.core.settings import ModelSpec

    save_llama(tmp_path)
    spec = ModelSpec(path=str(tmp_path), device="cpu")
    assert isinstance(new_cache(load_model(spec)), llama.KVCache)
    assert isinstance(new_cache(load_model(spec, modeling="transformers")), DynamicCache)


def test_weights_that_do_not_match_the_config_are_a_model_error(tmp_path):
    from safetensors.torch import load_file, save_file

    from specgen.core.models import load_model
    from specgen.core.settings import ModelSpec

    save_llama(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError, match="the weights do not match config.json .1 tensors missing, "
                                         "e.g. model.layers.1.mlp.up_proj.weight"):
        load_model(ModelSpec(path=str(tmp_path), device="cpu"))


def test_sharded_checkpoints_load(tmp_path):
    from transformers import LlamaForCausalLM

    reference = save_llama(tmp_path / "whole", **CONFIGS["mha"])
    LlamaForCausalLM.save_pretrained(reference, tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ids = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(ours(tmp_path / "sharded")(ids).logits, reference(ids).logits)
