"""specgen's own model step (core/step/): every family's logits against transformers', the rows
interface (a chain, independent rows, skipped slots), the configs it covers, and the loader's choice."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from specgen.core.errors import ModelError
from specgen.core.models import loading as models
from specgen.core.models.loading import cache_keyword, load_model, load_pair, new_cache, owned
from specgen.core.settings import ModelSpec
from specgen.core.step import config as step_config
from specgen.core.step import rows as rowsets
from specgen.core.step.cache import SlotCache
from specgen.core.step.load import load
from specgen.core.step.model import GrowingCache, OwnedModel
from specgen.core.step.ops import TorchOps
from specgen.core.step.rows import Rows
from rows_helpers import TREES, leaves, path
from tiny_models import build_family, family_pairs

FAMILIES = list(family_pairs().FAMILIES)
LLAMAS = {  # the shapes plain Llama checkpoints come in
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


def ours(folder, dtype=torch.float32) -> OwnedModel:
    return load(folder, step_config.of(json.loads((folder / "config.json").read_text())), dtype, torch.device("cpu"))


def theirs(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    return request.param, build_family(tmp_path_factory.mktemp("step"), request.param)


class RowwiseOps(TorchOps):
    """The reference with each row's products computed alone (one matrix-vector product a row), so
    that a row's result cannot depend on how many rows share the step: the property the GPU's
    kernels have by construction and the CPU's matrix libraries do not promise."""

    def linear(self, x, weight, bias=None, residual=None):
        rows = x.reshape(-1, x.shape[-1])
        out = torch.stack([F.linear(row, weight, bias) for row in rows]).reshape(*x.shape[:-1], -1)
        return out if residual is None else residual + out

    def attention(self, q, k, v, cache, layer, rows, rotary, scale, window=None, softcap=None):
        """Each row over exactly the keys it sees, gathered: slots it does not see cannot change the
        length of its reductions."""
        b, n, heads, d = q.shape
        q, k = self.rope(q, rotary), self.rope(k, rotary)
        self.write(k, v, cache, layer, rows)
        out = torch.empty(b, n, heads * d, dtype=q.dtype)
        for s in range(b):
            for i in range(n):
                seen = rows.seen(cache.capacity)[s, i].clone()
                if window is not None:
                    seen &= rows.positions[s, i] - cache.positions[s, :len(seen)] < window
                keep = seen.nonzero()[:, 0]
                gathered = SimpleNamespace(keys={layer: cache.keys[layer][s:s + 1, :, keep]},
                                           values={layer: cache.values[layer][s:s + 1, :, keep]}, capacity=len(keep))
                one = rowsets.chain(rows.ids[s:s + 1, i:i + 1], len(keep) - 1)  # sees all it gathered
                out[s, i] = self.read(q[s:s + 1, i:i + 1], gathered, layer, one, scale, None, softcap)[0, 0]
        return out


# ---------------------------------------------------------------- logits against transformers


@pytest.mark.parametrize("role", ["target", "draft"])
def test_every_family_computes_transformers_logits(family, role):
    """Llama 3.1 (llama3 rope, tied and untied), Qwen2.5 (biases), Qwen3 (q/k norms), Gemma 2 (sandwich
    norms, soft-capping, scaled embeddings, a 24-token sliding window the 60 positions pass): one
    forward over the whole sequence, then the same tokens prefilled and stepped through the cache."""
    name, folder = family
    reference, model = theirs(folder / role), ours(folder / role)
    if name == "gemma-2":
        reference.set_attn_implementation("eager")  # transformers' SDPA path drops the soft cap
    ids = torch.randint(0, model.config.vocab_size, (1, 60), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = reference(ids).logits
        torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-5)
        cache = GrowingCache(model)
        stepped = [model(ids[:, a:b], past_key_values=cache).logits for a, b in ((0, 30), (30, 31), (31, 60))]
    torch.testing.assert_close(torch.cat(stepped, dim=1), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", LLAMAS)
def test_a_cache_rolled_back_matches_transformers(tmp_path, name):
    """Prefill 7, a 3-token round, then two rejected (the cache cropped) and one step, as rounds do."""
    from transformers import DynamicCache

    reference = save_llama(tmp_path, **LLAMAS[name])
    model = ours(tmp_path)
    ids = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(1))
    mine, yours = GrowingCache(model), DynamicCache()
    with torch.inference_mode():
        for start, stop, crop in ((0, 7, None), (7, 10, None), (8, 9, 2)):
            if crop:
                mine.crop(-crop)
                yours.crop(-crop)
            got = model(ids[:, start:stop], past_key_values=mine).logits
            want = reference(input_ids=ids[:, start:stop], **{cache_keyword(type(reference).forward): yours},
                             use_cache=True).logits
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bfloat16_weights_load_in_the_dtype_asked_for(tmp_path):
    reference = save_llama(tmp_path, **LLAMAS["gqa-tied"])
    model = ours(tmp_path, torch.bfloat16)
    assert model.dtype == torch.bfloat16 and model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        want = reference.to(torch.bfloat16)(ids).logits.float()
        torch.testing.assert_close(model(ids).logits.float(), want, rtol=0.05, atol=0.05)
    assert model.generation_config.eos_token_id == reference.generation_config.eos_token_id


def test_sharded_checkpoints_load(tmp_path):
    from transformers import LlamaForCausalLM

    reference = save_llama(tmp_path / "whole", **LLAMAS["mha"])
    LlamaForCausalLM.save_pretrained(reference, tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ids = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(ours(tmp_path / "sharded")(ids).logits, reference(ids).logits)


# ---------------------------------------------------------------- rows are data


def _prefilled(model: OwnedModel, prefix: torch.Tensor, ops=None, capacity: int = 32):
    cache = model.new_cache(1, capacity)
    model.step(rowsets.chain(prefix[None], 0), cache, ops or TorchOps())
    return cache


def test_a_chain_given_as_explicit_slots_is_the_forward_itself(family):
    """Rows spelled out by hand (positions, slots, each row's tail of slots 0 .. i after an empty
    prefix) give bitwise the logits of the model's own forward over the same tokens."""
    _, folder = family
    model = ours(folder / "target")
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    at = torch.arange(9)[None]
    tail = torch.arange(9).expand(1, 9, 9)  # entries past each row's depth are padding
    with torch.inference_mode():
        rows = Rows(ids, at, at, torch.tensor([0]), tail, at + 1, span=9)
        assert torch.equal(rows.seen(16), torch.ones(9, 9, dtype=torch.bool).tril()[None])
        got = model.step(rows, model.new_cache(1, 16))
        assert torch.equal(got, model(ids).logits)


def test_independent_rows_in_one_step_equal_each_alone(family):
    """Two sequences (each its own cache row, its own length) in one step, and two rows of one
    sequence that do not see each other (a tree's siblings): each row's logits are bitwise those of
    its step alone, on the row-by-row reference; the plain reference agrees to rounding."""
    _, folder = family
    model = ours(folder / "target")
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randint(0, model.config.vocab_size, (n,), generator=g) for n in (7, 4))
    x, y = torch.randint(0, model.config.vocab_size, (2,), generator=g)
    for ops in (RowwiseOps(), TorchOps()):
        check = torch.equal if isinstance(ops, RowwiseOps) else lambda u, v: torch.allclose(u, v, rtol=1e-4, atol=1e-4)
        with torch.inference_mode():
            alone = []
            for prefix, token in ((a, x), (b, y)):
                cache = _prefilled(model, prefix)
                alone.append(model.step(rowsets.chain(token.view(1, 1), len(prefix)), cache, ops))
            both = model.new_cache(2, 32)
            for row, prefix in enumerate((a, b)):
                single = model.new_cache(1, 32)
                model.step(rowsets.chain(prefix[None], 0), single)
                for mine, theirs in ((both.keys, single.keys), (both.values, single.values)):
                    for layer, source in zip(mine, theirs):
                        layer[row].copy_(source[0])
            rows = rowsets.independent([rowsets.chain(x.view(1, 1), len(a)), rowsets.chain(y.view(1, 1), len(b))])
            together = model.step(rows, both, ops)
            assert check(together[0], alone[0][0]) and check(together[1], alone[1][0])
            # siblings: x and y both after a, at the same position, in slots 7 and 8
            cache = _prefilled(model, a)
            siblings = rowsets.tree(torch.stack([x, y])[None], torch.tensor([-1, -1]), 7)
            assert siblings.positions.tolist() == [[7, 7]] and siblings.slots.tolist() == [[7, 8]]
            pair = model.step(siblings, cache, ops)
            second = model.step(rowsets.chain(y.view(1, 1), len(a)), _prefilled(model, a), ops)
            assert check(pair[0, 0], alone[0][0, 0]) and check(pair[0, 1], second[0, 0])


def test_a_row_that_skips_slots_equals_a_cache_that_never_held_them(family):
    """A cache holding a rejected token in slot 3 (the rows after it at the positions they would have
    without it): a row that does not see slot 3 gets the logits of a cache that never held it."""
    _, folder = family
    model = ours(folder / "target")
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, model.config.vocab_size, (6,), generator=g)
    junk = torch.randint(0, model.config.vocab_size, (1,), generator=g)
    with torch.inference_mode():
        clean = _prefilled(model, ids[:5], RowwiseOps())
        want = model.step(rowsets.chain(ids[5:].view(1, 1), 5), clean, RowwiseOps())
        held = model.new_cache(1, 32)
        tokens = torch.cat([ids[:3], junk, ids[3:5]])[None]  # slots 0-5; slot 3 is the junk
        branches = rowsets.tree(tokens, torch.tensor([-1, 0, 1, 2, 2, 4]), 0)  # the junk a sibling of slot 4
        assert branches.positions.tolist() == [[0, 1, 2, 3, 3, 4]]
        model.step(branches, held, RowwiseOps())
        # the next row: the first three slots as its prefix, then slots 4, 5 and its own, 6
        row = Rows(ids[5:].view(1, 1), torch.tensor([[5]]), torch.tensor([[6]]), torch.tensor([3]),
                   torch.tensor([[[4, 5, 6]]]), torch.tensor([[3]]), span=7)
        got = model.step(row, held, RowwiseOps())
    assert torch.equal(got, want)


def test_the_layouts_say_what_each_row_sees():
    """seen(): a chain's rows see the slots up to their own; a tree node the prefix and its
    ancestors; a batch's sequences each their own prefix. The kernel walks the same data."""
    ids = torch.zeros(2, 3, dtype=torch.long)
    chained = rowsets.batch(ids, [2, 0])
    assert chained.span == 5 and chained.positions.tolist() == [[2, 3, 4], [0, 1, 2]]
    want = [[[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]]
    assert chained.seen(9).int().tolist() == want
    assert torch.equal(rowsets.independent([rowsets.chain(ids[:1], 2), rowsets.chain(ids[:1], 0)]).seen(5),
                       chained.seen(5))
    branched = rowsets.tree(ids, torch.tensor([-1, -1, 0]), torch.tensor([2, 1]))
    assert branched.span is None and branched.positions.tolist() == [[2, 2, 3], [1, 1, 2]]
    assert branched.slots.tolist() == [[2, 3, 4], [1, 2, 3]] and branched.depth.tolist() == [[1, 1, 2]] * 2
    assert branched.seen(5).int().tolist() == [[[1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 1, 0, 1]],
                                               [[1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0]]]
    tail, depth = chained.paths()  # a chain as explicit tails sees the same
    spelled = Rows(ids, chained.positions, chained.slots, chained.start, tail, depth, span=5)
    assert torch.equal(spelled.seen(7), chained.seen(7))
    lopsided = rowsets.tree(torch.zeros(1, 8, dtype=torch.long), torch.tensor(TREES["lopsided"]), 10)
    for node in range(8):  # each node's tail: its path's slots, in path order, its own last
        d = int(lopsided.depth[0, node])
        assert lopsided.tail[0, node, :d].tolist() == [10 + i for i in path(TREES["lopsided"], node)]
        assert int(lopsided.positions[0, node]) == 9 + d
    shallow = rowsets.tree(torch.zeros(1, 8, dtype=torch.long), torch.tensor(TREES["lopsided"]), 10, levels=6)
    assert shallow.tail.shape == (1, 8, 6) and torch.equal(shallow.seen(20), lopsided.seen(20))


def test_compact_moves_keys_values_and_positions():
    """The step's compact op: slots src to slots dst in every layer and the positions, reading all
    sources before writing (a tree's path moves down onto slots it may have come from)."""
    cache = SlotCache(2, 1, 2, 4, 12, torch.float32, torch.device("cpu"))
    for table in (*cache.keys, *cache.values):
        table.copy_(torch.randn_like(table))
    cache.positions.copy_(torch.arange(12))
    before = [t.clone() for t in (*cache.keys, *cache.values)]
    src, dst = torch.tensor([[6, 7, 4]]), torch.tensor([[5, 6, 7]])
    TorchOps().compact(cache, src, dst)
    for old, new in zip(before, (*cache.keys, *cache.values)):
        assert torch.equal(new[:, :, [5, 6, 7]], old[:, :, [6, 7, 4]])
        assert torch.equal(new[:, :, :5], old[:, :, :5]) and torch.equal(new[:, :, 8:], old[:, :, 8:])
    assert cache.positions[0, 4:9].tolist() == [4, 6, 7, 4, 8]


def test_first_rows_of_a_cache_are_a_view_of_them():
    """SlotCache.first(n): a cache of its first n rows in the same memory (every layer's keys and
    values, the planes and the positions), so a step over n sequences writes the cache's rows."""
    cache = SlotCache(3, 4, 2, 4, 12, torch.float32, torch.device("cpu"))
    view = cache.first(2)
    assert view.capacity == 12 and view.keys[0].shape == (2, 2, 12, 4) and len(view.values) == 3
    view.values[2][1, :, 5].fill_(7.0)
    view.positions[1, 5] = 9
    (planes,) = cache.planes.values()
    assert cache.values[2][1, :, 5].eq(7.0).all() and planes[1, 2, 1, :, 5].eq(7.0).all()
    assert cache.positions[1, 5].item() == 9 and planes.abs().sum().item() == 7.0 * 2 * 4
    assert view.planes[torch.device("cpu")].shape == (2, 3, 2, 2, 12, 4)


@pytest.mark.parametrize("shape", ["binary", "lopsided"])
def test_tree_rows_equal_the_chains_of_their_paths(family, shape):
    """Every node of a token tree verified in one step gets the logits of its path fed as a chain
    after the same prefix: bitwise on the row-by-row reference, to rounding on the plain one. The
    26-token prefix takes the tree past Gemma 2's 24-token window."""
    _, folder = family
    model = ours(folder / "target")
    parents = TREES[shape]
    g = torch.Generator().manual_seed(6)
    prefix, nodes = (torch.randint(0, model.config.vocab_size, (n,), generator=g) for n in (26, len(parents)))
    for ops in (RowwiseOps(), TorchOps()):
        check = torch.equal if isinstance(ops, RowwiseOps) else lambda u, v: torch.allclose(u, v, rtol=1e-4, atol=1e-4)
        with torch.inference_mode():
            cache = _prefilled(model, prefix, ops, capacity=48)
            got = model.step(rowsets.tree(nodes[None], torch.tensor(parents), 26), cache, ops)[0]
            for leaf in leaves(parents):
                line = path(parents, leaf)
                want = model.step(rowsets.chain(nodes[line][None], 26), _prefilled(model, prefix, ops, 48), ops)[0]
                for row, node in enumerate(line):
                    assert check(got[node], want[row]), (shape, leaf, node)


def test_batch_rows_equal_each_sequence_alone(family):
    """Three sequences of different lengths in one step, as chains and as trees (each its own
    start, its own cache row): every row's logits are bitwise those of its sequence stepped alone,
    on the row-by-row reference."""
    _, folder = family
    model = ours(folder / "target")
    g = torch.Generator().manual_seed(7)
    lengths = [9, 3, 25]
    prefixes = [torch.randint(0, model.config.vocab_size, (n,), generator=g) for n in lengths]
    ids = torch.randint(0, model.config.vocab_size, (3, 4), generator=g)
    parents = torch.tensor([[-1, 0, 1, 2], [-1, -1, 0, 1], [-1, 0, 0, 2]])
    ops = RowwiseOps()
    with torch.inference_mode():
        for make in (lambda: rowsets.batch(ids, lengths), lambda: rowsets.tree(ids, parents, lengths),
                     lambda: rowsets.tree(ids, parents, torch.tensor(lengths))):
            cache = model.new_cache(3, 40)
            for b, prefix in enumerate(prefixes):
                single = _prefilled(model, prefix, ops, 40)
                for mine, theirs in ((cache.keys, single.keys), (cache.values, single.values)):
                    for layer, source in zip(mine, theirs):
                        layer[b].copy_(source[0])
                cache.positions[b].copy_(single.positions[0])
            rows = make()
            together = model.step(rows, cache, ops)
            for b, prefix in enumerate(prefixes):
                one = rowsets.tree(ids[b:b + 1], parents[b], lengths[b]) \
                    if rows.tail is not None else rowsets.chain(ids[b:b + 1], lengths[b])
                alone = model.step(one, _prefilled(model, prefix, ops, 40), ops)
                assert torch.equal(together[b], alone[0]), b


# ---------------------------------------------------------------- which checkpoints, which code


@pytest.mark.parametrize("change", [
    {"architectures": ["LlamaForSequenceClassification"]}, {"hidden_act": "gelu"},
    {"rope_parameters": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0}},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
    {"quantization_config": {"quant_method": "gptq"}}, {"auto_map": {"AutoModelForCausalLM": "custom.Model"}},
    {"pretraining_tp": 2}, {"model_type": "phi3"}, {"layer_types": ["full_attention"]},
])
def test_configs_it_does_not_cover_go_to_transformers(tmp_path, change):
    save_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert step_config.of(config) is not None
    assert step_config.of({**config, **change}) is None


def test_configs_written_by_transformers_4_read_as_those_of_5():
    """rope_theta and rope_scaling at the top level, no layer_types: the same step config."""
    five = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2, "head_dim": 4,
            "sliding_window": 5, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    four = {**{k: v for k, v in five.items() if k not in ("layer_types", "rope_parameters")}, "rope_theta": 1e4}
    assert step_config.of(four) == step_config.of(five)
    assert step_config.of(five).windows == (5, None, 5)
    llama = {**{k: v for k, v in four.items() if k != "sliding_window"},
             "model_type": "llama", "architectures": ["LlamaForCausalLM"], "rope_theta": 5e5,
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}}
    parsed = step_config.of(llama)
    assert parsed.windows == (None,) * 3 and parsed.rope_parameters["rope_theta"] == 5e5


def test_the_loader_takes_the_owned_step_on_the_cpu_for_every_family(family):
    from transformers import PreTrainedModel

    name, folder = family
    pair = load_pair(_profile(folder))
    assert pair.modeling == "specgen" and isinstance(pair.target, OwnedModel) and isinstance(pair.draft, OwnedModel)
    assert isinstance(new_cache(pair.target), GrowingCache)
    spec = ModelSpec(path=str(folder / "target"), device="cpu")
    assert isinstance(load_model(spec, modeling="transformers"), PreTrainedModel)
    assert owned(folder / "target", spec, torch.device("cuda"), True, "auto") is not None
    assert owned(folder / "target", spec, torch.device("cpu"), False, "auto") is None  # pickle weights


def test_a_run_on_transformers_says_why(family, tmp_path):
    """`modeling_note` (generate -v, the bench JSON): the reason in one line, none on the owned step."""
    from dataclasses import replace

    name, folder = family
    profile = _profile(folder)
    assert load_pair(profile).modeling_note is None
    chosen = replace(profile, runtime=replace(profile.runtime, modeling="transformers"))
    assert load_pair(chosen).modeling_note == '[runtime] modeling = "transformers"'
    spec = ModelSpec(path=str(folder / "target"), device="cpu")
    spread = ModelSpec(path=str(folder / "target"), device="cpu", device_map="auto")
    if not torch.cuda.is_available():  # a device_map on a machine without GPUs places weights on the CPU
        assert models.not_owned(folder / "target", spread, torch.device("cpu"), True, "auto") == \
            "a device_map that places weights on the cpu"
    assert models.not_owned(folder / "target", spec, torch.device("cpu"), False, "auto") == \
        "pickle weights (no safetensors)"
    config = json.loads((folder / "target" / "config.json").read_text())
    yarn = {**config, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}
    assert step_config.unsupported(yarn).startswith("rotary embedding 'yarn'")
    assert step_config.unsupported({**config, "model_type": "phi3"}).startswith("model type 'phi3' is not one of")
    assert step_config.unsupported(config) is None


def _profile(folder):
    from decode_helpers import make_profile

    return make_profile(folder / "target", folder / "draft")


def test_weights_that_do_not_match_the_config_are_a_model_error(tmp_path):
    from safetensors.torch import load_file, save_file

    save_llama(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError, match="the weights do not match config.json .1 tensors missing, "
                                         "e.g. model.layers.1.mlp.up_proj.weight"):
        load_model(ModelSpec(path=str(tmp_path), device="cpu"))
    weights["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"`model.layers.1.mlp.up_proj.weight` has shape \[3, 3\] in the files "
                                         r"but config.json implies \[96, 64\]"):
        load_model(ModelSpec(path=str(tmp_path), device="cpu"))
