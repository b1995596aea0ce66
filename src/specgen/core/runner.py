"""Running a causal LM over a KV cache whose rollback is moving one position.

Every runner owns one position tensor: a step writes at it and advances it, and a round rolls
back by moving it (`position.sub_(n)`), on the device, without a host sync. EagerRunner (the
torch backend) steps specgen's own models over a slot cache (core/step/) and keeps transformers'
models' DynamicCache cropped to that position; gpu/runner.py's GraphRunner keeps a static slot
cache whose layers all write at it, so its steps can be captured as CUDA graphs.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Protocol

import torch

from specgen.core.errors import UsageError

# How a runner's forward steps a prompt (gpu/runner.py's GraphRunner: its largest captured step,
# replayed chunk by chunk), and a batch's prefill steps its rows' prompts as it does
# (core/round/batch_prefill.py): the same chunks give the same bits.
PREFILL_CHUNK = 64
MAX_CHUNKS = 8  # longer prompts (more than 512 tokens) prefill eagerly, where compute dominates


class Runner(Protocol):
    """What a round needs of a model: a static cache, a device position and fixed-shape steps."""

    device: torch.device
    position: torch.Tensor  # [] int64: where the next step writes
    capacity: int
    generation: int  # bumped when the cache is re-allocated (captured rounds must re-capture)

    def reset(self) -> None: ...

    def forward(self, ids: torch.Tensor, want_logits: bool = True) -> torch.Tensor | None: ...

    def step(self, ids: torch.Tensor, logits_out: torch.Tensor) -> torch.Tensor: ...

    def step_rows(self, rows, logits_out: torch.Tensor) -> None:
        """A step over given rows (core/step/rows.py: a token tree's), logits into logits_out
        [n, width]; the position stays (the round's commit moves it)."""

    def compact(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move the K/V in slots src [m] to slots dst [m] (a tree's accepted path), on the device."""

    def step_context(self, tokens: int) -> ContextManager: ...

    def batch_ops(self, capacity: int):
        """The kernel table (core/step/ops.py) a batch round steps this runner's model with over
        caches of B rows and `capacity` slots (core/round/batch_round.py): computing each row as
        this runner's own steps do."""

    def reserve(self, positions: int) -> None: ...


def tree_steps_refusal(model) -> str:
    """Why an eager runner cannot step `model` over a token tree's rows ("" where it can).
    specgen's own models step any rows; transformers' models take a tree's rows as an additive
    4D mask, which replaces the masks they would build, sliding windows included: a model with
    sliding-window layers would see keys past its window, so it steps chains only."""
    from specgen.core.step.model import OwnedModel

    if isinstance(model, OwnedModel):
        return ""
    config = model.config
    kinds = set(getattr(config, "layer_types", None) or ())
    window = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    if "sliding_attention" in kinds or (window and not kinds):
        return ("need specgen's own model step or a transformers model without sliding windows, "
                f"and this pair runs {config.model_type} on transformers")
    return ""


def fit_logits(logits: torch.Tensor, width: int) -> torch.Tensor:
    """[n, cols] -> [n, width] float32: cut extra (padding) columns, or pad with -inf."""
    cols = logits.shape[-1]
    if cols >= width:
        return logits[:, :width].float()
    pad = logits.new_full((logits.shape[0], width - cols), float("-inf"), dtype=torch.float32)
    return torch.cat([logits.float(), pad], dim=-1)


class EagerRunner:
    """The torch backend's runner: eager steps at its `position` (the Runner protocol's: a round
    moves it back to roll back). specgen's own models (core/step/) step over a slot cache whose
    rows see the slots before the position, so a rollback needs nothing more; transformers' models
    keep a DynamicCache (models.new_cache) cropped to the position before the next step. Either way
    attention covers only the live keys: on a CPU, reading the position costs nothing."""

    use_graphs = False  # its steps read the position on the host: rounds over it run eagerly

    def __init__(self, model, width: int, capacity: int = 0, tap=None):
        from specgen.core.models.loading import cache_keyword
        from specgen.core.step.model import OwnedModel

        self.model = model
        self.tap = tap  # core/drafters/heads.py's AuxTap: copies hidden states during this runner's forwards
        self.width = width  # logits columns handed out: padded with -inf or cut to the target's width
        self.device = model.get_output_embeddings().weight.device
        self.position = torch.zeros((), dtype=torch.long, device=self.device)
        self.capacity = capacity  # not a limit here: the cache grows as needed
        self.generation = 0
        self.owned = isinstance(model, OwnedModel)
        self.length = 0  # transformers' cache: tokens in it (may run ahead of position until the next step)
        self.cache_keyword = None if self.owned else cache_keyword(type(model).forward)
        self.reset()

    def reset(self) -> None:
        from specgen.core.models.loading import new_cache

        self.cache = self.model.new_cache(1, max(self.capacity, 64)) if self.owned else new_cache(self.model)
        self.length = 0
        self.position.zero_()

    def reserve(self, positions: int) -> None:
        self.capacity = max(self.capacity, positions)

    def step_context(self, tokens: int) -> ContextManager:
        return contextlib.nullcontext()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, want_logits: bool = True) -> torch.Tensor | None:
        """ids: [n] int64 -> logits [n, width] float32 (None when want_logits is False)."""
        if ids.shape[0] == 0:
            return None
        logits = self._run(ids.to(self.device), n_logits=ids.shape[0] if want_logits else 1)
        return fit_logits(logits, self.width) if want_logits else None

    def step(self, ids: torch.Tensor, logits_out: torch.Tensor) -> torch.Tensor:
        """A round's step: forward at the position, logits into logits_out [n, width], advance."""
        logits = self._run(ids, n_logits=ids.shape[0])
        cols = min(logits.shape[-1], self.width)
        logits_out[:, :cols].copy_(logits[:, :cols])
        return logits

    def step_rows(self, rows, logits_out: torch.Tensor) -> None:
        refusal = tree_steps_refusal(self.model)
        if refusal:
            raise UsageError(f"token trees {refusal}", hint="set tree_width = 1")
        with self.tap.armed() if self.tap is not None else contextlib.nullcontext():
            if self.owned:
                self._room(int(rows.slots.max()) + 1)
                logits = self.model.step(rows, self.cache)[0]
            else:
                logits = self._transformers_rows(rows)
        cols = min(logits.shape[-1], self.width)
        logits_out[:, :cols].copy_(logits[:, :cols])

    def _transformers_rows(self, rows) -> torch.Tensor:
        """One sequence's rows over transformers' DynamicCache, which appends: a tree's rows take
        consecutive slots past the position (the target's: the root and its nodes, core/step/rows.py
        tree; the draft model's levels: each after the levels before, core/round/tree.py level_rows),
        so cropping the cache to the rows' first slot (dropping what an earlier round left past the
        position, and nothing of this round's earlier levels) puts each row at the entry its slot
        names. Their `seen` over entries is then their mask (an additive 4D mask, which
        transformers takes as given), and each row keeps its own rotary position. The entries past
        an accepted path go at the next crop, after compact() moved the path's into place."""
        from specgen.core.step.rows import seen

        first, n = int(rows.slots[0, 0]), rows.count
        if self.length > first:
            self.cache.crop(first - self.length)
            self.length = first
        entries = torch.arange(first, first + n, device=self.device)
        if self.length != first or first < int(self.position) or not torch.equal(rows.slots[0], entries):
            raise ValueError(f"rows on a transformers cache must take consecutive slots from its {self.length} "
                             f"entries, past its position {int(self.position)}")
        dtype = self.model.get_input_embeddings().weight.dtype
        blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=self.device)
        visible = seen(rows.start, n, first + n, rows.tail, rows.depth)  # [1, n, first + n]
        mask = torch.where(visible, torch.zeros((), dtype=dtype, device=self.device), blocked)[:, None]
        out = self.model(input_ids=rows.ids, **{self.cache_keyword: self.cache}, attention_mask=mask,
                         position_ids=rows.positions, cache_position=entries, use_cache=True)
        self.length = first + n
        return out.logits[0]

    def compact(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        from specgen.core.step.model import REFERENCE

        if self.owned:
            REFERENCE.compact(self.cache, src[None], dst[None])
            return
        # transformers' cache holds only the entries written: the pairs past it are the bookkeeping's
        # for rows that no step wrote (an ngram round over the root alone, Mode.EMPTY: its k pairs
        # name slots past the one row), which a static cache moves as junk and this one cannot
        held = self.cache.layers[0].keys.shape[2]
        inside = (src < held) & (dst < held)
        src, dst = src[inside], dst[inside]
        for layer in self.cache.layers:  # as REFERENCE.compact: every source read before any write
            layer.keys[:, :, dst] = layer.keys[:, :, src]
            layer.values[:, :, dst] = layer.values[:, :, src]

    def batch_ops(self, capacity: int):
        """The kernel table a batch round steps this runner's model with: the reference."""
        from specgen.core.step.model import REFERENCE

        return REFERENCE

    def _room(self, slots: int) -> None:
        if slots > self.cache.capacity:
            self.cache = self.cache.grown(max(2 * self.cache.capacity, slots))

    def _run(self, ids: torch.Tensor, n_logits: int) -> torch.Tensor:
        start, n = int(self.position), ids.shape[0]
        with self.tap.armed() if self.tap is not None else contextlib.nullcontext():
            logits = self._owned(ids, start, n_logits) if self.owned else self._transformers(ids, start, n_logits)
        self.position.add_(n)
        return logits

    def _owned(self, ids: torch.Tensor, start: int, n_logits: int) -> torch.Tensor:
        from specgen.core.step.rows import chain

        self._room(start + ids.shape[0])
        return self.model.step(chain(ids[None], start), self.cache, keep=n_logits)[0]

    def _transformers(self, ids: torch.Tensor, start: int, n_logits: int) -> torch.Tensor:
        if self.length > start:  # a round moved the position back: drop what it rejected
            self.cache.crop(start - self.length)  # negative: drop that many (works across versions)
        positions = torch.arange(start, start + ids.shape[0], device=self.device)
        out = self.model(input_ids=ids.unsqueeze(0), **{self.cache_keyword: self.cache},
                         position_ids=positions.unsqueeze(0), cache_position=positions, use_cache=True,
                         logits_to_keep=n_logits)
        self.length = start + ids.shape[0]
        return out.logits[0]
