"""The round over a batch: B rows, each its own sequence, drafted by the draft model in chains.

The chain round's phases (core/round/round.py), with a batch dimension everywhere:

    draft    the draft model steps over each row's `pending` [B, 2], then k - 1 steps [B, 1], each
             row at its own position in its own cache row (core/step/rows.batch); each row's pick
             races its own noise row against its own warped q (greedy rows: their argmax)
    target   one step over feed [B, k + 1]
    verify   the rows' warp in one call (WarpParams per row), then each row verified by itself with
             the references' calls on its own slices, so that a row computes what it would alone
    commit   each row's positions, `pending` and next `last` (core/sampling/bookkeeping.commit per row)

Each row has its own budget and num_drafts, max_tokens (`limit`), warp settings, and seed:
rejection coupling's numbers come from the row's own generator into the row's own buffers,
drawn in the order and shapes the chain round draws them, so a row emits the tokens it emits
alone; Gumbel coupling keys each row's noise by its own seed and positions. A row without a
prompt (finished, or never started) runs with the others (the shapes stay (B, k)) but its
positions and count stay where they were: `active` masks it. The body reads no host value, so a
backend may capture it; the torch backend runs it as it is (the CUDA backend does not take
batches yet).
"""

from __future__ import annotations

import torch

from specgen.core.errors import UsageError
from specgen.core.round.drafters import draft_spec
from specgen.core.round.rows import Padding
from specgen.core.sampling import noise
from specgen.core.sampling.bookkeeping import CommitBuffers
from specgen.core.sampling.warp import WarpFlags, WarpParams, exponentials_, uniforms_
from specgen.core.settings import SamplingSpec
from specgen.core.step import rows as rowsets

FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
          "frequency_penalty")


class RowParams:
    """WarpParams for `rows_per` logits rows of each of B rows, set row by row on the host."""

    def __init__(self, batch: int, rows_per: int, device: torch.device):
        self.rows_per = rows_per
        plain = WarpParams.from_spec(SamplingSpec(), batch * rows_per, device)
        self.params = WarpParams(*(getattr(plain, f) for f in FIELDS))
        self.specs: list[SamplingSpec | None] = [None] * batch

    def set(self, b: int, spec: SamplingSpec) -> None:
        at = slice(b * self.rows_per, (b + 1) * self.rows_per)
        for name in FIELDS:
            getattr(self.params, name)[at].fill_(getattr(spec, name))
        self.specs[b] = spec
        self.params.__dict__.pop("log_min_p", None)  # cached from the old min-p
        live = [s for s in self.specs if s is not None]
        self.params.__dict__["flags"] = WarpFlags(all(s.greedy for s in live), any(s.top_k > 0 for s in live),
                                                  any(s.top_p < 1 for s in live), any(s.min_p > 0 for s in live))


class BatchCoupling:
    """Both couplings' buffers per row. noise [B, k + 1, V]: the draft's race rows 0 .. k - 1 and
    the target's row k (rejection: Exp(1) from the row's generator; Gumbel: from the row's key and
    positions); uniform [B, k]; q [B, k, V] the draft's probs per step."""

    def __init__(self, rnd, gumbel: bool):
        b, k, width, z = rnd.batch, rnd.k, rnd.width, dict(device=rnd.device)
        self.rnd, self.gumbel = rnd, gumbel
        self.noise = torch.ones(b, k + 1, width, dtype=torch.float32, **z)
        self.uniform = torch.ones(b, k, dtype=torch.float32, **z)
        self.q = torch.zeros(b, k, width, dtype=torch.float32, **z)
        self.key = torch.zeros(b, 2, dtype=torch.long, **z)
        self.origin = torch.zeros(b, dtype=torch.long, **z)
        self.first = torch.zeros(b, dtype=torch.long, **z)
        self.choice = torch.zeros(b * (k + 1), dtype=torch.long, **z)

    def start(self, b: int, seed: int, origin: int) -> None:
        self.key[b].copy_(torch.tensor(noise.split_seed(seed)))
        self.origin[b].fill_(origin)

    def draw(self, b: int, generator: torch.Generator, sampled: bool) -> None:
        """Row b's numbers for the next round, as the chain round draws them (rejection coupling,
        sampled rows: every draft step races, so all k + 1 noise rows, then the uniforms)."""
        if self.gumbel or not sampled:
            return
        exponentials_(self.noise[b], generator)
        uniforms_(self.uniform[b], generator)

    def begin(self) -> None:
        if not self.gumbel:
            return
        rnd = self.rnd
        torch.add(self.origin, rnd.generated, out=self.first)
        for b in range(rnd.batch):
            rnd.ops.gumbel_noise(self.noise[b], self.key[b], self.first[b])

    def verify(self, logits: torch.Tensor, params: WarpParams, bad) -> None:
        """Each row's output row from the target's logits [B * (k + 1), V]."""
        rnd, k = self.rnd, self.rnd.k
        if self.gumbel:
            rnd.ops.warp_and_race(logits, params, self.noise.view(-1, rnd.width), self.choice, None, bad)
            for b in range(rnd.batch):
                rows = self.choice[b * (k + 1):(b + 1) * (k + 1)]
                rnd.out[b].copy_(rnd.ops.verify_greedy(rnd.drafts[b], rnd.num_drafts[b:b + 1], rows, k)[0])
            return
        argmax, probs = rnd.ops.warp(logits, params, None, bad)
        for b in range(rnd.batch):
            at = slice(b * (k + 1), (b + 1) * (k + 1))
            if probs is None:
                out = rnd.ops.verify_greedy(rnd.drafts[b], rnd.num_drafts[b:b + 1], argmax[at], k)
            else:
                out = rnd.ops.verify_random(rnd.drafts[b], rnd.num_drafts[b:b + 1], self.q[b], probs[at],
                                            self.uniform[b], self.noise[b, k:], k)
            rnd.out[b].copy_(out[0])


class BatchRound:
    """B rows of chain speculation with the draft model. target, draft: the runners (EagerRunner) of
    specgen's own models; each row's keys and values live in this round's caches' row b."""

    def __init__(self, k: int, batch: int, width: int, vocab_size: int, gumbel: bool, backend, target, draft):
        if not all(getattr(r, "owned", False) for r in (target, draft)):
            raise UsageError("batches need specgen's own model step, and this pair runs on transformers",
                             hint="set batch_size = 1 (--batch-size 1), or use checkpoints specgen's step covers")
        self.k, self.batch, self.width, self.backend = k, batch, width, backend
        self.models = (target.model, draft.model)
        self.device = device = target.device
        z = dict(device=device)
        self.caches = [m.new_cache(batch, 64) for m in self.models]
        self.feed = torch.zeros(batch, k + 1, dtype=torch.long, **z)  # [B, k+1] last, d0 .. d(k-1)
        self.drafts = self.feed[:, 1:]  # [B, k]
        self.out = torch.zeros(batch, k + 1, dtype=torch.long, **z)
        self.pending = torch.zeros(batch, 2, dtype=torch.long, **z)  # the draft's next step: committed[-2:]
        self.positions = torch.zeros(2, batch, dtype=torch.long, **z)  # target, draft
        self.held = torch.zeros(3, batch, dtype=torch.long, **z)  # positions and generated before the round
        self.budget = torch.zeros(batch, dtype=torch.int32, **z)
        self.num_drafts = torch.zeros(batch, dtype=torch.int32, **z)
        self.generated = torch.zeros(batch, dtype=torch.long, **z)
        self.emitted = torch.zeros(batch, dtype=torch.long, **z)
        self.limit = torch.zeros(batch, dtype=torch.long, **z)
        self.active = torch.zeros(batch, dtype=torch.bool, **z)
        self.confident = torch.ones(k, dtype=torch.bool, **z)
        self.target_logits = torch.full((batch, k + 1, width), float("-inf"), dtype=torch.float32, **z)
        self.draft_logits = torch.full((batch, width), float("-inf"), dtype=torch.float32, **z)
        self.stage_ids = torch.zeros(batch, 2 * k + 2, dtype=torch.long, **z)  # per row: out | drafts | n
        self.target_params = RowParams(batch, k + 1, device)
        self.draft_params = RowParams(batch, 1, device)
        self.bad = Padding(width, vocab_size, device).padding
        self.coupling = BatchCoupling(self, gumbel)

    @property
    def ops(self):
        return self.backend.ops

    # -- host side, between rounds ----------------------------------------------------------------

    def start(self, b: int, prompt_ids: list[int], spec: SamplingSpec, seed: int, cut: bool = True) -> None:
        """Row b takes a prompt: both caches' row b prefilled (the target: all but the last id; the
        draft: all but the last two, a one-token prompt seen twice), its settings and its seed.
        cut: the draft's q keeps the request's top-k / top-p / min-p (core/engine.draft_picking)."""
        ids = list(prompt_ids)
        self._room(len(ids) + spec.max_tokens + self.k + 3)
        for which, prefix in ((0, ids[:-1]), (1, ids[:-2])):
            self._prefill(which, b, prefix)
        self.pending[b].copy_(torch.tensor((ids * 2)[-2:]))
        self.feed[b, 0].fill_(ids[-1])
        self.generated[b].zero_()
        self.limit[b].fill_(spec.max_tokens - 1)
        self.target_params.set(b, spec)
        self.draft_params.set(b, draft_spec(spec, cut))
        self.coupling.start(b, seed, len(ids))
        self.active[b].fill_(True)

    def stop(self, b: int) -> None:
        """Row b has no prompt: it runs on, masked, until start() gives it one."""
        self.active[b].fill_(False)
        self.budget[b].fill_(0)

    def set_budget(self, b: int, n: int) -> None:
        self.budget[b].fill_(n)

    def draw(self, b: int, generator: torch.Generator) -> None:
        self.coupling.draw(b, generator, not self.target_params.specs[b].greedy)

    def _room(self, slots: int) -> None:
        for i, cache in enumerate(self.caches):
            if slots > cache.capacity:
                self.caches[i] = cache.grown(max(2 * cache.capacity, slots))

    def _prefill(self, which: int, b: int, ids: list[int]) -> None:
        """One row's prefix, stepped as a sequence alone over row b's view of the cache."""
        self.positions[which, b].fill_(len(ids))
        if ids:
            view = row_view(self.caches[which], b)
            self.models[which].step(rowsets.chain(torch.tensor([ids], device=self.device), 0), view, keep=1)

    # -- the device program -----------------------------------------------------------------------

    def body(self) -> None:
        """One round for every row, no host sync."""
        self.held[:2].copy_(self.positions)
        self.held[2].copy_(self.generated)
        self.coupling.begin()
        self._draft()
        self._step(0, self.feed, self.target_logits)
        self.coupling.verify(self.target_logits.view(-1, self.width), self.target_params.params, self.bad)
        for b in range(self.batch):
            self.ops.commit(CommitBuffers(
                row=self.out[b], feed=self.feed[b], num_drafts=self.num_drafts[b:b + 1], stage=self.stage_ids[b],
                target_position=self.positions[0, b], emitted=self.emitted[b], generated=self.generated[b],
                draft_position=self.positions[1, b], pending=self.pending[b], ran=self.k + 1))
        self.positions.copy_(torch.where(self.active, self.positions, self.held[:2]))
        self.generated.copy_(torch.where(self.active, self.generated, self.held[2]))

    def _draft(self) -> None:
        ids, params = self.pending, self.draft_params.params
        for i in range(self.k):
            self._step(1, ids, self.draft_logits[:, None], keep=1)
            self.ops.warp_and_race(self.draft_logits, params, self.coupling.noise[:, i], self.drafts[:, i], None,
                                   self.bad, probs_out=self.coupling.q[:, i])
            ids = self.drafts[:, i : i + 1]
        for b in range(self.batch):
            self.ops.count_drafts(self.confident, self.budget[b:b + 1], self.limit[b], self.generated[b],
                                  self.num_drafts[b:b + 1])

    def _step(self, which: int, ids: torch.Tensor, out: torch.Tensor, keep: int = 0) -> None:
        """Every row's ids [B, n] at its own position of model `which` (0 target, 1 draft), the
        logits of its last `keep` rows (0: all) into out [B, keep or n, width]."""
        position = self.positions[which]
        logits = self.models[which].step(rowsets.batch(ids, position), self.caches[which], keep=keep)
        position.add_(ids.shape[1])
        cols = min(logits.shape[-1], self.width)
        out[..., :cols].copy_(logits[..., :cols])


def row_view(cache, b: int):
    """Cache row b as a one-sequence SlotCache sharing its memory (a prefill writes through it)."""
    view = object.__new__(type(cache))
    view.devices = cache.devices
    view.keys = [t[b : b + 1] for t in cache.keys]
    view.values = [t[b : b + 1] for t in cache.values]
    view.copies = {d: c[b : b + 1] for d, c in cache.copies.items()}
    return view
