"""specgen's own Llama forward, for CPU runs of the Llama checkpoints it covers.

Loading a model through transformers imports its whole modeling stack (torch._dynamo,
torch.distributed.tensor, sympy, scipy and more): seconds on a small CPU, for a demo pair that
generates in a fraction of one. This module is the same computation in plain torch, following
transformers' LlamaForCausalLM (RMSNorm and rotary tables in float32, SDPA attention, the same
parameter names), called the way the runners call a transformers model, over its own KVCache
(or a transformers DynamicCache). tests/test_llama.py holds its logits to transformers' own.
`shape_of` returns None for any config that asks for more (rope scaling, quantization, remote
code, another architecture): such checkpoints load through transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

MODEL_TYPE = "llama"


@dataclass(frozen=True)
class LlamaShape:
    """The config.json fields the forward depends on."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int | None
    attention_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool


REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def shape_of(config: dict) -> LlamaShape | None:
    """The shape of a plain Llama config (config.json as a dict), or None where this module does
    not implement what it asks for."""
    if config.get("model_type") != MODEL_TYPE or config.get("architectures", ["LlamaForCausalLM"]) != [
            "LlamaForCausalLM"]:
        return None
    if config.get("hidden_act", "silu") != "silu" or config.get("pretraining_tp", 1) != 1:
        return None
    if config.get("quantization_config") or config.get("auto_map") or not all(k in config for k in REQUIRED):
        return None
    rope = config.get("rope_parameters") or {}  # transformers 5; 4 wrote rope_theta and rope_scaling
    for table in (rope, config.get("rope_scaling") or {}):
        kind = table.get("rope_type", table.get("type", "default"))
        if kind != "default" or table.get("partial_rotary_factor", 1) != 1:
            return None
    heads = config["num_attention_heads"]
    return LlamaShape(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"], num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=heads, num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
        max_position_embeddings=config.get("max_position_embeddings"),
        attention_bias=bool(config.get("attention_bias", False)), mlp_bias=bool(config.get("mlp_bias", False)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


class Linear(nn.Linear):
    """Weights come from the checkpoint: no random init first (which, on the meta device the model
    is built on, would also import torch._dynamo: the cost this module exists to avoid)."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, n, d]; cos, sin: [B, 1, n, d]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape, index: int):
        super().__init__()
        self.index, self.head_dim = index, shape.head_dim
        q_width, kv_width = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
        self.q_proj = Linear(shape.hidden_size, q_width, bias=shape.attention_bias)
        self.k_proj = Linear(shape.hidden_size, kv_width, bias=shape.attention_bias)
        self.v_proj = Linear(shape.hidden_size, kv_width, bias=shape.attention_bias)
        self.o_proj = Linear(q_width, shape.hidden_size, bias=shape.attention_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache) -> torch.Tensor:
        b, n, _ = x.shape
        q = rotate(self.q_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2), cos, sin)  # [B, h, n, d]
        k = rotate(self.k_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2), cos, sin)  # [B, kv, n, d]
        v = self.v_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.index)  # [B, kv, L, d]: the cached positions, then these n
        out = F.scaled_dot_product_attention(q, k, v, **_causal(n, k.shape[2], x.device),
                                             scale=self.head_dim ** -0.5, enable_gqa=k.shape[1] != q.shape[1])
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


def _causal(n: int, length: int, device: torch.device) -> dict:
    """SDPA's mask arguments for n queries at the last n of `length` positions."""
    if n == 1:
        return {}
    if n == length:
        return {"is_causal": True}
    keys, queries = torch.arange(length, device=device), torch.arange(length - n, length, device=device)
    return {"attn_mask": keys[None, :] <= queries[:, None]}  # [n, L]


class MLP(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.gate_proj = Linear(shape.hidden_size, shape.intermediate_size, bias=shape.mlp_bias)
        self.up_proj = Linear(shape.hidden_size, shape.intermediate_size, bias=shape.mlp_bias)
        self.down_proj = Linear(shape.intermediate_size, shape.hidden_size, bias=shape.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, shape: LlamaShape, index: int):
        super().__init__()
        self.self_attn = Attention(shape, index)
        self.mlp = MLP(shape)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    """transformers' LlamaModel: embeddings, layers, final norm (named as in the checkpoints)."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.embed_tokens = Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape, i) for i in range(shape.num_hidden_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


class KVCache:
    """Keys and values of every layer, as transformers' DynamicCache keeps them (the same three
    methods the forward and the runners call), without importing transformers."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []  # per layer [B, kv, L, d]
        self.values: list[torch.Tensor] = []

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer] = torch.cat((self.keys[layer], k), dim=-2)
            self.values[layer] = torch.cat((self.values[layer], v), dim=-2)
        return self.keys[layer], self.values[layer]

    def get_seq_length(self) -> int:
        return self.keys[0].shape[-2] if self.keys else 0

    def crop(self, length: int) -> None:
        """Keep the first `length` positions; a negative length drops that many from the end."""
        keep = length if length >= 0 else self.get_seq_length() + length
        self.keys = [k[..., :keep, :] for k in self.keys]
        self.values = [v[..., :keep, :] for v in self.values]


@dataclass
class Output:
    logits: torch.Tensor  # [B, n, vocab] (n = logits_to_keep where given)


@dataclass(frozen=True)
class GenerationDefaults:
    """What specgen reads of a transformers GenerationConfig."""

    eos_token_id: int | list[int] | None


class LlamaForCausalLM(nn.Module):
    def __init__(self, shape: LlamaShape, generation: GenerationDefaults):
        super().__init__()
        self.config, self.generation_config = shape, generation
        self.model = Body(shape)
        self.lm_head = Linear(shape.hidden_size, shape.vocab_size, bias=False)
        # Not a buffer: Module.to(dtype) would round it; transformers keeps it in float32 too.
        self.inv_freq = rope_frequencies(shape)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def forward(self, input_ids: torch.Tensor, past_key_values=None, position_ids: torch.Tensor | None = None,
                cache_position: torch.Tensor | None = None, use_cache: bool = True,
                logits_to_keep: int = 0) -> Output:
        """input_ids [B, n] -> Output(logits [B, n or logits_to_keep, vocab]). past_key_values: a
        KVCache or a transformers DynamicCache (None: no cache); positions default to those after
        the cache's."""
        x = self.model.embed_tokens(input_ids)  # [B, n, H]
        if position_ids is None:
            start = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)[None]
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)  # [B, n, d/2]
        table = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, n, d]
        cos, sin = table.cos().to(x.dtype), table.sin().to(x.dtype)
        cache = past_key_values if use_cache else None
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache)
        x = self.model.norm(x)
        return Output(self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x))


def rope_frequencies(shape: LlamaShape) -> torch.Tensor:
    """[d/2] float32 on the CPU, as transformers computes them for rope_type "default"."""
    steps = torch.arange(0, shape.head_dim, 2, dtype=torch.float, device="cpu")
    return 1.0 / (shape.rope_theta ** (steps / shape.head_dim))


def load(folder: Path, shape: LlamaShape, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """The checkpoint in `folder` (safetensors: one file, or shards listed by an index) as a model.
    Raises ValueError for a tensor the checkpoint lacks or one this model has no place for."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
        "model.safetensors"]
    state = {}
    for name in files:
        state.update(load_file(folder / name, device=str(device)))
    state = {key: value.to(dtype) for key, value in state.items() if not key.endswith("rotary_emb.inv_freq")}
    if shape.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):  # no memory for weights that the checkpoint's replace at once
        model = LlamaForCausalLM(shape, _generation(folder))
    model.inv_freq = rope_frequencies(shape).to(device)
    expected = set(model.state_dict()) - ({"lm_head.weight"} if shape.tie_word_embeddings else set())
    missing, unknown = expected - set(state), set(state) - expected
    if missing or unknown:
        raise ValueError(f"{len(missing)} tensors missing, e.g. {sorted(missing)[0]}" if missing else
                         f"{len(unknown)} tensors of no Llama layer, e.g. {sorted(unknown)[0]}")
    model.load_state_dict(state, strict=False, assign=True)
    if shape.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def _generation(folder: Path) -> GenerationDefaults:
    """EOS ids where transformers finds them: generation_config.json if there is one, else config.json."""
    path = folder / "generation_config.json"
    path = path if path.is_file() else folder / "config.json"
    return GenerationDefaults(json.loads(path.read_text(encoding="utf-8")).get("eos_token_id"))
