"""Random-weight target/draft pairs of real model families, built from their public configs.

No model hub is reachable where specgen is built and benchmarked, so the real pairs of
profiles/ are exercised through checkpoints of the same architecture with random weights: the
config.json values of each model (written below as data, with the file they come from), a
character-level tokenizer with the real tokenizer's size and its special tokens at their real
ids, the model card's generation_config, a specgen profile (`pair.toml`) pointing at the two folders, and
a prompts.jsonl that `specgen bench` reads by default. Acceptance is meaningless with random
weights: these checkpoints measure costs (GPU benchmarks, `--scale full`) and cover each family's
code paths (tests/core/models/test_families.py, `--scale tiny`: the same architecture features, fewer and
narrower layers, a small vocabulary).

    python benchmarks/family_pairs.py --family qwen3 --scale full --out /tmp/families --device cuda
    specgen bench -p /tmp/families/qwen3/pair.toml --k 4 -t 0 --num-prompts 2 -n 32

With --head, the folder also gets a random-weight EAGLE-3 head for the target (`head/`, speculators
format, named in pair.toml's [proposer]) of the published heads' shape: one decoder layer as wide
as the target's, a 32,000-token draft vocabulary (EAGLE-3's heads for Llama 3.1 8B and Qwen3 8B),
so `--proposer eagle` measures what a head's round costs at that scale.

Seeded (target: --seed, draft: --seed + 1) and offline. Source of every number in FAMILIES:
config.json and generation_config.json of each model's hub repository,
https://huggingface.co/<hub id>/blob/main/config.json (and the same for generation_config.json);
the tokenizer sizes and special-token ids are those of each repository's tokenizer.json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

@dataclass(frozen=True)
class Model:
    hub_id: str
    config: dict  # the config.json fields that decide the architecture, as published


@dataclass(frozen=True)
class Family:
    target: Model
    draft: Model
    tokens: int  # len(tokenizer) of the real tokenizer; both models have at least this many rows
    specials: dict  # id -> special token of the real tokenizer that configs or profiles name
    generation: dict  # generation_config.json of the target (the draft's has the same ids)
    unk: int  # the id unknown words map to (a special token of the family)
    profile: str  # the file in profiles/ for the real pair


LLAMA_SPECIALS = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128002: "<|reserved_special_token_0|>",
                  128006: "<|start_header_id|>",
                  128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>"}
QWEN_SPECIALS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}
GEMMA_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 106: "<start_of_turn>", 107: "<end_of_turn>"}
LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu", attention_bias=False,
             mlp_bias=False, num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0,
             max_position_embeddings=131072, vocab_size=128256, bos_token_id=128000,
             eos_token_id=[128001, 128008, 128009])
QWEN2 = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6,
             rope_theta=1000000.0, max_position_embeddings=32768, use_sliding_window=False,
             bos_token_id=151643, eos_token_id=151645)
QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu", attention_bias=False,
             head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000, max_position_embeddings=40960,
             use_sliding_window=False, sliding_window=None, vocab_size=151936, bos_token_id=151643,
             eos_token_id=151645)
GEMMA2 = dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], hidden_act="gelu_pytorch_tanh",
              hidden_activation="gelu_pytorch_tanh", attention_bias=False, head_dim=256, query_pre_attn_scalar=256,
              attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096, rms_norm_eps=1e-6,
              rope_theta=10000.0, max_position_embeddings=8192, vocab_size=256000, tie_word_embeddings=True,
              bos_token_id=2, eos_token_id=1, pad_token_id=0, cache_implementation="hybrid")

FAMILIES = {
    "llama-3.1": Family(  # Llama 3.1 8B: llama3 rope scaling, untied; the 3.2 1B draft is tied
        target=Model("meta-llama/Llama-3.1-8B-Instruct", {
            **LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "tie_word_embeddings": False, "rope_scaling": {**LLAMA3_ROPE, "factor": 8.0}}),
        draft=Model("meta-llama/Llama-3.2-1B-Instruct", {
            **LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "head_dim": 64, "tie_word_embeddings": True,
            "rope_scaling": {**LLAMA3_ROPE, "factor": 32.0}}),
        tokens=128256, specials=LLAMA_SPECIALS, unk=128002, profile="llama-3.1-8b-instruct.toml",
        generation={"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "do_sample": True,
                    "temperature": 0.6, "top_p": 0.9}),
    "qwen2.5": Family(  # q/k/v biases; the 7B's embedding has more padding rows than the 0.5B's
        target=Model("Qwen/Qwen2.5-7B-Instruct", {
            **QWEN2, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "max_window_layers": 28, "sliding_window": 131072,
            "vocab_size": 152064, "tie_word_embeddings": False}),
        draft=Model("Qwen/Qwen2.5-0.5B-Instruct", {
            **QWEN2, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "max_window_layers": 21, "sliding_window": 32768,
            "vocab_size": 151936, "tie_word_embeddings": True}),
        tokens=151665, specials=QWEN_SPECIALS, unk=151643, profile="qwen2.5-7b-instruct.toml",
        generation={"bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645, 151643],
                    "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20}),
    "qwen3": Family(  # per-head q/k RMSNorm, head_dim 128 whatever the width
        target=Model("Qwen/Qwen3-8B", {
            **QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "max_window_layers": 36,
            "tie_word_embeddings": False}),
        draft=Model("Qwen/Qwen3-0.6B", {
            **QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "max_window_layers": 28,
            "tie_word_embeddings": True}),
        tokens=151669, specials=QWEN_SPECIALS, unk=151643, profile="qwen3-8b.toml",
        generation={"bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645, 151643],
                    "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}),
    "gemma-2": Family(  # (1 + w) norms, scaled embeddings, soft-capping, alternating sliding windows, tied
        target=Model("google/gemma-2-9b-it", {
            **GEMMA2, "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
            "num_attention_heads": 16, "num_key_value_heads": 8}),
        draft=Model("google/gemma-2-2b-it", {
            **GEMMA2, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
            "num_attention_heads": 8, "num_key_value_heads": 4}),
        tokens=256000, specials=GEMMA_SPECIALS, unk=3, profile="gemma-2-9b-it.toml",
        generation={"bos_token_id": 2, "pad_token_id": 0, "eos_token_id": [1, 107],
                    "cache_implementation": "hybrid"}),
}

# --scale tiny: every config key above kept, the sizes replaced (CPU tests, seconds).
TINY_TOKENS = 384
TINY = {"target": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16),
        "draft": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8)}
TINY_POSITIONS = 1024
TINY_WINDOW = 24  # sliding windows shorter than the tests' sequences
TINY_ROPE_ORIGINAL = 64  # llama3 rope scaling then reshapes frequencies that short sequences reach
TINY_INIT = 0.5  # peaky logits: greedy argmaxes far from ties (tests/tiny_models.py)
HEAD_VOCAB = 32000  # the draft vocabulary of the published EAGLE-3 heads for these targets


def token_id(family: Family, full_id: int, scale: str) -> int:
    """A real id at this scale: ids at the end of the real vocabulary keep their distance to its end."""
    if scale == "full" or full_id < TINY_TOKENS // 2:
        return full_id
    return TINY_TOKENS - (family.tokens - full_id)


def ids(family: Family, value, scale: str):
    if isinstance(value, list):
        return [token_id(family, v, scale) for v in value]
    return value if value is None else token_id(family, value, scale)


def model_config(family: Family, role: str, scale: str, layers: int = 0) -> dict:
    """config.json of the target or the draft at `scale` (layers: that many decoder layers instead)."""
    config = dict(getattr(family, role).config)
    if layers:
        config["num_hidden_layers"] = layers
    if scale == "full":
        return config
    config.update(TINY[role], max_position_embeddings=TINY_POSITIONS, initializer_range=TINY_INIT)
    padding = config["vocab_size"] - family.tokens  # rows no token reaches, scaled down
    config["vocab_size"] = TINY_TOKENS + padding // 4
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in config:
            config[key] = ids(family, config[key], scale)
    if "query_pre_attn_scalar" in config:  # = head_dim in both Gemma 2 configs
        config["query_pre_attn_scalar"] = config["head_dim"]
    if config.get("sliding_window"):
        config["sliding_window"] = TINY_WINDOW
    if config.get("rope_scaling"):
        config["rope_scaling"] = {**config["rope_scaling"], "original_max_position_embeddings": TINY_ROPE_ORIGINAL}
    return config


def build_model(folder: Path, config: dict, generation: dict, seed: int, device: str, dtype: torch.dtype):
    """A random-weight checkpoint: transformers' own initialisation of the family's modules, then
    RMSNorm weights and biases moved off their constant init, so that Gemma's (1 + w), Qwen3's
    q/k norms and Qwen2's biases change the output (a path that ignored them would show)."""
    import transformers

    config = dict(config)
    model_type = config.pop("model_type")
    config.pop("architectures")
    config_obj = transformers.AutoConfig.for_model(model_type, **config)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config_obj, dtype=dtype).eval()
    spread = config_obj.initializer_range
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:  # norm weights (1 or 0 at init) and biases (0 at init)
                param.add_(torch.randn_like(param) * (0.3 if name.endswith("norm.weight") else spread))
    model.generation_config = transformers.GenerationConfig(**generation)
    model.save_pretrained(folder)
    return model


def build_tokenizer(folder: Path, family: Family, scale: str):
    """A character-level tokenizer of the family's size: the family's special tokens at their ids,
    the 256 byte-level symbols at the first free ids (text encodes to one token a byte), and
    `w<id>` fillers elsewhere, which no text encodes to but the models can emit.

    A byte-level BPE without merges, not a word-level model: transformers 5 loads a Qwen2
    checkpoint's tokenizer as its Qwen2Tokenizer, which rebuilds a byte-level BPE from the
    vocabulary and the merges, so words of a WordLevel vocabulary encoded to nothing there. Here
    every loader encodes the same bytes to the same ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    size = family.tokens if scale == "full" else TINY_TOKENS
    specials = {token_id(family, i, scale): text for i, text in family.specials.items()}
    free = (i for i in range(size) if i not in specials)
    symbols = dict(zip(free, sorted(pre_tokenizers.ByteLevel.alphabet())))
    vocab = {specials.get(i) or symbols.get(i) or f"w{i}": i for i in range(size)}
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials.values()))
    named = {"eos_token": _first(family.generation["eos_token_id"]), "bos_token": family.generation.get("bos_token_id"),
             "pad_token": family.generation.get("pad_token_id"), "unk_token": family.unk}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **{key: specials[token_id(family, i, scale)]
                                                            for key, i in named.items() if i is not None})
    fast.save_pretrained(folder)
    return fast


def _first(value):
    return value[0] if isinstance(value, list) else value


def write_prompts(path: Path, count: int, length: int, seed: int) -> None:
    """Prompts of `length` characters (lower-case words and spaces: `length` tokens), one JSON
    object a line."""
    rng = random.Random(seed)
    with path.open("w") as file:
        for _ in range(count):
            words = []
            while sum(len(w) + 1 for w in words) <= length:
                words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))))
            file.write(json.dumps({"prompt": " ".join(words)[:length]}) + "\n")


PROFILE = """\
# {name} ({scale} scale) with random weights: made by benchmarks/family_pairs.py for speed and
# code-path checks; acceptance means nothing here. profiles/{profile} is the profile of the real pair.
name = "{name}-{scale}-random"
description = "{target} and {draft} shapes, random weights"

[target]
path = "./target"

[draft]
path = "./draft"

{proposer}[speculation]
k = 4

[sampling]
temperature = 0.0
max_tokens = 128
"""


def head_config(family: Family):
    """The Eagle3Config of the head build_head() makes for the family's full-scale target."""
    import transformers

    from specgen.core.drafters.eagle import Eagle3Config
    from specgen.core.train.train_head import target_shape
    from specgen.core.train.train_plan import default_layers

    values = dict(family.target.config)
    target = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    return Eagle3Config(**target_shape(target), target_vocab_size=target.vocab_size, draft_vocab_size=HEAD_VOCAB,
                        target_hidden_size=target.hidden_size,
                        aux_layer_ids=default_layers(target.num_hidden_layers))


def build_head(folder: Path, target, hub_id: str, seed: int, dtype: torch.dtype) -> Path:
    """A random-weight EAGLE-3 head for `target` in the speculators format: core/train/train_head.py's
    new head (the target's width, its embedding shared) over a seeded random draft vocabulary."""
    from specgen.core.drafters.head_formats import save_speculators
    from specgen.core.train.train_head import build_head as new_head
    from specgen.core.train.train_plan import default_layers

    vocab, layers = target.config.vocab_size, target.config.num_hidden_layers
    generator = torch.Generator().manual_seed(seed)
    kept = torch.randperm(vocab, generator=generator)[:min(HEAD_VOCAB, vocab // 2)].sort().values
    head = new_head(target, default_layers(layers), kept, init_from_target=False, seed=seed,
                    device=target.device)
    save_speculators(head.to(dtype), folder, hub_id, target.config.architectures or ())
    return folder


def build_family(name: str, out: Path, scale: str = "tiny", seed: int = 0, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, prompts: int = 8, head: bool = False,
                 target_layers: int = 0) -> Path:
    """Both checkpoints, tokenizer, prompts.jsonl and pair.toml in out/name (with `head`, an
    EAGLE-3 head in out/name/head too); returns that folder. target_layers: a target that deep
    instead of the family's (a larger model of the same widths: 64 makes Llama 3.1 8B's 15B)."""
    family = FAMILIES[name]
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    for offset, role in enumerate(("target", "draft")):
        generation = {key: ids(family, value, scale) if key.endswith("token_id") else value
                      for key, value in family.generation.items()}
        config = model_config(family, role, scale, target_layers if role == "target" else 0)
        model = build_model(folder / role, config, generation, seed + offset, device, dtype)
        if head and role == "target":
            build_head(folder / "head", model, family.target.hub_id, seed + 2, dtype)
        del model
        if device != "cpu":
            torch.cuda.empty_cache()
        build_tokenizer(folder / role, family, scale)
    write_prompts(folder / "prompts.jsonl", prompts, 128 if scale == "full" else 24, seed)
    proposer = '[proposer]\nhead = "./head"  # used by --proposer eagle\n\n' if head else ""
    (folder / "pair.toml").write_text(PROFILE.format(name=name, scale=scale, profile=family.profile, proposer=proposer,
                                                     target=family.target.hub_id, draft=family.draft.hub_id))
    return folder


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=[*FAMILIES, "all"], default="all")
    parser.add_argument("--scale", choices=["tiny", "full"], default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where weights are initialised (cuda: fast at full scale)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="weights as saved (default: bfloat16 at full scale, float32 tiny)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts in prompts.jsonl")
    parser.add_argument("--head", action="store_true", help="also a random EAGLE-3 head for the target (head/)")
    parser.add_argument("--target-layers", type=int, default=0,
                        help="decoder layers of the target (default: the family's); 64 doubles Llama 3.1 8B")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from transformers.utils import logging

    logging.disable_progress_bar()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.scale == "full" else "float32"))
    names = list(FAMILIES) if args.family == "all" else [args.family]
    for name in names:
        folder = build_family(name, args.out, args.scale, args.seed, args.device, dtype, args.prompts, args.head,
                              args.target_layers)
        print(f"{name}: {folder / 'pair.toml'}", file=sys.stderr)


if __name__ == "__main__":
    main()
