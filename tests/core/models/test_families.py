"""The families of the real pairs in profiles/ (Llama 3.1 / 3.2, Qwen2.5, Qwen3, Gemma 2), at tiny
size, built by benchmarks/family_pairs.py from their public configs (every architecture key kept,
sizes shrunk, random weights with norms and biases off their constant init).

For each family: the tiny checkpoints carry the family's features (each one changes the logits),
specgen's loader picks the right modeling, greedy speculative decoding equals target-only token
for token, and the GPU path (core/step/ on gpu/ops.py's kernel table; the Triton interpreter on CPU)
computes the plain model's logits, Gemma 2's soft-capped attention included. Float32 throughout;
the tiny models' top-two logit gaps are at least ~2e-3 (seed 0), far above the ~1e-5 by which a
(k+1)-token forward rounds differently from a 1-token one.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from decode_helpers import BACKENDS, finish, make_profile, random_prompts
from gpu_helpers import KernelRunners, kernels, resolved, runner
from repo_paths import REPO
from specgen.core.engine import Engine, target_only
from specgen.core.models.loading import load_model, load_pair
from specgen.core.settings import KernelSpec, ModelSpec, ProposerSpec, SpeculationSpec
from specgen.gpu.policy import ResolvedKernels, attention_unsupported, resolve
from tiny_models import build_family, family_pairs, write_profile

FAMILIES = list(family_pairs().FAMILIES)
CLASSES = {"llama-3.1": "LlamaForCausalLM", "qwen2.5": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "gemma-2": "Gemma2ForCausalLM"}
# Max logit difference between kernel and plain runners (tests/gpu/kernels/test_attention.py's RUNNER_TOLERANCE:
# rounding reaches ~3e-5 on such models; a stale key or a wrong window moves logits by 1e-2 or more).
RUNNER_TOLERANCE = 3e-4


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(name, folder): folder holds target/, draft/ (the family's draft) and copy/ (a noisy target)."""
    return request.param, build_family(tmp_path_factory.mktemp("families"), request.param)


def _load(folder, modeling: str = "transformers"):
    return load_model(ModelSpec(str(folder), dtype="float32", device=str(DEVICE)), modeling=modeling)


def _transformers(profile):
    return replace(profile, runtime=replace(profile.runtime, modeling="transformers"))


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids], device=model.device)).logits[0].float()


def _variant(model, weights=None, **config):
    """The same model with some config values or weights changed (weights: {name: fn(tensor)})."""
    from transformers import AutoModelForCausalLM

    changed = copy.deepcopy(model.config)
    for key, value in config.items():
        setattr(changed, key, value)
    other = AutoModelForCausalLM.from_config(changed, attn_implementation=model.config._attn_implementation)
    other = other.to(model.device).eval()
    state = model.state_dict()
    for name, change in (weights or {}).items():
        for key in [k for k in state if name in k]:
            state[key] = change(state[key])
    other.load_state_dict(state)
    return other


FEATURES = {  # family -> {feature: (config changes, {weight name part: change})} that remove it
    "llama-3.1": {"llama3 rope scaling": (lambda m: {"rope_parameters": {
        "rope_type": "default", "rope_theta": m.config.rope_parameters["rope_theta"]}}, {})},
    "qwen2.5": {"q/k/v biases": (lambda m: {}, {"proj.bias": torch.zeros_like})},
    "qwen3": {"q/k norms": (lambda m: {}, {"q_norm.weight": torch.ones_like, "k_norm.weight": torch.ones_like})},
    "gemma-2": {
        "(1 + w) RMSNorm weights": (lambda m: {}, {"layernorm.weight": torch.zeros_like}),
        "attention soft-capping": (lambda m: {"attn_logit_softcapping": None}, {}),
        "final logit soft-capping": (lambda m: {"final_logit_softcapping": None}, {}),
        "sliding window": (lambda m: {"sliding_window": 4096}, {}),
    },
}


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_has_a_profile_of_the_real_pair(name):
    """profiles/ names the models family_pairs.py builds, and stops on one of the family's special ids."""
    from specgen.core.profile import load_profile

    data = family_pairs().FAMILIES[name]
    profile = load_profile(str(REPO / "profiles" / data.profile))
    assert (profile.target.path, profile.draft.path) == (data.target.hub_id, data.draft.hub_id)
    assert profile.sampling.stop_token_ids and set(profile.sampling.stop_token_ids) <= set(data.specials)
    assert data.target.config["vocab_size"] >= data.tokens and data.draft.config["vocab_size"] >= data.tokens


def test_the_tiny_checkpoints_carry_each_familys_features(family):
    """Removing any feature changes the logits by far more than rounding: the tests below would see
    a path that dropped it. Tied embeddings: one tensor, also after specgen's loader."""
    name, folder = family
    target = _load(folder / "target")
    # eager attention on both sides: transformers' SDPA path drops soft-capping (on CUDA it is the
    # default, and the cap would then change nothing in either model)
    target.set_attn_implementation("eager")
    ids = list(range(5, 65))  # 60 positions: past the 24-token windows and the 64-position rope cutoff
    want = _logits(target, ids)
    for feature, (config, weights) in FEATURES[name].items():
        got = _logits(_variant(target, weights, **config(target)), ids)
        assert (got - want).abs().max().item() > 1e-2, f"{name}: {feature} changes nothing"
    draft = _load(folder / "draft")
    assert draft.get_output_embeddings().weight is draft.get_input_embeddings().weight
    assert (target.get_output_embeddings().weight is target.get_input_embeddings().weight) == (name == "gemma-2")


def test_loader_picks_the_modeling(family):
    """Every family runs on specgen's own model step on the CPU (core/step/), on transformers when
    the profile says so; tokenizers match the real sizes' layout."""
    name, folder = family
    assert load_pair(make_profile(folder / "target", folder / "draft")).modeling == "specgen"
    pair = load_pair(_transformers(make_profile(folder / "target", folder / "draft")))
    assert pair.modeling == "transformers"
    assert type(pair.target).__name__ == type(pair.draft).__name__ == CLASSES[name]
    assert pair.vocab_size == family_pairs().TINY_TOKENS
    rows = {role: pair_model.get_output_embeddings().weight.shape[0] for role, pair_model in
            (("target", pair.target), ("draft", pair.draft))}
    assert rows["target"] >= rows["draft"] >= pair.vocab_size  # Qwen2.5: padding rows, more in the target
    assert (rows["target"] > rows["draft"]) == (name == "qwen2.5")


def test_prompts_encode_through_whichever_tokenizer_class_loads(family):
    """One token a character, and back, whatever class the loader picks (transformers 5 takes its
    own Qwen2Tokenizer for Qwen2.5, which rebuilds the tokenizer from the vocabulary)."""
    name, folder = family
    tokenizer = load_pair(make_profile(folder / "target", folder / "draft")).tokenizer
    for line in (folder / "prompts.jsonl").read_text().splitlines():
        text = json.loads(line)["prompt"]
        ids = tokenizer(text)["input_ids"]
        assert len(ids) == len(text) and tokenizer.decode(ids) == text, f"{name}: {type(tokenizer).__name__}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("draft", ["draft", "copy"])
def test_greedy_speculative_equals_target_only(family, draft, backend):
    """k = 1 and 4, with the family's own draft (almost every draft rejected) and with a noisy copy
    of the target (drafts accepted part of the time); a 30-token prompt reaches past the windows."""
    name, folder = family
    engine = Engine(make_profile(folder / "target", folder / draft, backend=backend))
    prompts = random_prompts(engine.pair.vocab_size, 4) + [list(range(10, 40))]
    reference = [finish(engine.decoder(target_only(engine.profile)), p).token_ids for p in prompts]
    accepted = 0
    for k in (1, 4):
        profile = replace(engine.profile, speculation=SpeculationSpec(k=k))
        for prompt, expected in zip(prompts, reference):
            result = finish(engine.decoder(profile), prompt)
            assert result.token_ids == expected, f"{name} {draft} k={k} prompt={prompt}"
            assert result.stats.drafted > 0
            accepted += result.stats.accepted
    if draft == "copy":
        assert accepted > 0, "the noisy copy never agreed: acceptance paths untested"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-3.1", "qwen3"])  # the families with published EAGLE-3 heads
def test_a_built_head_drafts_for_its_target_and_changes_no_token(name, tmp_path):
    """family_pairs.py --head: a head of the published heads' shape (the target's width, a draft
    vocabulary of half the tiny one's) that specgen loads from the profile the script writes and
    drafts with; greedy output equals target-only's."""
    from specgen.core.drafters.head_formats import read_config
    from specgen.core.profile import load_profile

    folder = family_pairs().build_family(name, tmp_path, scale="tiny", head=True)
    kind, config = read_config(folder / "head")
    target = json.loads((folder / "target" / "config.json").read_text())
    assert kind == "speculators" and config.hidden_size == target["hidden_size"]
    assert config.draft_vocab_size == target["vocab_size"] // 2
    assert load_profile(str(folder / "pair.toml")).proposer.head == str(folder / "head")
    eagle = ProposerSpec(kind="eagle", head=str(folder / "head"))
    engine = Engine(make_profile(folder / "target", None, k=4, proposer=eagle))
    prompts = random_prompts(engine.pair.vocab_size, 3)
    for prompt in prompts:
        result = finish(engine.decoder(engine.profile), prompt)
        assert result.token_ids == finish(engine.decoder(target_only(engine.profile)), prompt).token_ids
        assert result.stats.drafted > 0


def _script(each) -> list[torch.Tensor]:
    """A 30-token prompt (past the 24-token windows), then 5-, 1- and 5-token steps with rollbacks."""
    gen = torch.Generator().manual_seed(0)
    each.reset()
    out = [each.forward(torch.randint(0, 380, (30,), generator=gen).to(DEVICE)).clone()]
    for n in (5, 1, 5):
        out.append(each.forward(torch.randint(0, 380, (n,), generator=gen).to(DEVICE)).clone())
        each.truncate(each.length - 2)  # a rejection: the next step overwrites stale K/V
    return out


@pytest.mark.slow
@pytest.mark.parametrize("role", ["target"])  # drafts take the same paths; the interpreter is slow
def test_the_kernels_compute_the_plain_models_logits(family, role):
    """Attention (with the rotary path where the family has one) and linear kernels, explicitly on
    as a GPU resolves them, against the plain model (loaded apart: its own attention, SDPA or
    Gemma 2's eager): Llama 3.1's scaled rotary tables, Qwen2's fused q/k/v biases, Qwen3's q/k
    norms, tied heads, Gemma 2's GELU-tanh MLP and soft-capped attention with query_pre_attn_scalar's
    scale on its alternating windowed and global layers."""
    name, folder = family

    def load():
        model = _load(folder / role)
        if name == "gemma-2":  # a query_pre_attn_scalar that is not head_dim (as in Gemma 2 27B): the
            return _variant(model, query_pre_attn_scalar=4 * model.config.head_dim)  # kernel takes `scaling`
        return model

    model = load()
    assert attention_unsupported(model.config) is None
    chosen = resolved(model, attention="kernel", linear="kernel")
    assert chosen.attention and chosen.linear and chosen.rope
    if name == "gemma-2":  # what the kernel must take from the call: that scale, the cap, each layer's window
        attention = model.model.layers[0].self_attn
        assert attention.scaling != attention.head_dim ** -0.5 and attention.attn_logit_softcapping
        assert {layer.self_attn.sliding_window for layer in model.model.layers} == {None, family_pairs().TINY_WINDOW}
    width = model.get_output_embeddings().weight.shape[0]
    fast = runner(model, kernels=chosen, width=width)
    plain = runner(load(), kernels=kernels(), width=width)
    for step, (got, want) in enumerate(zip(_script(fast), _script(plain))):
        diff = (got - want).abs().max().item()
        assert diff < RUNNER_TOLERANCE, f"{name} {role} feed {step}: max logit diff {diff:.3g}"
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_auto_on_a_gpu_takes_what_each_family_allows(family):
    """`auto` on a CUDA device (decided from the model alone; split-K's and dependent launch's device
    facts aside, tests/gpu/test_kernels.py): every
    kernel, Gemma 2's soft-capped attention and its rotary path included; Gemma's 1 + w norms take
    the norm kernel's offset form."""
    name, folder = family
    model = _load(folder / "target")
    got = resolve(KernelSpec(disable=("split_k", "dependent_launch")), torch.device("cuda"), model)
    assert got == ResolvedKernels(attention=True, linear=True, rope=True, split_k=False, warp=True,
                                  norm=True, head=True, step_io=True)
    assert resolve(KernelSpec(attention="kernel", disable=("split_k", "dependent_launch")), torch.device("cuda"),
                   model) == got


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the greedy test's cuda cases run the kernels")
def test_gemma2_greedy_speculative_with_the_attention_kernel_equals_target_only(tmp_path):
    """Gemma 2 with the attention kernel (soft-capped, windowed and global layers) in the real round
    on both models, k = 4, with a noisy copy of the target as draft (some drafts accepted): the
    tokens of the plain target's greedy decoding. On the CPU, in the Triton interpreter (the torch
    backend runs no kernel; test_greedy_speculative_equals_target_only's cuda case does on a GPU)."""
    folder = build_family(tmp_path, "gemma-2")
    profile = make_profile(folder / "target", folder / "copy", k=4, max_tokens=12)
    engine = Engine(profile)
    prompts = [list(range(10, 40)), random_prompts(engine.pair.vocab_size, 1, seed=3)[0]]
    reference = [finish(engine.decoder(target_only(profile)), p).token_ids for p in prompts]
    kernel_engine = Engine(profile, backend=KernelRunners(kernels(attention=True)))
    decoder = kernel_engine.decoder()
    assert decoder.round.target.kernels.attention and decoder.round.draft.kernels.attention
    assert decoder.round.target.ops.kernels.attention  # specgen's own step on the kernel table
    accepted = 0
    for prompt, expected in zip(prompts, reference):
        result = finish(decoder, prompt)
        assert result.token_ids == expected, f"prompt={prompt}"
        accepted += result.stats.accepted
    assert accepted > 0, "the noisy copy never agreed: acceptance paths untested"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gemma2_generates_with_the_attention_kernel(tmp_path, cli):
    """An explicit attention = "kernel" (once a usage error: the kernel did not soft-cap) runs with
    captured steps and prints the greedy tokens of a run with Gemma 2's own attention (float32:
    the two differ by rounding far below the tiny model's top-two gaps)."""
    import warnings

    folder = build_family(tmp_path, "gemma-2")
    outputs = []
    for attention in ("kernel", "sdpa"):
        profile = write_profile(tmp_path / f"{attention}.toml", folder / "target", folder / "draft", device="cuda",
                                dtype="float32", kernels={"attention": attention})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code, out, err = cli("generate", "-p", profile, "w1 w2 w3", "--max-tokens", "8", "-t", "0")
        assert code == 0 and out.strip(), err
        # both capture their steps (transformers 5.17's eager masks could not be captured)
        assert not [str(w.message) for w in caught if "could not capture" in str(w.message)], attention
        outputs.append(out)
    assert outputs[0] == outputs[1]


def test_soft_capped_attention_is_loaded_with_the_cap():
    """core/models/loading.py's capped_attention: a Gemma 2 that transformers gave SDPA (5.17's default),
    which drops attn_logit_softcapping there (later versions refuse the call), gets specgen's
    soft-capped attention over SDPA's masks (eager's float masks cannot be captured in 5.17), and
    bit for bit the logits of transformers' eager attention; other models keep theirs."""
    import transformers

    from specgen.core.models.loading import SOFTCAPPED, capped_attention

    def tiny(family, attention, **extra):
        config = getattr(transformers, f"{family}Config")(
            vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, initializer_range=0.5, bos_token_id=None, eos_token_id=None,
            pad_token_id=None, **extra)
        torch.manual_seed(3)
        model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
        model.config._attn_implementation = attention  # what the layers read per call (newer versions refuse
        return model  # SDPA for Gemma 2 at construction)

    capped = dict(attn_logit_softcapping=5.0, final_logit_softcapping=None)
    ids = list(range(3, 20))
    eager, sdpa = tiny("Gemma2", "eager", **capped), tiny("Gemma2", "sdpa", **capped)
    try:
        dropped = _logits(sdpa, ids)  # transformers 5.17: SDPA without the cap
    except ValueError:  # later versions refuse SDPA's call with a cap
        dropped = None
    assert dropped is None or not torch.allclose(dropped, _logits(eager, ids), atol=1e-3)
    want = _logits(eager, ids)  # transformers' eager attention
    capped_attention(sdpa)
    assert sdpa.config._attn_implementation == SOFTCAPPED
    assert torch.equal(_logits(sdpa, ids), want)
    capped_attention(eager)  # a model transformers gave eager attention takes it too
    assert eager.config._attn_implementation == SOFTCAPPED
    assert torch.equal(_logits(eager, ids), want)
    llama = tiny("Llama", "sdpa")
    capped_attention(llama)
    assert llama.config._attn_implementation == "sdpa"
