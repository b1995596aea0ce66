"""Which checkpoints specgen's own model step runs, and the config.json fields it depends on.

`of(config)` reads a config.json (as a dict) and returns a StepConfig for the Llama family (Llama
2/3.x, Mistral, Qwen2 with its biases, Qwen3 with its q/k norms) and for Gemma 2; None for anything
it does not implement (another architecture, a rope scaling it lacks, quantized weights, remote
code), which then runs on transformers. Configs written by transformers 4 (rope_theta and
rope_scaling at the top level, no layer_types) and 5 (rope_parameters, layer_types) both parse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM"}
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class StepConfig:
    """The fields a step reads, named as transformers' configs name them (code that reads a target's
    config reads these the same way)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_parameters: dict
    activation: str
    qkv_bias: bool  # biases of q, k and v
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm of each head's q and k before rotary
    windows: tuple  # per layer: the sliding window in positions, or None
    tie_word_embeddings: bool
    max_position_embeddings: int | None = None
    attn_logit_softcapping: float | None = None  # Gemma 2
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)  # the whole config.json

    @property
    def rope_theta(self) -> float:
        return self.rope_parameters["rope_theta"]

    @property
    def sandwich(self) -> bool:
        """Gemma 2's layout: norms after attention and MLP too, (1 + w) weights, scaled embeddings."""
        return self.model_type == "gemma2"

    def get_text_config(self, decoder: bool = True) -> "StepConfig":
        return self


def of(config: dict) -> StepConfig | None:
    return None if unsupported(config) else _parse(config)


def unsupported(config: dict) -> str | None:
    """Why specgen's own step does not run this config (one line, for `generate -v` and the bench
    JSON), or None when it does."""
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        return f"model type {model_type!r} is not one of {', '.join(ARCHITECTURES)}"
    if (config.get("architectures") or [ARCHITECTURES[model_type]]) != [ARCHITECTURES[model_type]]:
        return f"architectures {config.get('architectures')} are not [{ARCHITECTURES[model_type]}]"
    for key, what in (("quantization_config", "quantized weights"), ("auto_map", "code of the checkpoint's own")):
        if config.get(key):
            return f"{what} ({key})"
    if config.get("pretraining_tp", 1) != 1:
        return "pretraining_tp is not 1"
    if not all(isinstance(config.get(key), int) and config[key] > 0 for key in REQUIRED):
        return f"config.json lacks one of {', '.join(REQUIRED)}"
    activation = config.get("hidden_activation") or config.get("hidden_act") or "silu"
    if activation not in ("silu", "gelu_pytorch_tanh", "gelu_tanh"):
        return f"activation {activation!r}"
    if _rope(config) is None:
        table = config.get("rope_parameters") or config.get("rope_scaling") or {}
        return f"rotary embedding {table.get('rope_type', table.get('type'))!r} (specgen's step has " \
               f"{', '.join(ROPE_TYPES)}, on every dimension)"
    if _windows(config, model_type) is None:
        return "sliding windows laid out as specgen's step does not read them (layer_types, sliding_window)"
    return None


def _parse(config: dict) -> StepConfig:
    model_type = config["model_type"]
    activation = config.get("hidden_activation") or config.get("hidden_act") or "silu"
    rope, windows = _rope(config), _windows(config, model_type)
    heads = config["num_attention_heads"]
    gemma = model_type == "gemma2"
    return StepConfig(
        model_type=model_type, vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"], num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=heads, num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), rope_parameters=rope, activation=activation,
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        o_bias=model_type != "qwen2" and bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)), qk_norm=model_type == "qwen3", windows=windows,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", gemma)),
        max_position_embeddings=config.get("max_position_embeddings"),
        attn_logit_softcapping=config.get("attn_logit_softcapping") if gemma else None,
        final_logit_softcapping=config.get("final_logit_softcapping") if gemma else None,
        query_pre_attn_scalar=config.get("query_pre_attn_scalar") if gemma else None, raw=config)


def _rope(config: dict) -> dict | None:
    """rope_parameters as transformers 5 writes them, from either layout; None for a kind not implemented."""
    table = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    table.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    table["rope_type"] = table.get("rope_type", table.get("type", "default"))
    if table["rope_type"] not in ROPE_TYPES or table.get("partial_rotary_factor", 1) != 1:
        return None
    if table["rope_type"] != "default" and not isinstance(table.get("factor"), (int, float)):
        return None
    return table


def _windows(config: dict, model_type: str) -> tuple | None:
    """Each layer's sliding window, as transformers applies it (None for a layout not understood)."""
    layers = config["num_hidden_layers"]
    window = config.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not config.get("use_sliding_window", False):
        window = None
    types = config.get("layer_types")
    if types is None:
        if model_type == "gemma2":
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        elif model_type in ("qwen2", "qwen3"):
            start = config.get("max_window_layers", layers)
            types = ["sliding_attention" if i >= start else "full_attention" for i in range(layers)]
        else:
            types = ["sliding_attention"] * layers
    if len(types) != layers or any(t not in ("full_attention", "sliding_attention") for t in types):
        return None
    if window is not None and (not isinstance(window, int) or window <= 0):
        return None
    return tuple(window if t == "sliding_attention" and window is not None else None for t in types)


def inv_freq(config: StepConfig) -> torch.Tensor:
    """[d/2] float32 on the CPU: the rotary frequencies, as transformers computes them."""
    rope, dim = config.rope_parameters, config.head_dim
    steps = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float()  # also under a meta device
    freq = 1.0 / (rope["rope_theta"] ** (steps / dim))
    if rope["rope_type"] == "linear":
        return freq / rope["factor"]
    if rope["rope_type"] == "llama3":
        return _llama3(freq, rope)
    return freq


def _llama3(freq: torch.Tensor, rope: dict) -> torch.Tensor:
    """Llama 3.1's frequencies: long wavelengths divided by `factor`, short ones kept, a smooth blend
    between (the rule of Meta's reference code, which transformers follows)."""
    factor, low, high = rope["factor"], rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    original = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_wavelen, freq / factor, freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)
