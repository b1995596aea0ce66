"""Tiny random-weight checkpoints built from transformers configs, saved like real ones.

Tests load them through specgen's own loader, so the path from a folder on disk to tokens is the
real one. A large initializer range makes the logits peaky, so greedy argmaxes are far from ties
and float32 rounding between a 1-token and a (k+1)-token forward cannot flip them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import os\nprint(os.path.join('a', 'b'))\n",
    "héllo wörld — naïve café ✓ 你好\n",
]
EOS = "<|endoftext|>"


def build_tokenizer(folder: Path, vocab_size: int = 320, corpus: list[str] = CORPUS):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)
    fast.save_pretrained(folder)
    return fast


def build_model(folder: Path, family: str, layers: int, hidden: int, vocab: int, seed: int,
                eos_id: int, init: float = 0.5, vocab_rows: int | None = None, context: int = 512):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    config = config_cls(
        vocab_size=vocab_rows or vocab, hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=context, initializer_range=init, eos_token_id=eos_id,
        bos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def build_pair(root: Path, family: str = "llama", same: bool = False, draft_rows: int | None = None,
               noisy: float = 0.0, context: int = 512):
    """A target and a draft sharing one tokenizer.

    same=True makes the draft a copy of the target; noisy=s a copy whose weights carry Gaussian
    noise of std s, so it agrees with the target only part of the time (like a real draft);
    otherwise the draft is an unrelated smaller model. context: both models' positions.
    """
    root = Path(root)
    tok = build_tokenizer(root / "target")
    vocab = len(tok)
    eos_id = tok.eos_token_id
    build_model(root / "target", family, layers=2, hidden=64, vocab=vocab, seed=1, eos_id=eos_id, context=context)
    tok.save_pretrained(root / "draft")
    if same or noisy:
        draft = build_model(root / "draft", family, layers=2, hidden=64, vocab=vocab, seed=1, eos_id=eos_id,
                            context=context)
        if noisy:
            with torch.no_grad():  # noise on the output head only: perturbed logits, same hidden states
                head = draft.get_output_embeddings().weight
                head.add_(torch.randn_like(head) * noisy)
            draft.save_pretrained(root / "draft", safe_serialization=True)
    else:
        build_model(root / "draft", family, layers=1, hidden=32, vocab=vocab, seed=2, eos_id=eos_id,
                    vocab_rows=draft_rows, context=context)
    return root / "target", root / "draft"


def bigram_target(target: Path, folder: Path) -> Path:
    """A copy of `target` with its attention outputs zeroed: each next token is a function of the
    current one (a bigram model), so its greedy text follows chains t, f(t), f(f(t)), ... which
    prompt lookup finds in a prompt that holds them (a random model's text rarely repeats)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(target, folder)
    tensors = load_file(folder / "model.safetensors")
    for name in tensors:
        if name.endswith("self_attn.o_proj.weight"):
            tensors[name] = torch.zeros_like(tensors[name])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def write_profile(path: Path, target: Path, draft: Path | None, device: str = "cpu", dtype: str | None = None,
                  **tables) -> Path:
    """A profile for the pair. device "cpu" by default: the CLI tests that use it check the CPU path
    (stderr lines, eager runners) on any machine, as CI runs them; GPU behaviour has its own tests.
    dtype: both models' (default: the profile's auto, float32 on CPU and bfloat16 on CUDA)."""
    # One torch thread, as conftest.py sets: [runtime] threads auto would take half of a CI
    # machine's cores for the rest of the session, and 64-wide matrices only wait on more threads.
    tables.setdefault("runtime", {"threads": 1})
    model = f'device = "{device}"\n' + (f'dtype = "{dtype}"\n' if dtype else "")
    lines = [f'[target]\npath = "{target}"\n{model}']
    if draft is not None:
        lines.append(f'[draft]\npath = "{draft}"\n{model}')
    for table, values in tables.items():
        lines.append(f"[{table}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml(value)}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def tiny_head_config(**changes):
    """A tiny EAGLE-3 head: width 32, 4 heads over 2 KV heads, reading a 48-wide target with a
    40-token vocabulary, 24 of them in the draft vocabulary."""
    from specgen.core.drafters.eagle import Eagle3Config

    fields = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, target_vocab_size=40,
                  draft_vocab_size=24, target_hidden_size=48, aux_layer_ids=(1, 2, 3),
                  max_position_embeddings=64)
    return Eagle3Config(**{**fields, **changes})


def build_head(config=None, seed: int = 0, owns_embedding: bool = False):
    """A random-weight head (norm weights and d2t/t2d random too, so nothing hides behind 1s
    and an identity map). The draft vocabulary is a seeded random subset of the target's."""
    from specgen.core.drafters.eagle import Eagle3Head

    config = config or tiny_head_config()
    generator = torch.Generator().manual_seed(seed)
    embedding = torch.randn(config.target_vocab_size, config.hidden_size, generator=generator)
    head = Eagle3Head(config, embedding, owns_embedding=owns_embedding)
    with torch.no_grad():
        for name, param in head.named_parameters():
            scale = 0.3 if name.endswith("norm.weight") else 0.5 / param.shape[-1] ** 0.5
            param.copy_((1.0 if name.endswith("norm.weight") else 0.0)
                        + scale * torch.randn(param.shape, generator=generator))
        kept = torch.randperm(config.target_vocab_size, generator=generator)[:config.draft_vocab_size].sort().values
        head.d2t.copy_(kept - torch.arange(config.draft_vocab_size))
        head.t2d.zero_()
        head.t2d[kept] = True
    return head


AUX = (0, 1, 1)  # the aux layers of head_for's heads: the tiny target has 2 layers


def head_for(target: Path, folder: Path, draft_vocab: int | None = None, seed: int = 3,
             aux: tuple[int, ...] = AUX) -> Path:
    """A random EAGLE-3 head for a tiny target (build_pair's: 2 layers, so aux (0, 1, 1)), saved
    in the speculators format. draft_vocab: a reduced vocabulary of that many target ids (a seeded
    random subset), else the whole one."""
    from specgen.core.drafters.head_formats import save_speculators

    config = json.loads((target / "config.json").read_text())
    vocab = config["vocab_size"]
    head = build_head(tiny_head_config(hidden_size=config["hidden_size"], target_hidden_size=config["hidden_size"],
                                       target_vocab_size=vocab, draft_vocab_size=draft_vocab or vocab,
                                       aux_layer_ids=aux, max_position_embeddings=512), seed=seed)
    if draft_vocab is None:
        head.identity_vocab()
    save_speculators(head, folder, "tiny-target")
    return folder


def write_eagle3_original(head, folder: Path, with_embedding: bool = False) -> Path:
    """The head as the EAGLE-3 repository (and SpecForge) write one: a flat Llama config with
    `LlamaForCausalLMEagle3`, layer ids one lower than vLLM's under `eagle_config`, weights
    `midlayer.*`."""
    import json

    from safetensors.torch import save_file

    c = head.config
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
        "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.target_vocab_size,
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "tie_word_embeddings": False, "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in c.aux_layer_ids],
                         "use_aux_hidden_state": True},
    }
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {name.replace("layers.0.", "midlayer."): t.contiguous() for name, t in head.state_dict().items()}
    if with_embedding:
        tensors["embed_tokens.weight"] = head.embedding.contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


# --- MTP checkpoints (issue 21): tiny models whose safetensors files also hold MTP layers ---

MTP_FAMILIES = ("deepseek_v3", "glm4_moe")


def mtp_config(family: str, layers: int = 2, vocab: int = 96, init: float = 0.3):
    """A tiny config of a family that ships MTP layers, with one MTP layer declared."""
    import transformers

    moe = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
               num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, n_shared_experts=1,
               n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
               max_position_embeddings=128, initializer_range=init, num_nextn_predict_layers=1,
               bos_token_id=None, eos_token_id=0, pad_token_id=None, tie_word_embeddings=False)
    if family == "deepseek_v3":
        # MLA expands its latent to every head: as in the real config, KV heads = heads
        moe["num_key_value_heads"] = moe["num_attention_heads"]
        return transformers.DeepseekV3Config(**moe, kv_lora_rank=8, q_lora_rank=12, qk_rope_head_dim=4,
                                             v_head_dim=8, qk_nope_head_dim=8)
    if family == "glm4_moe":
        return transformers.Glm4MoeConfig(**moe, head_dim=8)
    raise ValueError(family)


def _checkpoint_tensors(model, scratch: Path) -> dict:
    """A model's tensors under the names and layout its checkpoint stores them in."""
    from safetensors.torch import load_file

    model.save_pretrained(scratch)
    return load_file(scratch / "model.safetensors")


def build_mtp_checkpoint(folder: Path, family: str = "deepseek_v3", sharded: bool = False,
                         own_head: bool = True, own_embed: bool = True, seed: int = 0, vocab: int = 96):
    """A tiny checkpoint saved by transformers, plus one MTP layer under the layer-N names.

    The MTP layer's decoder weights come from layer N of a same-family model with N+1 layers,
    saved by transformers (so in checkpoint layout: one tensor per expert). Returns (config,
    main model, {name: tensor} of every MTP tensor added to the files).
    """
    import json
    import shutil

    import transformers
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    config = mtp_config(family, vocab=vocab)
    n = config.num_hidden_layers
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder, max_shard_size="40KB" if sharded else "1GB")
    torch.manual_seed(seed + 1)
    deeper = transformers.AutoModelForCausalLM.from_config(mtp_config(family, layers=n + 1, vocab=vocab))
    prefix = f"model.layers.{n}."
    mtp = {k: v for k, v in _checkpoint_tensors(deeper, folder / "scratch").items() if k.startswith(prefix)}
    shutil.rmtree(folder / "scratch")
    hidden, vocab = config.hidden_size, config.vocab_size
    bias = f"{prefix}mlp.gate.e_score_correction_bias"  # zeros at init: give it values bfloat16 rounds
    if bias in mtp:
        mtp[bias] = 1 / 3 + 0.1 * torch.randn(mtp[bias].shape)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        mtp[f"{prefix}{norm}.weight"] = 1 + 0.3 * torch.randn(hidden)
    mtp[f"{prefix}eh_proj.weight"] = 0.3 * torch.randn(hidden, 2 * hidden)
    if own_head:
        mtp[f"{prefix}shared_head.head.weight"] = 0.3 * torch.randn(vocab, hidden)
    if own_embed:
        mtp[f"{prefix}embed_tokens.weight"] = 0.3 * torch.randn(vocab, hidden)
    if sharded:
        save_file(mtp, folder / "model-mtp.safetensors", metadata={"format": "pt"})
        index_path = folder / "model.safetensors.index.json"
        index = json.loads(index_path.read_text())
        index["weight_map"].update({name: "model-mtp.safetensors" for name in mtp})
        index_path.write_text(json.dumps(index))
    else:
        path = folder / "model.safetensors"
        save_file({**load_file(path), **mtp}, path, metadata={"format": "pt"})
    return config, model, mtp


def build_mtp_target(folder: Path, family: str = "deepseek_v3"):
    """An MTP checkpoint the engine loads as a target (proposer mtp): build_mtp_checkpoint's, its
    vocabulary a tokenizer's, saved beside it. Returns the config."""
    tok = build_tokenizer(folder)
    config, _, _ = build_mtp_checkpoint(folder, family, vocab=len(tok))
    return config


# --- Real families (issue 22): benchmarks/family_pairs.py's checkpoints at tiny size ---

FAMILY_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "family_pairs.py"


def family_pairs():
    """benchmarks/family_pairs.py as a module: the tests build their checkpoints with its code."""
    from repo_paths import script

    return script(FAMILY_SCRIPT)


def build_family(root: Path, name: str, noisy: float = 0.1) -> Path:
    """The family's tiny target and draft in root/name (target/, draft/), plus copy/: the target
    with Gaussian noise of std `noisy` on its output rows, a draft that agrees with it part of the
    time (the family's own draft, random too, almost never does)."""
    from safetensors.torch import load_file, save_file

    folder = family_pairs().build_family(name, Path(root), scale="tiny")
    copy = folder / "copy"
    shutil.copytree(folder / "target", copy)
    tensors = load_file(copy / "model.safetensors")
    head = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"  # tied: the embedding
    generator = torch.Generator().manual_seed(7)
    tensors[head] = tensors[head] + noisy * torch.randn(tensors[head].shape, generator=generator)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    return folder
