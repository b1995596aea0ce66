"""The EAGLE-3 draft head: one Llama decoder layer that reads the target's own hidden states.

EAGLE-3 (Li et al., arXiv 2503.01840) drafts with a small head instead of a separate model. The
target's hidden states at three of its layers (low, middle, high: `aux_layer_ids`) are
concatenated and fused by `fc` into one feature of the head's width; the head's single decoder
layer attends over `concat(input_layernorm(embedding of the next token), hidden_norm(feature))`
(2H wide) and predicts the token after that one over a reduced draft vocabulary. Drafting goes
on autoregressively on the head's own output hidden states.

Rows pair up like this (t is a position of the target's sequence):

    row t   id: x[t+1]   feature: fc(aux states of the target at t)   -> logits for x[t+2]
            (or, for a position the head drafted itself: its own output hidden state at t)

so the head's row t sits at position t, one behind the id it embeds. `aux_layer_ids` count as
vLLM's `eagle_aux_hidden_state_layer_ids` and transformers' `output_hidden_states` do: id i is
the input of decoder layer i (0 = the embeddings), that is the residual stream after i layers.

Lossless verification does not depend on the head: the target verifies whatever it proposes, and
`target_logits` puts -inf on every target id outside the draft vocabulary, so such an id is
never proposed and q of it is 0.

docs/models.md, "EAGLE-3 heads: checkpoint formats", maps both checkpoint formats onto this module;
core/drafters/head_formats.py reads and writes them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from specgen.core.step import parts
from specgen.core.step.ops import TorchOps
from specgen.core.step.rows import Rows

REFERENCE = TorchOps()  # the kernel table a head computes through unless given another (`ops`)


class RMSNorm(parts.RMSNorm):
    """A Llama RMSNorm whose weight the head trains (the owned step's, computed through its table)."""

    def __init__(self, size: int, eps: float):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.ones(size))
        self.eps, self.offset = eps, False

    def forward(self, x: torch.Tensor, ops=REFERENCE) -> torch.Tensor:
        return ops.norm(x, self.weight, self.eps)


@dataclass(frozen=True)
class Eagle3Config:
    """The head's shape. `target_*` describe the target it reads; `aux_layer_ids` None means the
    EAGLE-3 default for the target's depth N, (2, N // 2, N - 3) (see `layers_for`)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    target_vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] | None
    max_position_embeddings: int
    # transformers' rope_scaling dict ({"rope_type": "llama3", "factor": ...}) or None
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    # speculators' norm_before_residual: the residual is hidden_norm(feature), not the feature
    norm_before_residual: bool = False

    def __post_init__(self):
        positive = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "target_vocab_size", "draft_vocab_size", "target_hidden_size",
                    "max_position_embeddings")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} = {value!r} must be a positive integer")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim = {self.head_dim} must be even (rotary embeddings)")
        if self.draft_vocab_size > self.target_vocab_size:
            raise ValueError(f"draft_vocab_size ({self.draft_vocab_size}) is larger than the target's "
                             f"vocabulary ({self.target_vocab_size})")
        if 3 * self.target_hidden_size == self.hidden_size:
            # forward tells fused from unfused features by their width
            raise ValueError(f"hidden_size ({self.hidden_size}) = 3 × target_hidden_size: "
                             "specgen cannot tell the target's features from the head's own")
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling)
        if self.aux_layer_ids is not None:
            ids = tuple(self.aux_layer_ids)
            if len(ids) != 3 or any(not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"aux_layer_ids = {list(ids)} must be three layer indices >= 0")
            object.__setattr__(self, "aux_layer_ids", ids)

    def layers_for(self, target_layers: int) -> tuple[int, ...]:
        """The aux layer ids for a target of `target_layers` decoder layers."""
        if self.aux_layer_ids is not None:
            return self.aux_layer_ids
        return (2, target_layers // 2, target_layers - 3)

    def replace(self, **changes) -> "Eagle3Config":
        return dataclasses.replace(self, **changes)


def rope_type(scaling: dict[str, Any] | None) -> str:
    """transformers' rope type of a rope_scaling dict (its older key `type` too); "default" unscaled."""
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


# rope types whose frequencies transformers derives from a scaling `factor` it requires
FACTOR_TYPES = ("linear", "dynamic", "yarn", "llama3")


def _check_rope_scaling(scaling: object) -> None:
    """What a damaged config gets wrong before transformers' rope functions see it: they would fail
    with an AttributeError or a KeyError, or warn on stderr, far from the config's key."""
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling = {json.dumps(scaling)} must be an object, such as "
                         '{"rope_type": "linear", "factor": 2.0}, or null')
    kind = rope_type(scaling)
    if not isinstance(kind, str):
        raise ValueError(f"rope_scaling's rope_type = {json.dumps(kind)} must be a string")
    factor = scaling.get("factor")
    if kind in FACTOR_TYPES and factor is None:
        raise ValueError(f'rope_scaling of type "{kind}" needs a `factor`: {json.dumps(scaling)}')
    if factor is not None and not (isinstance(factor, (int, float)) and not isinstance(factor, bool)
                                   and math.isfinite(factor) and factor >= 1):
        raise ValueError(f"rope_scaling's factor = {json.dumps(factor)} must be a number >= 1")


class Rotary(nn.Module):
    """Llama's rotary embedding (rotate-half form) at explicit positions. Scaled variants
    (llama3, yarn, ...) take their frequencies from transformers' own table of rope types."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        inv_freq, self.scale = self._frequencies(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [D/2] float32

    @staticmethod
    def _frequencies(config: Eagle3Config) -> tuple[torch.Tensor, float]:
        scaling, kind = config.rope_scaling or {}, rope_type(config.rope_scaling)
        if kind == "default":
            steps = torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim
            return 1.0 / (config.rope_theta ** steps), 1.0
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if kind not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"rope_scaling type {kind!r} is not one of {', '.join(ROPE_INIT_FUNCTIONS)}")
        try:
            llama = LlamaConfig(hidden_size=config.num_attention_heads * config.head_dim, head_dim=config.head_dim,
                                num_attention_heads=config.num_attention_heads, rope_theta=config.rope_theta,
                                rope_scaling=dict(scaling), max_position_embeddings=config.max_position_embeddings)
            inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](llama, None)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:  # a key the type needs, of a bad value
            raise ValueError(f"rope_scaling = {json.dumps(scaling)} cannot be used: "
                             f"{exc.args[0] if exc.args else type(exc).__name__}") from None
        return inv_freq.float(), float(scale)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N] -> cos, sin [N, 1, D] in dtype."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # [N, D/2]
        angles = torch.cat([angles, angles], dim=-1)[:, None, :]
        return (angles.cos() * self.scale).to(dtype), (angles.sin() * self.scale).to(dtype)

    def tabulate(self, capacity: int, dtype: torch.dtype) -> None:
        """Compute cos and sin for positions 0 .. capacity - 1 once, side by side ([C, 2, D]):
        `lookup` then gathers one row per position where `forward` launches about ten small
        kernels (a drafting step's cost)."""
        cos, sin = self.forward(torch.arange(capacity, device=self.inv_freq.device), dtype)
        self.register_buffer("table", torch.cat([cos, sin], dim=1), persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """forward's values (views [N, 1, D]) from the table, for positions below its capacity."""
        rows = self.table[positions]
        return rows[:, :1], rows[:, 1:]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(parts.Attention):
    """Llama attention whose q/k/v read 2H (embedding and feature side by side): the owned step's
    attention (core/step/parts.py) with trainable projections, over the head's own one-layer slot
    cache ([1, Hkv, C, D], the layout gpu/kernels/attention.py's kernel reads). A row writes its key at
    its position's slot and attends to the slots at or before it; slots past the position are
    stale and masked, so a rollback only moves the position and no shape depends on it."""

    def __init__(self, config: Eagle3Config):
        nn.Module.__init__(self)
        self.index, self.window, self.softcap, self.fused = 0, None, None, None
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim ** -0.5
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)


class MLP(parts.MLP):
    def __init__(self, config: Eagle3Config):
        nn.Module.__init__(self)
        self.activation = "silu"
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops=REFERENCE, residual: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x, ops, residual)


class Eagle3Layer(nn.Module):
    """The head's decoder layer. The residual is the feature h (EAGLE-3's midlayer, speculators'
    first layer); with norm_before_residual it is hidden_norm(h) instead."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.norm_before_residual = config.norm_before_residual
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.mlp = MLP(config)

    def forward(self, embeds: torch.Tensor, h: torch.Tensor, rows: Rows, cache, ops, rotary) -> torch.Tensor:
        """embeds, h [1, N, H] -> the layer's output [1, N, H]; each add is its projection's epilogue."""
        normed = self.hidden_norm(h, ops)
        residual = normed if self.norm_before_residual else h
        x = torch.cat([self.input_layernorm(embeds, ops), normed], dim=-1)  # [1, N, 2H]
        attn = self.self_attn
        h = attn.project(attn(x, rows, cache, ops, rotary), ops, residual=residual)
        return self.mlp(self.post_attention_layernorm(h, ops), ops, residual=h)


class Slots:
    """The head's cache as the owned step's ops read it (SlotCache's fields for one layer): keys
    and values [B, g, C, d], B = 1 for the head's own, one row per sequence for a batch's."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = [keys], [values]
        self.capacity = keys.shape[2]


class Eagle3Head(nn.Module):
    """The EAGLE-3 head with a static KV cache of its own.

    `embedding` [target_vocab, hidden] is the token embedding. EAGLE-3 embeds with the target's
    own `embed_tokens`, so the caller passes the target's weight and the head keeps it as a
    non-persistent buffer: it is not one of the head's weights, `state_dict()` leaves it out, and
    `.to()` gives the head its own copy only when the device or dtype changes (never converting
    the target's in place). Either checkpoint format may also carry its own copy
    (`embed_tokens.weight`: speculators writes one when it saves the verifier's embedding, the
    EAGLE-3 repository's training script does not); core/drafters/head_formats.py's loader then uses that
    copy, as vLLM does, and `owns_embedding` is True so that saving writes it back.

    Parameter names are the speculators format's weight names (`fc.weight`, `layers.0.*`,
    `norm.weight`, `lm_head.weight`, buffers `d2t` and `t2d`), so `state_dict()` is the checkpoint.
    """

    def __init__(self, config: Eagle3Config, embedding: torch.Tensor, capacity: int | None = None,
                 owns_embedding: bool = False):
        super().__init__()
        if tuple(embedding.shape) != (config.target_vocab_size, config.hidden_size):
            raise ValueError(f"the embedding has shape {list(embedding.shape)}; the head needs "
                             f"[{config.target_vocab_size}, {config.hidden_size}] (target vocabulary × head width)")
        self.config = config
        self.owns_embedding = owns_embedding
        self.register_buffer("embedding", embedding.detach(), persistent=False)
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(config)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        # target id = draft id + d2t[draft id]; t2d[target id] says whether the draft vocabulary has it
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.target_vocab_size, dtype=torch.bool))
        self.rotary = Rotary(config)
        self.ops = REFERENCE  # the kernel table its calls compute through (a backend's, core/drafters/heads.py)
        self.register_buffer("position", torch.zeros((), dtype=torch.long), persistent=False)
        self.reserve(capacity or config.max_position_embeddings)

    def reserve(self, capacity: int) -> None:
        """(Re)allocate the KV cache for `capacity` positions, empty, at position 0. The cache
        tensors are new objects: re-capture any graph that holds the old ones."""
        weight = self.fc.weight
        shape = (1, self.config.num_key_value_heads, capacity, self.config.head_dim)
        self.register_buffer("k_cache", weight.new_zeros(shape), persistent=False)
        self.register_buffer("v_cache", weight.new_zeros(shape), persistent=False)
        self.rotary.tabulate(capacity, weight.dtype)
        self.capacity = capacity
        self.position.zero_()

    def reset(self) -> None:
        """Forget the sequence: the next forward starts at position 0 (stale slots are masked)."""
        self.position.zero_()

    def identity_vocab(self) -> None:
        """The draft vocabulary is the target's whole vocabulary, in its order."""
        if self.config.draft_vocab_size != self.config.target_vocab_size:
            raise ValueError("an identity vocabulary map needs draft_vocab_size == target_vocab_size")
        self.d2t.zero_()
        self.t2d.fill_(True)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's aux states [N, 3 * target_hidden] (low, middle, high concatenated) -> [N, H]."""
        return self.fc(aux)

    def forward(self, ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor | None = None,
                keys: int | None = None, track: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [N] target ids, features [N, 3 * target_hidden] (the target's aux states, fused
        here by `fc`) or [N, H] (already fused, or the head's own output hidden states), positions
        [N] (default: from `position` on). Writes the rows' keys at their positions, sets
        `position` past the last row, and returns (logits over the draft vocabulary [N, Vd],
        output hidden states [N, H]: before the final norm, the features of the next step).
        keys: attend over the first `keys` cache slots only (more than the largest position; the
        eager path's saving); None: the whole cache, whose shape a captured step needs fixed.
        track=False leaves `position` alone (a caller that always passes positions saves two
        kernel launches a call)."""
        if positions is None:
            positions = self.position + torch.arange(ids.shape[0], device=ids.device)
        # one chain of rows from positions[0] (its slots are its positions): the rows' layout the
        # attention kernel reads
        logits, out = self.forward_rows(Rows(ids[None], positions[None], positions[None], positions[:1]),
                                        features, keys)
        if track:
            self.position.copy_(positions[-1] + 1)
        return logits, out

    def forward_rows(self, rows: Rows, features: torch.Tensor,
                     keys: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """forward over one sequence's rows in any layout (core/step/rows.py, B = 1): a chain's, or
        a token tree's, each node after the committed prefix and its ancestors at their slots.
        features [N, ...] as forward's, one per row; keys as forward's (more than the largest slot).
        Leaves `position` alone."""
        positions = rows.positions[0]
        h = self.fused(features)
        rope = self.rotary.lookup(positions)
        if rope[0].dtype != h.dtype:  # features in another dtype than the head's weights
            rope = self.rotary(positions, h.dtype)
        rotary = (rope[0][:, 0][None], rope[1][:, 0][None])  # [N, 1, D] -> the ops' [1, N, D]
        cache = Slots(self.k_cache, self.v_cache) if keys is None else \
            Slots(self.k_cache[:, :, :keys], self.v_cache[:, :, :keys])
        logits, out = self.over_rows(h[None], rows, cache, self.ops, rotary)
        return logits[0], out[0]

    def fused(self, features: torch.Tensor) -> torch.Tensor:
        """The target's aux states [..., 3 * target_hidden] fused to [..., H]; the head's own [..., H]
        (or fused ones) as they are."""
        return self.fuse(features) if features.shape[-1] == 3 * self.config.target_hidden_size else features

    def over_rows(self, h: torch.Tensor, rows: Rows, cache, ops, rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """forward's computation for B sequences' n rows each (`rows`: their ids, positions and
        slots) over `cache` (keys and values [B, g, C, d], a layer's slot cache as Slots holds
        it): h [B, n, H] fused features or the head's own states, rotary (cos, sin) [B, n, D] ->
        (logits over the draft vocabulary [B, n, Vd], output hidden states [B, n, H])."""
        embeds = ops.embed(self.embedding, rows.ids).to(h.dtype)
        out = self.layers[0](embeds, h, rows, cache, ops, rotary)
        return ops.linear(self.norm(out, ops), self.lm_head.weight), out

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (any shape)."""
        return draft_ids + self.d2t[draft_ids]

    def target_logits(self, draft_logits: torch.Tensor, width: int) -> torch.Tensor:
        """[N, Vd] -> [N, width] float32 over target ids, -inf where the draft vocabulary has no
        id: those tokens get q = 0 and are never proposed (width may exceed the target's
        vocabulary, as padded logits do)."""
        out = draft_logits.new_full((draft_logits.shape[0], width), float("-inf"), dtype=torch.float32)
        targets = torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t
        return out.index_copy_(1, targets, draft_logits.float())
