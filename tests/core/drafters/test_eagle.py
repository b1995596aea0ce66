"""The EAGLE-3 head (core/drafters/eagle.py) and its checkpoint formats (core/drafters/head_formats.py).

The head is checked against a plain re-implementation of the published layer written here from
the equations (no cache, whole sequence, per-head loops), its cache against one forward over the
whole sequence, and its formats by round trips through folders the tests write.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import build_head, tiny_head_config, write_eagle3_original

from specgen.core.drafters.eagle import Eagle3Head
from specgen.core.errors import UsageError
from specgen.core.drafters.head_formats import check_against, load_head, save_speculators

EXPECTED_WEIGHTS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    *(f"layers.0.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm",
                                       "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                       "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")),
}


def inputs(config, n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.target_vocab_size, (n,), generator=g)
    aux = torch.randn(n, 3 * config.target_hidden_size, generator=g)
    return ids, aux


# ---- an independent reference, from the EAGLE-3 paper's layer and Llama's equations ----------

def rms(x, weight, eps):
    return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rope(x, position, base):
    """x [D] at an integer position: pair (i, i + D/2) turned by position / base^(2i/D)."""
    d = x.shape[0]
    out = x.clone()
    for i in range(d // 2):
        angle = position / base ** (2 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        out[i] = x[i] * c - x[i + d // 2] * s
        out[i + d // 2] = x[i + d // 2] * c + x[i] * s
    return out


def reference(head, ids, features, positions):
    """logits [N, Vd] and hidden [N, H] of the whole sequence, causal by position."""
    w, c = {k: v.double() for k, v in head.state_dict().items()}, head.config
    L = "layers.0."
    h = features.double() @ w["fc.weight"].T if features.shape[1] == 3 * c.target_hidden_size else features.double()
    e = head.embedding.double()[ids]
    normed = rms(h, w[L + "hidden_norm.weight"], c.rms_norm_eps)
    x = torch.cat([rms(e, w[L + "input_layernorm.weight"], c.rms_norm_eps), normed], dim=-1)
    n, D, group = len(ids), c.head_dim, c.num_attention_heads // c.num_key_value_heads
    q = (x @ w[L + "self_attn.q_proj.weight"].T).view(n, -1, D)
    k = (x @ w[L + "self_attn.k_proj.weight"].T).view(n, -1, D)
    v = (x @ w[L + "self_attn.v_proj.weight"].T).view(n, -1, D)
    out = torch.zeros(n, c.num_attention_heads, D, dtype=torch.float64)
    for a in range(n):
        for hd in range(c.num_attention_heads):
            qa = rope(q[a, hd], int(positions[a]), c.rope_theta)
            seen = [b for b in range(n) if positions[b] <= positions[a]]
            scores = torch.stack([qa @ rope(k[b, hd // group], int(positions[b]), c.rope_theta) for b in seen])
            weights = torch.softmax(scores / math.sqrt(D), dim=0)
            out[a, hd] = sum(wt * v[b, hd // group] for wt, b in zip(weights, seen))
    residual = normed if c.norm_before_residual else h
    h1 = residual + out.reshape(n, -1) @ w[L + "self_attn.o_proj.weight"].T
    m = rms(h1, w[L + "post_attention_layernorm.weight"], c.rms_norm_eps)
    gate, up = m @ w[L + "mlp.gate_proj.weight"].T, m @ w[L + "mlp.up_proj.weight"].T
    h2 = h1 + (gate * torch.sigmoid(gate) * up) @ w[L + "mlp.down_proj.weight"].T
    return rms(h2, w["norm.weight"], c.rms_norm_eps) @ w["lm_head.weight"].T, h2


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_forward_matches_the_published_equations(norm_before_residual):
    head = build_head(tiny_head_config(norm_before_residual=norm_before_residual))
    ids, aux = inputs(head.config, 7)
    positions = torch.arange(7)
    logits, hidden = head(ids, aux, positions)
    ref_logits, ref_hidden = reference(head, ids, aux, positions)
    assert logits.shape == (7, head.config.draft_vocab_size) and hidden.shape == (7, head.config.hidden_size)
    torch.testing.assert_close(logits.double(), ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden.double(), ref_hidden, atol=1e-5, rtol=1e-5)
    # the residual rule matters: the other choice gives other numbers
    other = build_head(tiny_head_config(norm_before_residual=not norm_before_residual))
    other.load_state_dict(head.state_dict())
    assert not torch.allclose(other(ids, aux, positions)[0], logits, atol=1e-3)


def test_own_hidden_states_continue_the_sequence_as_features():
    """Rows the head drafted itself take its output hidden state (width H, no fc) as feature."""
    head = build_head()
    ids, aux = inputs(head.config, 6)
    with torch.no_grad():
        logits, hidden = head(ids[:4], aux[:4])
        drafted = ids[4:6]
        own = torch.stack([hidden[3], torch.randn(head.config.hidden_size)])
        logits2, _ = head(drafted, own)
        features = torch.cat([head.fuse(aux[:4]), own])
        ref_logits, _ = reference(head, torch.cat([ids[:4], drafted]), features, torch.arange(6))
    torch.testing.assert_close(torch.cat([logits, logits2]).double(), ref_logits, atol=1e-5, rtol=1e-5)
    assert int(head.position) == 6


def test_cached_steps_equal_one_forward_over_the_sequence():
    head = build_head()
    ids, aux = inputs(head.config, 9)
    with torch.no_grad():
        whole, whole_hidden = head(ids, aux)
        head.reset()
        parts = [head(ids[i:j], aux[i:j]) for i, j in [(0, 3), (3, 4), (4, 5), (5, 9)]]
    torch.testing.assert_close(torch.cat([p[0] for p in parts]), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), whole_hidden, atol=1e-5, rtol=1e-5)
    assert int(head.position) == 9


def test_rollback_by_moving_the_position():
    head = build_head()
    ids, aux = inputs(head.config, 8)
    wrong_ids, wrong_aux = inputs(head.config, 3, seed=7)
    with torch.no_grad():
        whole, _ = head(ids, aux)
        head.reset()
        head(ids[:5], aux[:5])
        rejected, _ = head(wrong_ids, wrong_aux)  # rows 5..7 that the target turns down
        head.position.sub_(3)
        again, _ = head(ids[5:], aux[5:])
    assert not torch.allclose(rejected, whole[5:], atol=1e-3)
    torch.testing.assert_close(again, whole[5:], atol=1e-5, rtol=1e-5)


def test_reserve_grows_the_cache_and_restarts():
    head = build_head()
    assert head.capacity == head.config.max_position_embeddings
    head.reserve(100)
    ids, aux = inputs(head.config, 90)
    with torch.no_grad():
        logits, _ = head(ids, aux)
    assert head.k_cache.shape[2] == 100 and int(head.position) == 90 and torch.isfinite(logits).all()


def test_draft_vocabulary_maps_to_target_ids_and_nothing_else_can_be_proposed():
    head = build_head()
    c = head.config
    kept = torch.nonzero(head.t2d).flatten()
    assert torch.equal(head.to_target_ids(torch.arange(c.draft_vocab_size)), kept)
    draft_logits = torch.randn(5, c.draft_vocab_size)
    width = c.target_vocab_size + 8  # padded logits, as the round's are
    full = head.target_logits(draft_logits, width)
    assert full.shape == (5, width) and full.dtype == torch.float32
    outside = torch.ones(width, dtype=torch.bool)
    outside[kept] = False
    assert torch.isinf(full[:, outside]).all() and (full[:, outside] < 0).all()
    assert torch.equal(full[:, kept], draft_logits)
    q = torch.softmax(full, dim=-1)
    assert (q[:, outside] == 0).all()
    assert torch.equal(full.argmax(-1), head.to_target_ids(draft_logits.argmax(-1)))


def test_llama3_rope_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    head = build_head(tiny_head_config(rope_scaling=scaling, rope_theta=500000.0))
    positions = torch.arange(0, 60, 7)
    cos, sin = head.rotary(positions, torch.float32)
    c = head.config
    theirs = LlamaRotaryEmbedding(LlamaConfig(hidden_size=c.num_attention_heads * c.head_dim, head_dim=c.head_dim,
                                              num_attention_heads=c.num_attention_heads, rope_theta=500000.0,
                                              rope_scaling=scaling, max_position_embeddings=64))
    tcos, tsin = theirs(torch.zeros(1), positions[None])
    torch.testing.assert_close(cos[:, 0], tcos[0])
    torch.testing.assert_close(sin[:, 0], tsin[0])
    plain = build_head(tiny_head_config(rope_theta=500000.0)).rotary(positions, torch.float32)[0]
    assert not torch.allclose(plain, cos)


# ---- formats -----------------------------------------------------------------------------------

def test_speculators_round_trip_is_bit_identical(tmp_path):
    head = build_head()
    folder = save_speculators(head, tmp_path / "head", "tiny/target", ["LlamaForCausalLM"], speculative_tokens=4)
    assert set(load_file(str(folder / "model.safetensors"))) == EXPECTED_WEIGHTS
    loaded = load_head(folder, embedding=head.embedding)
    assert loaded.config == head.config and not loaded.owns_embedding
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    ids, aux = inputs(head.config, 6)
    with torch.no_grad():
        for a, b in zip(head(ids, aux), loaded(ids, aux)):
            assert torch.equal(a, b)


def test_speculators_config_has_what_vllm_reads(tmp_path):
    head = build_head()
    folder = save_speculators(head, tmp_path, "org/target", ["LlamaForCausalLM"], 5)
    raw = json.loads((folder / "config.json").read_text())
    c = head.config
    assert raw["architectures"] == ["Eagle3Speculator"] and raw["speculators_model_type"] == "eagle3"
    assert raw["draft_vocab_size"] == c.draft_vocab_size and raw["target_hidden_size"] == c.target_hidden_size
    assert raw["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and raw["norm_before_residual"] is False
    layer = raw["transformer_layer_config"]
    assert (layer["hidden_size"], layer["vocab_size"], layer["num_hidden_layers"], layer["head_dim"]) == (32, 40, 1, 8)
    spec = raw["speculators_config"]
    assert spec["verifier"] == {"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]}
    assert spec["proposal_methods"][0]["speculative_tokens"] == 5 and spec["algorithm"] == "eagle3"
    assert raw["torch_dtype"] == "float32"


def test_original_eagle3_format_loads_to_the_same_head(tmp_path):
    head = build_head()
    original = load_head(write_eagle3_original(head, tmp_path / "eagle3"), embedding=head.embedding)
    speculators = load_head(save_speculators(head, tmp_path / "spec", "t"), embedding=head.embedding)
    assert original.config == speculators.config  # layer ids shifted back by one
    ids, aux = inputs(head.config, 6)
    with torch.no_grad():
        for a, b in zip(original(ids, aux), speculators(ids, aux)):
            assert torch.equal(a, b)


def test_a_checkpoints_own_embedding_is_used_and_saved(tmp_path):
    head = build_head(owns_embedding=True)
    folder = save_speculators(head, tmp_path / "spec", "t")
    assert "embed_tokens.weight" in load_file(str(folder / "model.safetensors"))
    other_target = torch.zeros_like(head.embedding)
    for loaded in (load_head(folder), load_head(folder, embedding=other_target),
                   load_head(write_eagle3_original(head, tmp_path / "orig", with_embedding=True))):
        assert loaded.owns_embedding and torch.equal(loaded.embedding, head.embedding)


def test_no_vocabulary_maps_means_the_whole_vocabulary(tmp_path):
    config = tiny_head_config(draft_vocab_size=40)
    head = build_head(config)
    folder = save_speculators(head, tmp_path, "t")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["d2t"], tensors["t2d"]
    save_file(tensors, str(folder / "model.safetensors"))
    loaded = load_head(folder, embedding=head.embedding)
    assert torch.equal(loaded.to_target_ids(torch.arange(40)), torch.arange(40)) and loaded.t2d.all()


def test_dtype_follows_the_checkpoint(tmp_path):
    head = build_head().to(torch.bfloat16)
    loaded = load_head(save_speculators(head, tmp_path, "t"), embedding=head.embedding)
    assert loaded.fc.weight.dtype == torch.bfloat16 and loaded.k_cache.dtype == torch.bfloat16
    assert torch.equal(loaded.lm_head.weight, head.lm_head.weight)


# ---- errors: every one a UsageError (exit code 2) that says what is wrong ------------------------

@pytest.fixture
def saved(tmp_path):
    head = build_head()
    return save_speculators(head, tmp_path / "head", "t"), head


def edit_config(folder, change):
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def edit_weights(folder, change):
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def load_error(folder, embedding) -> str:
    with pytest.raises(UsageError) as caught:
        load_head(folder, embedding=embedding)
    assert caught.value.exit_code == 2 and "\n" not in caught.value.message
    return caught.value.message


def test_missing_folder_and_files(tmp_path, saved):
    folder, head = saved
    assert "head folder" in load_error(tmp_path / "nope", head.embedding) and "not found" in load_error(
        tmp_path / "nope", head.embedding)
    assert "is not a folder" in load_error(folder / "config.json", head.embedding)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(UsageError) as caught:
        load_head(folder, embedding=head.embedding)
    assert "contains no weights (*.safetensors)" in caught.value.message
    assert "safetensors only, not pytorch_model.bin" in caught.value.hint
    (folder / "config.json").unlink()
    assert "has no config.json" in load_error(folder, head.embedding)


@pytest.mark.parametrize("change, expected", [
    (lambda raw: raw.update(architectures=["LlamaForCausalLM"], speculators_model_type=None),
     "architecture LlamaForCausalLM is not an EAGLE-3 head; specgen reads Eagle3Speculator"),
    (lambda raw: raw.update(speculators_model_type="eagle"), "speculators model type `eagle` is not an EAGLE-3 head"),
    (lambda raw: raw.pop("draft_vocab_size"), "missing `draft_vocab_size`"),
    (lambda raw: raw["transformer_layer_config"].pop("hidden_size"), "missing `transformer_layer_config.hidden_size`"),
    (lambda raw: raw["transformer_layer_config"].update(num_hidden_layers=2),
     "num_hidden_layers = 2 is not supported: specgen's EAGLE-3 head is one Llama layer"),
    (lambda raw: raw["transformer_layer_config"].update(hidden_act="gelu"), 'hidden_act = "gelu" is not supported'),
    (lambda raw: raw.update(norm_before_fc=True), "norm_before_fc = true is not supported"),
    (lambda raw: raw.update(draft_vocab_size=0), "draft_vocab_size = 0 must be a positive integer"),
    (lambda raw: raw.update(draft_vocab_size=41), "draft_vocab_size (41) is larger than the target's vocabulary (40)"),
    (lambda raw: raw.update(eagle_aux_hidden_state_layer_ids=[1, 2]), "aux_layer_ids = [1, 2] must be three"),
    (lambda raw: raw["transformer_layer_config"].update(rope_scaling={"rope_type": "bogus"}),
     "rope_scaling type 'bogus' is not one of"),
    (lambda raw: raw["transformer_layer_config"].update(num_attention_heads=0, head_dim=None),
     "num_attention_heads = 0 must be a positive integer"),
    (lambda raw: raw["transformer_layer_config"].update(rope_scaling="linear"),
     'rope_scaling = "linear" must be an object, such as {"rope_type": "linear", "factor": 2.0}, or null'),
    (lambda raw: raw["transformer_layer_config"].update(rope_scaling={"rope_type": "dynamic"}),
     'rope_scaling of type "dynamic" needs a `factor`'),
    (lambda raw: raw["transformer_layer_config"].update(rope_scaling={"type": "linear", "factor": "x"}),
     "rope_scaling's factor = \"x\" must be a number >= 1"),
    (lambda raw: raw["transformer_layer_config"].update(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
     'rope_scaling = {"rope_type": "llama3", "factor": 8.0} cannot be used: Missing required keys'),
], ids=["architecture", "speculators type", "no draft vocab", "no hidden size", "layers", "activation",
        "norm before fc", "draft vocab 0", "draft vocab too large", "two aux ids", "rope type", "no heads",
        "rope scaling a string", "rope scaling without factor", "rope factor a string", "llama3 keys missing"])
def test_config_errors(saved, change, expected):
    folder, head = saved
    edit_config(folder, change)
    assert expected in load_error(folder, head.embedding)


def test_config_not_json(saved):
    folder, head = saved
    (folder / "config.json").write_text("{not json")
    assert "config.json: cannot read it as JSON" in load_error(folder, head.embedding)
    (folder / "config.json").write_text("[1, 2]")
    assert "config.json: not a JSON object" in load_error(folder, head.embedding)


@pytest.mark.parametrize("change, expected", [
    (lambda t: t.pop("layers.0.mlp.up_proj.weight"), "missing weights layers.0.mlp.up_proj.weight"),
    (lambda t: t.pop("d2t"), "missing weights d2t"),
    (lambda t: t.update({"fc.bias": torch.zeros(32)}), "unexpected weights fc.bias"),
    (lambda t: t.update({"lm_head.weight": torch.zeros(30, 32)}),
     "`lm_head.weight` has shape [30, 32] but config.json implies [24, 32]"),
    (lambda t: t.update({"embed_tokens.weight": torch.zeros(40, 16)}),
     "`embed_tokens.weight` has shape [40, 16] but config.json implies [40, 32]"),
    (lambda t: t["d2t"].__setitem__(0, t["d2t"][1] + 1), "d2t and t2d do not describe the same draft vocabulary"),
    (lambda t: t["d2t"].__setitem__(23, 100), "d2t and t2d do not describe the same draft vocabulary"),
    (lambda t: t["t2d"].__setitem__(slice(None), True), "d2t and t2d do not describe the same draft vocabulary"),
])
def test_weight_errors(saved, change, expected):
    folder, head = saved
    edit_weights(folder, change)
    assert expected in load_error(folder, head.embedding)


def test_unreadable_and_duplicate_weights(saved):
    folder, head = saved
    save_file({"fc.weight": head.fc.weight.detach().clone()}, str(folder / "extra.safetensors"))
    assert "weight `fc.weight` appears twice" in load_error(folder, head.embedding)
    (folder / "extra.safetensors").write_bytes(b"garbage")
    assert "extra.safetensors: not a readable safetensors file" in load_error(folder, head.embedding)


def test_embedding_errors(saved):
    folder, head = saved
    assert "carries no embed_tokens.weight and no target embedding was given" in load_error(folder, None)
    assert "needs a [40, 32] embedding but the target's is [40, 48]" in load_error(folder, torch.zeros(40, 48))


def test_check_against_the_target():
    from transformers import LlamaConfig

    config = tiny_head_config(aux_layer_ids=None)

    def target(**changes):
        return LlamaConfig(**{"hidden_size": 48, "vocab_size": 40, "num_hidden_layers": 8,
                               "num_attention_heads": 4, **changes})

    assert check_against(config, target()).aux_layer_ids == (2, 4, 5)  # EAGLE-3's default for 8 layers
    assert check_against(tiny_head_config(), target()).aux_layer_ids == (1, 2, 3)
    cases = [(config, target(hidden_size=64), "reads hidden states of width 48 but the target's hidden size is 64"),
             (config, target(vocab_size=50), "maps to a 40-token vocabulary but the target has 50 tokens"),
             (tiny_head_config(aux_layer_ids=(1, 2, 8)), target(), "reads the target's layers [1, 2, 8] but the "
                                                                   "target has 8 (ids 0 to 7)")]
    for head_config, target_config, expected in cases:
        with pytest.raises(UsageError) as caught:
            check_against(head_config, target_config, where="head h")
        assert caught.value.exit_code == 2 and expected in caught.value.message and "head h" in caught.value.message


def test_config_rejects_ambiguous_widths():
    with pytest.raises(ValueError, match="cannot tell the target's features"):
        tiny_head_config(hidden_size=48, target_hidden_size=16)
    with pytest.raises(ValueError, match="the head needs"):
        Eagle3Head(tiny_head_config(), torch.zeros(40, 16))
