"""The round over a batch: B rows, each its own sequence, drafted in chains by a drafter part:
the draft model (BatchDraftModel, below), an EAGLE-3 head (core/round/batch_head.py), the host's
prompt lookup (core/round/batch_lookup.py: the host writes each row's drafts; q is one-hot) or
hybrid (core/round/batch_hybrid.py: a model drafts every row, the lookup's drafts replace a row's
where it matched).

The chain round's phases (core/round/round.py), with a batch dimension everywhere:

    count    each row's num_drafts from its budget, limit and tokens so far, before drafting
    draft    the drafter's k steps over every row at once, each row at its own position in its
             own cache row (core/step/rows.batch): the draft model over each row's `pending`
             [B, 2], then k - 1 steps [B, 1]; each row's pick (BatchDraftPick) races its own
             noise row against its own warped q, or takes its argmax (greedy rows, and every row
             under draft_sampling = "argmax"), then each row's count cut at its first step below
             draft_p_min, as the chain round's; prompt lookup: the host's drafts and
             counts, staged before the round, copied into feed and num_drafts
    target   one step over feed [B, k + 1]
    rows     each row's penalty counts and min_tokens mask for the draft steps and the target's
             rows, where the round is built with them (core/round/batch_rows.py)
    verify   the rows' warp in one call (WarpParams per row), then one verification call for every
             row (core/sampling/rejection.py's layout with k draft rows per row: the drafts past a
             row's num_drafts are made to fail, which leaves each row's output what it is alone)
    commit   each row's positions, `pending` and next `last`, in one call (bookkeeping.commit_rows);
             each row's penalty counts take its emitted ids

How a row stays what it is alone: every op is the one-request op over more rows, and each row's
result depends on its own rows only (the step kernels' row invariance, gpu/kernels/linear.py and
attention.py; the references compute row by row). Verification with fewer drafts than k: greedy
and Gumbel verification compare a draft with the target's pick, so a draft past num_drafts is
replaced by -1, which no pick equals; rejection verification accepts a draft only where q(d) > 0,
so the draft's probs past num_drafts are zeroed, and the token after the last counted draft is then
drawn from max(p - 0, 0) = p with the row's Exp(1) row: the bonus token, bit for bit.
Host drafts (prompt lookup) have a one-hot q: its rows are 1 at each counted draft and 0 past a
row's count, which rejection verification reads as the chain round reads host drafts (accept d
where u <= p(d); the residual p with p(d) zeroed), bit for bit.

Each row has its own budget and num_drafts, max_tokens (`limit`), warp settings (penalties and
min_tokens with their own per-row buffers: core/round/batch_rows.py), and seed:
rejection coupling's numbers come from the row's own generator into the row's own buffers,
drawn in the order and shapes the chain round draws them, so a row emits the tokens it emits
alone; Gumbel coupling keys each row's noise by its own seed and positions. A row without a
prompt (finished, or never started) runs with the others (the shapes stay (B, k)) but its
positions and count stay where they were: `active` masks it. k = 0 is target-only decoding in
batches (no draft model, a bonus token per row and round).

Each row's logprobs are computed after the body, from the round's target rows
(`logprob_rows`), only for rounds whose rows ask (core/round/batch_logprobs.py).

The body reads no host value and allocates nothing that outlives it, so a backend may capture it
(gpu/backend.py: one CUDA graph per batch shape, cache generation and the rows' warp flags); the
torch backend runs it as it is. Each model steps over caches of this round's own (B rows, grown
with the longest request) with its runner's batch kernel table (Runner.batch_ops). A row's start
only records its prompt: the next flush (before any round reads the row) prefills every row that
started since together, chunk by chunk as its runner prefills it alone, through the same batch
kernel table, and copies each row's keys and values into its cache row (core/round/batch_prefill.py;
an EAGLE-3 head's rows keep their own prefill, core/round/batch_head.py).
"""

from __future__ import annotations

import contextlib

import torch

from specgen.core.errors import UsageError
from specgen.core.round.batch_logprobs import BatchLogprobs
from specgen.core.round.batch_prefill import BatchPrefill
from specgen.core.round.batch_rows import BatchLogitsRows, BatchMinTokens, BatchPenalties
from specgen.core.round.drafters import draft_spec
from specgen.core.round.row_start import RowStarts, int_bits
from specgen.core.round.rows import Padding
from specgen.core.round.staging import Staging, host_tensor
from specgen.core.sampling import noise
from specgen.core.sampling.bookkeeping import CommitBuffers
from specgen.core.sampling.warp import WarpFlags, WarpParams, exponentials_, logprobs_from_logits, uniforms_
from specgen.core.settings import SamplingSpec
from specgen.core.step import rows as rowsets

FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
          "frequency_penalty")
SLACK = 64  # cache slots past the longest request: where a capture's warm-ups write


class RowParams:
    """WarpParams for `rows_per` logits rows of each of B rows, set row by row on the host. Its
    log(min-p) is a buffer of its own, written with min-p: a captured warp reads it at replay.

    Every field is a view of one packed buffer [8, B * rows_per] (float32; top-k's row holds
    int32 bits, viewed as such): set() records a row's values in the round's start record
    (core/round/row_start.py, field `name`), which writes them with the other rows' and fields'
    at the next flush, then log(min-p) of every row from them on the device; a fill per field was
    ~16 launches per refill, and even one staged copy per row cost 0.19 ms of host time."""

    def __init__(self, batch: int, rows_per: int, device: torch.device, starts, name: str):
        self.rows_per, self.starts, self.name = rows_per, starts, name
        n = batch * rows_per
        self.packed = torch.empty(len(FIELDS) + 1, n, dtype=torch.float32, device=device)
        views = [self.packed[i].view(torch.int32) if name == "top_k" else self.packed[i] for i, name in enumerate(FIELDS)]
        plain = WarpParams.from_spec(SamplingSpec(), n, device)
        for field, view in zip(FIELDS, views):
            view.copy_(getattr(plain, field))
        self.params = WarpParams(*views)
        self.params.__dict__["log_min_p"] = log_min_p = self.packed[len(FIELDS)]
        torch.log(self.params.min_p, out=log_min_p)
        # [B, fields, rows_per]: a row's values, each over its rows
        starts.field(name, self.packed[: len(FIELDS)].view(len(FIELDS), batch, rows_per).permute(1, 0, 2),
                     len(FIELDS))
        starts.after[name] = lambda: torch.log(self.params.min_p, out=self.params.log_min_p)
        self.specs: list[SamplingSpec | None] = [None] * batch
        self._flag()

    @property
    def flags(self) -> WarpFlags:
        return self.params.flags

    def set(self, b: int, spec: SamplingSpec) -> None:
        """Row b's fields, recorded (float32 at the flush: a float rounds to float32 as a fill
        rounds it; top-k as its int32 bits)."""
        self.starts.set(b, self.name, *(int_bits(int(spec.top_k)) if name == "top_k" else float(getattr(spec, name))
                                         for name in FIELDS))
        self.specs[b] = spec
        self._flag()

    def _flag(self) -> None:
        """The flags of every row that took a prompt (a finished row's stay: at worst a filter runs
        as a no-op for it)."""
        live = [s for s in self.specs if s is not None]
        self.params.__dict__["flags"] = WarpFlags(all(s.greedy for s in live), any(s.top_k > 0 for s in live),
                                                  any(s.top_p < 1 for s in live), any(s.min_p > 0 for s in live))


class BatchCoupling:
    """Both couplings' buffers per row. noise [B, k + 1, V]: the draft's race rows 0 .. k - 1 and
    the target's row k (rejection: Exp(1) from the row's generator; Gumbel: from the row's key and
    positions); uniform [B, k]; q [B, k, V] the draft's probs per step (rejection coupling; zero
    past each row's num_drafts). expo [B, V] and q_step [B, V]: one step's noise rows and probs,
    contiguous, as the warp takes them."""

    def __init__(self, rnd, gumbel: bool):
        b, k, width, z = rnd.batch, rnd.k, rnd.width, dict(device=rnd.device)
        self.rnd, self.gumbel = rnd, gumbel
        self.noise = torch.ones(b, k + 1, width, dtype=torch.float32, **z)
        # never an empty allocation (k = 0): the kernels take its address
        self.uniform = torch.ones(b * k + 1, dtype=torch.float32, **z)[: b * k].view(b, k)
        self.q = None if gumbel else torch.zeros(b, k, width, dtype=torch.float32, **z)
        self.q_step = torch.zeros(b, width, dtype=torch.float32, **z)
        self.expo = torch.ones(b, width, dtype=torch.float32, **z)
        self.key = torch.zeros(b, 2, dtype=torch.long, **z)
        self.origin = torch.zeros(b, dtype=torch.long, **z)
        rnd.starts.field("key", self.key, 2)
        rnd.starts.field("origin", self.origin)
        self.first = torch.zeros(b, dtype=torch.long, **z)
        self.choice = torch.zeros(b * (k + 1), dtype=torch.long, **z)

    def state(self) -> list[torch.Tensor]:
        """The host's draws for the next round (a capture's warm-ups must not lose them)."""
        return [self.noise, self.uniform]

    def start(self, b: int, seed: int, origin: int) -> None:
        self.rnd.starts.set(b, "key", *noise.split_seed(seed))
        self.rnd.starts.set(b, "origin", origin)

    def draw(self, b: int, generator: torch.Generator, sampled: bool) -> None:
        """Row b's numbers for the next round, as the chain round draws them (rejection coupling,
        sampled rows: where a model draws its drafts every draft step races, so all k + 1 noise
        rows; where the host drafts or the draft takes its argmax none does, so the target's row k
        alone; then the uniforms)."""
        if self.gumbel or not sampled:
            return
        races = not self.rnd.one_hot and self.rnd.draft_pick.races
        exponentials_(self.noise[b] if races else self.noise[b, self.rnd.k:], generator)
        uniforms_(self.uniform[b], generator)

    def begin(self) -> None:
        if not self.gumbel:
            return
        torch.add(self.origin, self.rnd.generated, out=self.first)
        self.rnd.ops.gumbel_noise_rows(self.noise, self.key, self.first)

    def verify(self) -> None:
        """Every row's output row from the target's logits, in one warp and one verification."""
        rnd, k, width = self.rnd, self.rnd.k, self.rnd.width
        ops, logits, params = rnd.ops, rnd.target_logits.view(-1, width), rnd.target_params.params
        penalties, bad = rnd.rows.target_rows(rnd.feed[:, 1:])  # before counted_drafts overwrites drafts
        if self.gumbel:
            ops.warp_and_race(logits, params, self.noise.view(-1, width), self.choice, penalties, bad)
            out = ops.verify_greedy(rnd.counted_drafts(), rnd.cu, self.choice, k)
        else:
            argmax, probs = ops.warp(logits, params, penalties, bad)
            if probs is None:
                out = ops.verify_greedy(rnd.counted_drafts(), rnd.cu, argmax, k)
            else:
                rnd.drafts.copy_(rnd.feed[:, 1:])
                if rnd.one_hot:
                    self.one_hot()
                self.expo.copy_(self.noise[:, k])
                out = ops.verify_random(rnd.drafts.view(-1), rnd.cu, self.q.view(-1, width) if k else None, probs,
                                        self.uniform.reshape(-1), self.expo, k)
        rnd.out.copy_(out)

    def one_hot(self, rows: torch.Tensor | None = None) -> None:
        """q of host drafts: 1 at each row's counted drafts, 0 elsewhere (past a row's count: all 0,
        as the draft model's q there). Rejection verification then accepts draft d where u <= p(d),
        and its residual is p with p(d) zeroed: the chain round's one-hot verification, bit for bit.
        rows: [B] bool, the rows whose drafts the host wrote (the others keep the model's q; None:
        every row's)."""
        rnd = self.rnd
        counted = (rnd.steps < rnd.num_drafts[:, None]).float()[:, :, None]  # [B, k, 1]
        drafts = rnd.feed[:, 1:, None]
        if rows is None:
            self.q.zero_()
            self.q.scatter_(2, drafts, counted)
            return
        hosted = rows[:, None, None]
        kept = self.q.gather(2, drafts)  # a model row's own q at its draft: written back as it is
        self.q.masked_fill_(hosted, 0.0)
        self.q.scatter_(2, drafts, torch.where(hosted, counted, kept))


class BatchDraftPick:
    """Draft step i's ids for every row into feed[:, i + 1] (core/round/drafters.py's DraftPick with
    a batch dimension): each sampled row's race of its noise row i against its warped q, or, where
    the draft takes its argmax (greedy rows; every row under draft_sampling = "argmax": `races`
    False), the argmax of the warped logits (of the logits as they are where no row's are
    penalised or masked). p_min (draft_p_min): each row's step is sure where its q's largest
    probability reaches it, and count() cuts each row's num_drafts at its first unsure step.

    q, as a row's alone: the probs it raced (rejection coupling keeps them, zero past the row's
    count); argmax drafts' q is one-hot at each counted draft (count(): as the chain round's
    argmax drafts, verified as host drafts are). A step's confidence reads what the chain round's
    reads: a racing row's probs, any other row's log-probs of its warped logits, exponentiated."""

    def __init__(self, rnd: "BatchRound", races: bool, p_min: float):
        self.rnd, self.races, self.p_min = rnd, races, p_min

    def __call__(self, i: int) -> None:
        rnd, coupling = self.rnd, self.rnd.coupling
        params = rnd.draft_params.params
        penalties, bad = rnd.rows.draft_row(i)
        probs = None
        if (params.flags.all_greedy or not self.races) and rnd.rows.plain:
            rnd.ops.argmax(rnd.draft_logits, rnd.pick)
        elif params.flags.all_greedy or not self.races:
            rnd.pick.copy_(rnd.ops.warp(rnd.draft_logits, params, penalties, bad)[0])
        else:
            coupling.expo.copy_(coupling.noise[:, i])
            rnd.ops.warp_and_race(rnd.draft_logits, params, coupling.expo, rnd.pick, penalties, bad,
                                  probs_out=coupling.q_step)
            probs = coupling.q_step
            if coupling.q is not None and self.p_min > 0:  # count() zeroes what its cut leaves out
                coupling.q[:, i].copy_(probs)
            elif coupling.q is not None:  # past a row's num_drafts: zero (see the module's docstring)
                torch.mul(probs, (i < rnd.num_drafts)[:, None], out=coupling.q[:, i])
        if self.p_min > 0:
            q = logprobs_from_logits(rnd.draft_logits, params, penalties, bad).exp()
            if probs is not None:  # the rows that raced: their probs (greedy rows take their argmax)
                q = torch.where((params.temperature > 0)[:, None], probs, q)
            torch.ge(q.max(dim=-1).values, self.p_min, out=rnd.confident[:, i])
        rnd.feed[:, i + 1].copy_(rnd.pick)
        rnd.rows.picked(rnd.pick)

    def count(self) -> None:
        """After a model's k steps, before anything replaces its drafts (hybrid's lookup rows): each
        row's count cut at its first unsure step (p_min), and the q that verification reads. (The
        body's count before drafting read the last round's flags: its num_drafts is replaced here,
        and no pick zeroed q by it.)"""
        rnd, q = self.rnd, self.rnd.coupling.q
        if self.p_min > 0:
            rnd.ops.count_drafts_rows(rnd.confident, rnd.budget, rnd.limit, rnd.generated, rnd.num_drafts)
            if q is not None and self.races:  # past a row's count: zero
                q.mul_((rnd.steps < rnd.num_drafts[:, None])[:, :, None])
        # an all-greedy batch verifies greedily (its flags are the captured body's): no q to write
        if q is not None and not self.races and not rnd.target_params.flags.all_greedy:
            rnd.coupling.one_hot()


class BatchDraftModel:
    """The draft model drafting every row: it steps over each row's `pending` [B, 2] (its committed
    sequence's last two ids; its cache row holds the rest), then k - 1 steps [B, 1] on the ids
    picked before, each row in the round's draft cache row (model 1 of the round's runners)."""

    one_hot = False  # its drafts race q on the device
    host_proposes = False  # nothing from the host before a round: rounds may queue behind each other

    def __init__(self, rnd: "BatchRound", runner):
        self.rnd = rnd
        self.runners = [runner]
        self.pending = torch.zeros(rnd.batch, 2, dtype=torch.long, device=rnd.device)  # committed[-2:]
        # follow_host's step: [committed[-2], feed] per row, where it starts, its rows' positions
        self.follow_ids = torch.zeros(rnd.batch, rnd.k + 2, dtype=torch.long, device=rnd.device)
        self.follow_start = torch.zeros(rnd.batch, dtype=torch.long, device=rnd.device)
        self.follow_positions = torch.zeros(rnd.batch * (rnd.k + 2), dtype=torch.long, device=rnd.device)
        rnd.starts.field("pending", self.pending, 2)

    def start(self, b: int, ids: list[int]) -> None:
        """Both caches' row b (the target: all but the last id; the draft: all but the last two, a
        one-token prompt seen twice)."""
        self.rnd._prefill(0, b, ids[:-1])
        self.rnd._prefill(1, b, ids[:-2])
        self.rnd.starts.set(b, "pending", *(ids * 2)[-2:])

    def room(self, slots: int, capacity: int) -> None:
        """Its cache is one of the round's (grown with the target's)."""

    def draft(self) -> None:
        rnd, ids = self.rnd, self.pending
        for i in range(rnd.k):
            rnd._step(1, ids, rnd.draft_logits[:, None], keep=1)
            rnd.draft_pick(i)
            ids = rnd.feed[:, i + 1: i + 2]
        rnd.draft_pick.count()

    def follow_host(self, rows: torch.Tensor) -> None:
        """After draft(), where the host's drafts replaced the model's (rows [B] bool: the hybrid
        proposer's rows whose lookup matched, core/round/batch_hybrid.py): the draft steps over
        [committed[-2], feed] ([B, k + 2]) from its position before the round, as the chain round's
        host round steps (DraftModel.follow), so that those rows' caches hold the host's tokens,
        computed as alone, not the drafts it stepped. The other rows step at the scratch end of
        the cache (past every row's reach and SLACK: nothing reads it), keeping what they drafted.
        The position stays where draft() left it, k + 1 past the round's start: the commit moves
        it back by k + 1 - emitted, to where a host round's k + 2 - emitted from k + 2 past it
        leaves it."""
        rnd, k = self.rnd, self.rnd.k
        self.follow_ids[:, :1].copy_(self.pending[:, :1])
        self.follow_ids[:, 1:].copy_(rnd.feed)
        torch.sub(rnd.positions[1], k + 1, out=self.follow_start)
        self.follow_start.masked_fill_(rows.logical_not(), rnd.capacity - (k + 2))
        step = rowsets.batch(self.follow_ids, self.follow_start, self.follow_positions)
        rnd.models[1].step(step, rnd.caches[1], rnd.step_ops[1], 1)  # its logits: nobody's

    def reading(self):
        """What it reads of the target's step: nothing."""
        return contextlib.nullcontext()

    def commit_fields(self) -> dict:
        return dict(draft_position=self.rnd.positions[1], pending=self.pending)

    def state(self) -> list[torch.Tensor]:
        return [self.pending]

    def close(self) -> None:
        pass


class BatchRound:
    """B rows of chain speculation (k = 0: the target alone). target: the runner of specgen's own
    target model; drafter(round): the part that drafts every row (BatchDraftModel,
    core/round/batch_head.BatchHead, core/round/batch_lookup.BatchLookup or
    core/round/batch_hybrid.BatchHybrid), None when k = 0; rows: the logits-row parts it is built
    with ("penalties", "min_tokens": core/round/batch_rows.py), eos_ids the model's (min_tokens
    masks them with a row's stop ids unless it ignores eos); races: a sampled row's draft draws
    from q (False: speculation.draft_sampling = "argmax"), p_min: proposer.draft_p_min
    (BatchDraftPick). Each row's keys and values live in
    this round's caches' row b (a drafter's runners' too)."""

    def __init__(self, k: int, batch: int, width: int, vocab_size: int, gumbel: bool, backend, target,
                 drafter=None, rows: tuple[str, ...] = (), eos_ids=(), races: bool = True, p_min: float = 0.0):
        from specgen.core.step.model import OwnedModel

        self.k, self.batch, self.width, self.backend = k, batch, width, backend
        self.target = target
        self.device = device = target.device
        z = dict(device=device)
        self.capacity = 0
        self.generation = 0  # bumped when the caches are re-allocated (a capture must be made anew)
        self.feed = torch.zeros(batch, k + 1, dtype=torch.long, **z)  # [B, k+1] last, d0 .. d(k-1)
        self.drafts = torch.zeros(batch * k + 1, dtype=torch.long, **z)[: batch * k].view(batch, k)  # verify's
        self.pick = torch.zeros(batch, dtype=torch.long, **z)  # a draft step's ids
        self.cu = (torch.arange(1, batch + 1, **z) * k).int()  # k draft rows per row (rejection.py's layout)
        self.steps = torch.arange(k, **z)
        self.no_draft = torch.full((), -1, dtype=torch.long, **z)  # what replaces a draft that does not count
        self.out = torch.zeros(batch, k + 1, dtype=torch.long, **z)
        self.step_positions = torch.zeros(batch * (k + 1), dtype=torch.long, **z)  # a step's rows' (the inputs op's)
        self.budget = torch.zeros(batch, dtype=torch.int32, **z)
        self.num_drafts = torch.zeros(batch, dtype=torch.int32, **z)
        self.generated = torch.zeros(batch, dtype=torch.long, **z)
        self.emitted = torch.zeros(batch, dtype=torch.long, **z)
        self.limit = torch.zeros(batch, dtype=torch.long, **z)
        self.active = torch.zeros(batch, dtype=torch.bool, **z)
        self.confident = torch.ones(batch, k, dtype=torch.bool, **z)  # each row's draft steps: sure (p_min)
        self.target_logits = torch.full((batch, k + 1, width), float("-inf"), dtype=torch.float32, **z)
        self.draft_logits = torch.full((batch, width), float("-inf"), dtype=torch.float32, **z)
        self.stage_ids = torch.zeros(batch, self.stage_columns, dtype=torch.long, **z)  # per row: out | drafts | n
        self.staging = Staging(device)  # a refill's host values (ids, warp params), copied without a stall
        # a start's or stop's per-row values, written for every row at once before the next round
        self.starts = RowStarts(batch, device, self.staging, backend)
        self.prefill = BatchPrefill(self)  # the prompts of rows started since the last flush, stepped together
        for name, buffer in (("last", self.feed[:, 0]), ("budget", self.budget), ("generated", self.generated),
                             ("limit", self.limit), ("active", self.active)):
            self.starts.field(name, buffer)
        self.target_params = RowParams(batch, k + 1, device, self.starts, "target_warp")
        self.draft_params = RowParams(batch, 1, device, self.starts, "draft_warp")
        self.bad = Padding(width, vocab_size, device).padding
        self.rows = self._rows(rows, vocab_size, eos_ids)
        self.coupling = self._coupling(gumbel)
        self.draft_pick = BatchDraftPick(self, races, p_min)
        self.logprobs = BatchLogprobs(self)  # each row's, staged after a round whose rows ask (the loop's)
        self.drafter = drafter(self) if drafter is not None and k else None
        self.runners = [target, *(self.drafter.runners if self.drafter is not None else [])]
        if not all(isinstance(r.model, OwnedModel) for r in self.runners):
            raise UsageError("batches need specgen's own model step, and this pair runs on transformers",
                             hint="set batch_size = 1 (--batch-size 1), or use checkpoints specgen's step covers")
        self.models = [r.model for r in self.runners]
        self.caches: list = [None] * len(self.runners)
        self.step_ops: list = [None] * len(self.runners)  # each model's batch kernel table (Runner.batch_ops)
        self.positions = torch.zeros(len(self.runners), batch, dtype=torch.long, **z)  # target, draft model
        for which in range(len(self.runners)):
            self.starts.field(f"position{which}", self.positions[which])
        self.held = torch.zeros(len(self.runners) + 1, batch, dtype=torch.long, **z)  # positions, generated
        self._room(1)

    def _rows(self, rows: tuple[str, ...], vocab_size: int, eos_ids) -> BatchLogitsRows:
        """The logits-row parts (core/round/batch_rows.py) named in rows ("penalties",
        "min_tokens"); eos_ids: the model's, which min_tokens masks with a row's stop ids."""
        per = self.target_rows_per
        penalties = BatchPenalties(self.batch, per, self.width, self.device, self.staging) \
            if "penalties" in rows else None
        min_tokens = BatchMinTokens(self.batch, per, self.width, vocab_size, eos_ids, self.generated,
                                    self.staging) if "min_tokens" in rows else None
        return BatchLogitsRows(penalties, min_tokens, self.bad)

    def _coupling(self, gumbel: bool):
        """The coupling part (a tree batch's are its own: core/round/batch_tree.py)."""
        return BatchCoupling(self, gumbel)

    @property
    def ops(self):
        return self.backend.ops

    @property
    def reach(self) -> int:
        """Slots past a row's position that one round may write."""
        return self.k + 3

    @property
    def target_rows_per(self) -> int:
        """Each row's rows in the round's target step (a head's tap holds B of them)."""
        return self.k + 1

    @property
    def stage_columns(self) -> int:
        """Each row's staged ids, the host's one copy: out (k + 1) | drafts (k) | n."""
        return 2 * self.k + 2

    @property
    def host_drafts(self) -> bool:
        """Whether the host proposes drafts before each round (prompt lookup, hybrid: the next
        round's drafts depend on this round's tokens, so the batch loop keeps one round in flight)."""
        return self.drafter is not None and self.drafter.host_proposes

    @property
    def one_hot(self) -> bool:
        """Whether every row's drafts are the host's (prompt lookup): q is one-hot and no draft step
        races (a row draws only the target's noise row)."""
        return self.drafter is not None and self.drafter.one_hot

    def shape_key(self) -> tuple:
        """What a captured body depends on besides the buffers: the caches and the warp flags."""
        return self.generation, self.target_params.flags, self.draft_params.flags

    def state(self) -> list[torch.Tensor]:
        """The buffers the next round reads that a round writes (a capture's warm-up restores them)."""
        drafter = self.drafter.state() if self.drafter is not None else []
        return [self.positions, self.feed, self.generated, self.emitted, *drafter, *self.coupling.state(),
                *self.rows.state()]

    def scratch(self) -> None:
        """Every row at the scratch end of its caches (where a capture's warm-up may write)."""
        self.positions.fill_(self.capacity - self.reach)

    # -- host side, between rounds ----------------------------------------------------------------

    def start(self, b: int, prompt_ids: list[int], spec: SamplingSpec, seed: int, cut: bool = True) -> None:
        """Row b takes a prompt: its caches' row b prefilled at the next flush (the target's with all
        but the last id; the drafter prefills the target with its own), its settings and its seed.
        cut: the draft's q keeps the request's top-k / top-p / min-p (core/engine.draft_picking)."""
        ids = list(prompt_ids)
        self._room(len(ids) + spec.max_tokens + self.reach)
        if self.drafter is not None:
            self.drafter.start(b, ids)
        else:
            self._prefill(0, b, ids[:-1])
        starts = self.starts  # written at the next flush, with every other row's
        starts.set(b, "last", ids[-1])
        starts.set(b, "budget", self.k)  # the device caps it at max_tokens (count_drafts_rows: limit)
        starts.set(b, "generated", 0)
        starts.set(b, "limit", spec.max_tokens - 1)
        self.target_params.set(b, spec)
        self.draft_params.set(b, draft_spec(spec, cut))
        self.rows.start(b, ids, spec)
        self.coupling.start(b, seed, len(ids))
        starts.set(b, "active", True)

    def stop(self, b: int) -> None:
        """Row b has no prompt: it runs on, masked, until start() gives it one."""
        self.starts.set(b, "active", False)
        self.starts.set(b, "budget", 0)

    def flush(self) -> None:
        """The rows' pending prefills (core/round/batch_prefill.py), then their recorded start and
        stop values onto the device (core/round/row_start.py): before a round (the programs call
        it) and before the host sets budgets."""
        self.prefill.run()
        self.starts.flush()

    def set_budgets(self, budgets: list[int]) -> None:
        """Every row's draft budget for the next round, in one copy (a fill per row would be a
        launch per row and round). Adaptive k and host drafts need it: start() sets k, which the
        device caps at each row's max_tokens, the budget the host would set. Where the host drafts,
        its drafter writes each row's drafts up to its budget, and their counts, in that one copy."""
        self.flush()  # a row's start sets its budget to k: the host's come after
        if self.host_drafts:
            self.drafter.propose(budgets)
        else:
            self.budget.copy_(self.staging.put(host_tensor(budgets, torch.int32)))

    def follow(self, b: int, committed: list[int]) -> None:
        """Row b's tokens of a round it goes on after, for a drafter that drafts on the host."""
        if self.host_drafts:
            self.drafter.follow(b, committed)

    def draw(self, b: int, generator: torch.Generator) -> None:
        self.coupling.draw(b, generator, not self.target_params.specs[b].greedy)

    def reserve(self, slots: int) -> None:
        """Caches with room for `slots` positions per row before the run (a prompt's length,
        max_tokens and the round's reach), so that they are not grown, nor a capture made anew,
        while it runs: batch_size auto sized the batch for them."""
        self._room(slots)

    def _room(self, slots: int) -> None:
        """Caches of B rows with room for `slots` positions (and SLACK); grown by doubling, the
        rows keeping their keys and values. Each runner reserves as much: a prompt past a group's
        length (core/round/batch_prefill.py) or a head's row is prefilled there first."""
        if slots + SLACK <= self.capacity:
            return
        for runner in self.runners:
            runner.reserve(slots)
        self.capacity = capacity = max(2 * self.capacity, slots + SLACK)
        for i, (model, runner) in enumerate(zip(self.models, self.runners)):
            cache = self.caches[i]
            self.caches[i] = model.new_cache(self.batch, capacity) if cache is None else cache.grown(capacity)
            self.step_ops[i] = runner.batch_ops(capacity)
        if self.drafter is not None:
            self.drafter.room(slots, capacity)
        self.generation += 1

    def close(self) -> None:
        """Let go of what it holds on the models (a head's tap on the target's layers)."""
        if self.drafter is not None:
            self.drafter.close()

    def _prefill(self, which: int, b: int, ids: list[int]) -> None:
        """Row b's prefix for model `which` (0 target, 1 draft model): its position recorded, its
        prefill pending until the next flush, which steps it with every other row's that started
        since (core/round/batch_prefill.py), each row as its runner prefills it alone."""
        self.starts.set(b, f"position{which}", len(ids))
        self.prefill.add(which, b, ids)  # an empty prefix too: it replaces one pending for the row

    def adopt(self, which: int, b: int, n: int, source=None, row: int = 0) -> None:
        """The first n slots of row `row` of `source` (a SlotCache of model `which`; None: its
        runner's, where it prefilled alone) into row b of the round's cache."""
        cache = self.caches[which]
        source = self.runners[which].cache if source is None else source
        # one copy a device over its planes [2, L, B, g, S, d] (every layer's keys and values): a
        # copy per layer table is 2 L launches a refill, queued between rounds while rows wait
        for device, planes in cache.planes.items():
            planes[:, :, b, :, :n].copy_(source.planes[device][:, :, row, :, :n])
        for device, positions in cache.copies.items():
            positions[b, :n].copy_(source.copies[device][row, :n])

    # -- the device program -----------------------------------------------------------------------

    def body(self) -> None:
        """One round for every row, no host sync."""
        drafter = self.drafter
        self.held[:-1].copy_(self.positions)
        self.held[-1].copy_(self.generated)
        if drafter is not None:
            self.ops.count_drafts_rows(self.confident, self.budget, self.limit, self.generated, self.num_drafts)
        else:
            self.num_drafts.zero_()
        self.coupling.begin()
        self.rows.begin()
        if drafter is not None:
            drafter.draft()
        with drafter.reading() if drafter is not None else contextlib.nullcontext():
            self._step(0, self.feed, self.target_logits)
        self.coupling.verify()
        self.ops.commit_rows(CommitBuffers(
            row=self.out, feed=self.feed, num_drafts=self.num_drafts, stage=self.stage_ids,
            target_position=self.positions[0], emitted=self.emitted, generated=self.generated,
            ran=self.k + 1, **(drafter.commit_fields() if drafter is not None else {})))
        self.rows.commit(self.out, self.active)
        # in place (an elementwise op may write its own input): no temporary, one launch each
        torch.where(self.active, self.positions, self.held[:-1], out=self.positions)
        torch.where(self.active, self.generated, self.held[-1], out=self.generated)

    def logprob_rows(self) -> tuple:
        """The last round's target rows in emitted order, [B (k + 1), width], and what the
        verification warped them with (params, penalties, bad mask): what each row's logprobs read
        (core/round/batch_logprobs.py), as the single round's `rows.last`."""
        return self.target_logits.view(-1, self.width), self.target_params.params, *self.rows.last

    def read_tree(self, staged: list[int]) -> tuple[bool, list[int] | None]:
        """(whether the row's last token out is a draft accepted, the accepted nodes' ranks) from its
        staged ids: a chain's last token is never a draft, and it has no ranks."""
        return False, None

    def read_source(self, b: int, ranks: list[int] | None, accepted: int) -> tuple[str, int] | None:
        """Whose nodes row b's accepted path took, where a model drafts trees beside a lookup (the
        hybrid proposer's trees); None otherwise."""
        return None

    def counted_drafts(self) -> torch.Tensor:
        """The drafts [B * k] with those past each row's num_drafts replaced by -1 (no target pick
        equals it: greedy and Gumbel verification reject it, as if the row had drafted fewer)."""
        torch.where(self.steps < self.num_drafts[:, None], self.feed[:, 1:], self.no_draft, out=self.drafts)
        return self.drafts.view(-1)

    def _step(self, which: int, ids: torch.Tensor, out: torch.Tensor, keep: int = 0) -> None:
        """Every row's ids [B, n] at its own position of model `which` (0 target, 1 draft model), the
        logits of its last `keep` rows (0: all) into out [B, keep or n, width]."""
        position = self.positions[which]
        rows = rowsets.batch(ids, position, self.step_positions)  # the positions: the inputs op's to write
        logits = self.models[which].step(rows, self.caches[which], self.step_ops[which], keep)
        position.add_(ids.shape[1])
        cols = min(logits.shape[-1], self.width)
        out[..., :cols].copy_(logits[..., :cols])
