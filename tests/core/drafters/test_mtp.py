"""MTP layers read from a checkpoint (issue 21): finding, loading, forward, cache, errors.

The checkpoints are tiny random-weight models saved by transformers, with one MTP layer added
under the layer-N names (tests/tiny_models.py). The reference forward is written here from the
DeepSeek-V3 report's MTP equations; its decoder layer is layer N of the same checkpoint loaded by
transformers itself as an (N+1)-layer model, so it shares no loading code with core/drafters/mtp.py.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F

from specgen.core.errors import UsageError
from specgen.core.drafters.mtp import MtpLayer, find_mtp_weights, load_mtp_layers, mtp_layers
from tiny_models import MTP_FAMILIES, build_mtp_checkpoint, mtp_config

transformers = pytest.importorskip("transformers")


def _family_available(family: str) -> bool:
    return hasattr(transformers, {"deepseek_v3": "DeepseekV3Config", "glm4_moe": "Glm4MoeConfig"}[family])


def _needs(family: str):
    if not _family_available(family):
        pytest.skip(f"the installed transformers {transformers.__version__} has no {family}")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(family, sharded, own_head) -> (folder, config, main model, MTP tensors), built once."""
    built = {}

    def get(family="deepseek_v3", sharded=False, own_head=True):
        _needs(family)
        key = (family, sharded, own_head)
        if key not in built:
            folder = tmp_path_factory.mktemp(f"{family}-{'sharded' if sharded else 'single'}-{own_head}")
            config, model, mtp = build_mtp_checkpoint(folder, family, sharded=sharded,
                                                      own_head=own_head, own_embed=own_head)
            built[key] = folder, config, model, mtp
        return built[key]

    return get


def _inputs(config, model, steps=7, seed=3):
    """x_{t+1} ids and the target's final hidden states h_t for t = 0..steps-1."""
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, config.vocab_size, (1, steps + 1), generator=gen)
    with torch.no_grad():
        hidden = model.model(seq[:, :-1]).last_hidden_state  # [1, T, H], after the final norm
    return seq[:, 1:], hidden


def _rms(x, weight, eps):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _reference(folder, config, mtp, ids, hidden):
    """DeepSeek-V3 report eqs. 21-23, whole sequence, no cache (concat order as the checkpoints store it)."""
    n = config.num_hidden_layers
    deeper = copy.deepcopy(config)
    deeper.num_hidden_layers = n + 1
    full = transformers.AutoModelForCausalLM.from_pretrained(folder, config=deeper, dtype=torch.float32).eval()
    p, eps = f"model.layers.{n}.", config.rms_norm_eps
    embed = mtp.get(p + "embed_tokens.weight", full.model.embed_tokens.weight)
    head = mtp.get(p + "shared_head.head.weight", full.lm_head.weight)
    with torch.no_grad():
        joined = torch.cat([_rms(F.embedding(ids, embed), mtp[p + "enorm.weight"], eps),
                            _rms(hidden, mtp[p + "hnorm.weight"], eps)], -1)
        h = F.linear(joined, mtp[p + "eh_proj.weight"])
        positions = torch.arange(ids.shape[1])[None]
        out = full.model.layers[n](h, attention_mask=None, position_ids=positions,
                                   position_embeddings=full.model.rotary_emb(h, positions))
        return F.linear(_rms(out, mtp[p + "shared_head.norm.weight"], eps), head), out


def _one_line(error: UsageError) -> str:
    assert "\n" not in error.message
    return error.message


# --- finding and loading ---------------------------------------------------------------------

@pytest.mark.parametrize("sharded", [False, True])
def test_weights_are_found_and_loaded_exactly(checkpoints, sharded):
    folder, config, model, mtp = checkpoints(sharded=sharded)
    assert mtp_layers(config) == 1
    (weights,) = find_mtp_weights(folder, config)
    p = "model.layers.2."
    for part, name in [("enorm", "enorm"), ("hnorm", "hnorm"), ("proj", "eh_proj"), ("norm", "shared_head.norm"),
                       ("head", "shared_head.head"), ("embed", "embed_tokens")]:
        assert weights.names[part] == f"{p}{name}.weight"
        assert torch.equal(getattr(weights, part), mtp[f"{p}{name}.weight"])
    own = {p + n for n in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head", "embed_tokens")}
    assert {p + k for k in weights.block} == {k for k in mtp if k.rsplit(".", 1)[0] not in own}

    (layer,) = load_mtp_layers(folder, config)
    params = dict(layer.block.state_dict())
    expert = re.compile(r"mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
    inter = config.moe_intermediate_size
    for name, tensor in weights.block.items():
        m = expert.fullmatch(name)
        if m is None:
            assert torch.equal(params[name], tensor), name
            continue
        e, proj = int(m[1]), m[2]
        fused = params["mlp.experts.down_proj" if proj == "down_proj" else "mlp.experts.gate_up_proj"][e]
        rows = {"gate_proj": fused[:inter], "up_proj": fused[inter:], "down_proj": fused}[proj]
        assert torch.equal(rows, tensor), name
    assert torch.equal(layer.proj.weight, mtp[p + "eh_proj.weight"])
    assert torch.equal(layer.head.weight, mtp[p + "shared_head.head.weight"])


def test_bfloat16_load_keeps_the_router_bias_in_float32(checkpoints):
    folder, config, _, mtp = checkpoints()
    (layer,) = load_mtp_layers(folder, config, dtype=torch.bfloat16)
    bias = layer.block.mlp.gate.e_score_correction_bias
    assert bias.dtype == torch.float32
    assert torch.equal(bias, mtp["model.layers.2.mlp.gate.e_score_correction_bias"])
    assert layer.proj.weight.dtype == torch.bfloat16
    assert torch.equal(layer.proj.weight, mtp["model.layers.2.eh_proj.weight"].to(torch.bfloat16))


def test_shared_head_and_embedding_fall_back_to_the_main_model(checkpoints):
    folder, config, model, _ = checkpoints(own_head=False)
    (weights,) = find_mtp_weights(folder, config)
    assert weights.names["head"] == "lm_head.weight" and weights.names["embed"] == "model.embed_tokens.weight"
    assert torch.equal(weights.head, model.lm_head.weight)
    assert torch.equal(weights.embed, model.model.embed_tokens.weight)


@pytest.mark.parametrize("sharded", [False, True])
def test_transformers_still_loads_the_checkpoint_and_ignores_the_mtp_layer(checkpoints, sharded):
    folder, config, model, _ = checkpoints(sharded=sharded)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert len(loaded.model.layers) == config.num_hidden_layers
    ids = torch.arange(10)[None] % config.vocab_size
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


# --- forward -----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_forward_equals_the_reference_from_the_equations(checkpoints, family):
    _needs(family)
    folder, config, model, mtp = checkpoints(family=family, sharded=family == "glm4_moe")
    (layer,) = load_mtp_layers(folder, config)
    ids, hidden = _inputs(config, model)
    with torch.no_grad():
        logits, out = layer(ids, hidden)
    want_logits, want_out = _reference(folder, config, mtp, ids, hidden)
    assert logits.shape == (1, ids.shape[1], config.vocab_size)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    assert logits.std() > 0.1  # the comparison is between non-trivial numbers


def test_cached_steps_equal_the_whole_sequence(checkpoints):
    folder, config, model, _ = checkpoints()
    (layer,) = load_mtp_layers(folder, config)
    ids, hidden = _inputs(config, model, steps=8)
    cache = layer.new_cache()
    with torch.no_grad():
        whole, whole_out = layer(ids, hidden)
        chunks = [layer(ids[:, a:b], hidden[:, a:b], cache) for a, b in [(0, 3), (3, 4), (4, 6), (6, 7), (7, 8)]]
    assert cache.length == 8
    torch.testing.assert_close(torch.cat([c[0] for c in chunks], 1), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([c[1] for c in chunks], 1), whole_out, rtol=1e-5, atol=1e-5)


def test_a_second_step_chains_on_the_first_steps_output_and_rollback_drops_it(checkpoints):
    folder, config, model, _ = checkpoints()
    (layer,) = load_mtp_layers(folder, config)
    ids, hidden = _inputs(config, model, steps=6)
    cache = layer.new_cache()
    with torch.no_grad():
        layer(ids, hidden, cache)
        first, first_out = layer(ids[:, -1:], hidden[:, -1:], cache)  # position 6
        rollback_to = cache.length
        drafted = first[:, -1].argmax(-1, keepdim=True)
        second, _ = layer(drafted, first_out[:, -1:], cache)  # position 7 reads step 1's own output
        whole, _ = layer(torch.cat([ids, ids[:, -1:], drafted], 1),
                         torch.cat([hidden, hidden[:, -1:], first_out], 1))
        torch.testing.assert_close(second[:, 0], whole[:, -1], rtol=1e-5, atol=1e-5)

        cache.rollback(rollback_to)  # the draft was rejected: its entry goes
        assert cache.length == rollback_to
        other = (drafted + 1) % config.vocab_size
        again, _ = layer(other, hidden[:, -1:], cache)
        whole_other, _ = layer(torch.cat([ids, ids[:, -1:], other], 1), torch.cat([hidden, hidden[:, -1:], hidden[:, -1:]], 1))
        torch.testing.assert_close(again[:, 0], whole_other[:, -1], rtol=1e-5, atol=1e-5)

        cache.reset()
        assert cache.length == 0
        fresh, _ = layer(ids, hidden, cache)
        torch.testing.assert_close(fresh, whole[:, :6], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot roll the MTP cache back to 9"):
        cache.rollback(9)


# --- errors: one line each, saying what to change ------------------------------------------------

def test_config_without_mtp_layers_is_a_usage_error():
    llama = transformers.LlamaConfig(num_hidden_layers=1)
    with pytest.raises(UsageError) as info:
        mtp_layers(llama)
    assert _one_line(info.value) == ("num_nextn_predict_layers is missing in the llama config: "
                                     "this checkpoint ships no MTP layers; use another proposer")
    _needs("deepseek_v3")
    none = mtp_config("deepseek_v3")
    none.num_nextn_predict_layers = 0
    with pytest.raises(UsageError, match="^num_nextn_predict_layers is 0 in the deepseek_v3 config"):
        mtp_layers(none)


def test_unknown_family_with_mtp_layers_is_a_usage_error():
    llama = transformers.LlamaConfig(num_hidden_layers=1)
    llama.num_nextn_predict_layers = 1
    with pytest.raises(UsageError) as info:
        find_mtp_weights("unused", llama)
    assert _one_line(info.value) == ("MTP layers of model type 'llama' are not supported "
                                     "(known: deepseek_v3, glm4_moe); use another proposer")


def _rewrite(folder, drop=(), add=None):
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = {k: v for k, v in load_file(path).items() if k not in drop}
    save_file({**tensors, **(add or {})}, path, metadata={"format": "pt"})


def test_missing_mtp_weights_name_what_was_looked_for(tmp_path):
    _needs("deepseek_v3")
    config, _, _ = build_mtp_checkpoint(tmp_path, "deepseek_v3")
    _rewrite(tmp_path, drop={"model.layers.2.enorm.weight", "model.layers.2.eh_proj.weight"})
    with pytest.raises(UsageError) as info:
        find_mtp_weights(tmp_path, config)
    assert _one_line(info.value) == (f"{tmp_path}: MTP layer 0 weights missing from the safetensors files "
                                     "(looked for model.layers.2.enorm.weight, model.layers.2.eh_proj.weight)")


def test_missing_decoder_layer_weight_is_named(tmp_path):
    _needs("deepseek_v3")
    config, _, _ = build_mtp_checkpoint(tmp_path, "deepseek_v3")
    _rewrite(tmp_path, drop={"model.layers.2.mlp.experts.1.up_proj.weight", "model.layers.2.self_attn.o_proj.weight"})
    with pytest.raises(UsageError) as info:
        load_mtp_layers(tmp_path, config)
    message = _one_line(info.value)
    assert message.startswith(f"{tmp_path}: MTP layer 0 weights missing from the safetensors files (looked for ")
    assert "model.layers.2.self_attn.o_proj.weight" in message
    assert "model.layers.2.mlp.experts.gate_up_proj" in message


def test_missing_head_lists_both_names(tmp_path):
    _needs("deepseek_v3")
    config, _, _ = build_mtp_checkpoint(tmp_path, "deepseek_v3", own_head=False)
    _rewrite(tmp_path, drop={"lm_head.weight"})
    with pytest.raises(UsageError) as info:
        find_mtp_weights(tmp_path, config)
    assert _one_line(info.value) == (f"{tmp_path}: MTP lm head missing from the safetensors files "
                                     "(looked for model.layers.2.shared_head.head.weight, lm_head.weight)")


def test_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path):
    _needs("deepseek_v3")
    config, _, _ = build_mtp_checkpoint(tmp_path, "deepseek_v3")
    _rewrite(tmp_path, add={"model.layers.2.eh_proj.weight": torch.zeros(32, 48)})
    with pytest.raises(UsageError) as info:
        load_mtp_layers(tmp_path, config)
    assert _one_line(info.value) == (f"{tmp_path}: MTP tensor model.layers.2.eh_proj.weight has shape [32, 48], "
                                     "the config needs [32, 64]: does config.json belong to these weights?")


def test_extra_tensors_in_the_mtp_layer_are_refused(tmp_path):
    _needs("deepseek_v3")
    config, _, _ = build_mtp_checkpoint(tmp_path, "deepseek_v3")
    _rewrite(tmp_path, add={"model.layers.2.self_attn.o_proj.weight_scale_inv": torch.ones(1)})
    with pytest.raises(UsageError) as info:
        load_mtp_layers(tmp_path, config)
    assert _one_line(info.value) == (f"{tmp_path}: MTP layer 0 has tensors the decoder layer does not take "
                                     "(model.layers.2.self_attn.o_proj.weight_scale_inv); "
                                     "quantized checkpoints are not supported")


def test_folder_without_safetensors_is_a_usage_error(tmp_path):
    _needs("deepseek_v3")
    with pytest.raises(UsageError) as info:
        find_mtp_weights(tmp_path, mtp_config("deepseek_v3"))
    assert _one_line(info.value) == (f"{tmp_path} holds neither model.safetensors nor model.safetensors.index.json: "
                                     "MTP layers are read from safetensors checkpoints only")


def test_mtp_layer_builds_the_familys_own_decoder_layer():
    _needs("deepseek_v3")
    layer = MtpLayer(mtp_config("deepseek_v3"))
    assert type(layer.block).__name__ == "DeepseekV3DecoderLayer"
    assert type(layer.block.mlp).__name__ == "DeepseekV3MoE"  # layer N = 2 >= first_k_dense_replace = 1
    dense = mtp_config("deepseek_v3")
    dense.first_k_dense_replace = 5
    assert type(MtpLayer(dense).block.mlp).__name__ == "DeepseekV3MLP"
