"""The speculation round, written once: the device program every backend runs or captures.

One round, from static buffers sized once for k:

    draft    MODEL rounds: the draft steps over `pending` (the committed sequence's last two ids),
             then k - 1 single steps; each id is picked on the device straight into `feed`.
             With a head on the target's hidden states instead (core/heads.py): it extends over
             the previous round's target rows, then k - 1 steps on its own hidden states.
             HOST rounds: the host wrote the drafts (n-gram lookup) into `feed`; a draft model, if
             there is one, steps once over [committed[-2], feed] so its cache keeps following (a
             head extends over the previous round's rows, as in MODEL rounds).
    target   one forward over feed = [last, d0 .. d(k-1)]  ->  k + 1 rows of logits
    warp     p for those rows (penalties and min_tokens masks built on the device)
    verify   accepted prefix, then the recovered or bonus token (greedy or rejection sampling)
    stage    everything the host reads, gathered into two buffers: one copy per dtype
    commit   both caches roll back by moving their position; the next round's `last` and
             `pending` are written from this round's output

The draft cache always holds the committed sequence minus its last two ids, the target cache all
but the last: with m tokens emitted, both positions move back by the rows they ran beyond that.
Rounds that draft fewer than k (the last ones, adaptive k, host proposals, an unsure draft) run
the same shapes; the verifier reads how many drafts count from `num_drafts`, and rows past them
are overwritten by the next round.

Randomness, rejection coupling: drawn by the host into `uniform` and `noise` before the round (in
the same order and shapes every round, so a seed reproduces the text on every backend). Gumbel
coupling: the body computes `noise` row i from (seed, the position of row i, token id) on the
device (core/noise.py); the draft races q̃ against row i, the target picks x_i = argmax p̃_i / E_i,
and verification is greedy against x: the text does not depend on k or the proposer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Callable

import torch

from specgen.core import noise
from specgen.core.bookkeeping import CommitBuffers
from specgen.core.heads import prefill_head
from specgen.core.sampling import PenaltyRows, WarpParams, exponentials_, logprobs_from_logits, uniforms_
from specgen.core.settings import SamplingSpec


def draft_spec(spec: SamplingSpec, cut: bool) -> SamplingSpec:
    """What the draft warps its logits with: the request's own settings (cut), or its temperature and
    penalties without top-k / top-p / min-p (speculation.draft_sampling = "temperature": a cheaper
    pick, q wider than p). Any q keeps the output lossless, as long as the draft samples from it."""
    return spec if cut else replace(spec, top_k=-1, top_p=1.0, min_p=0.0)


class Mode(enum.Enum):
    MODEL = "model"  # the draft model drafts on the device
    HOST = "host"  # the host wrote the drafts (n-gram); q is one-hot


@dataclass(frozen=True)
class RoundShape:
    """What fixes a round's program: captured once per shape and reused by every request."""

    k: int
    width: int  # logits columns
    vocab_size: int  # ids with a token behind them (< width: padding columns are masked)
    has_draft: bool  # a draft model runs (MODEL rounds, and follows HOST rounds)
    sample_draft: bool  # the draft draws from q (else its argmax, q one-hot)
    cut: bool  # q carries the request's top-k / top-p / min-p
    penalties: bool  # repetition / presence / frequency penalties: rows built from counts
    min_tokens: bool  # stop ids masked while fewer than min_tokens exist
    p_min: float  # drafting stops at the first step whose confidence is below this (0 = off)
    insight: bool  # stage p(x), q(x) and the entropy of p for every drafted token
    gumbel: bool = False  # sampled, with Gumbel coupling (noise per position; greedy verification)
    head: str = ""  # "eagle" / "mtp": a head on the target's hidden states drafts (core/heads.py)


class Round:
    """Static buffers and the round's body. `body(mode, mark)` is the algorithm; a backend runs it
    eagerly or replays its captured form (see core/backend.py)."""

    def __init__(self, shape: RoundShape, spec: SamplingSpec, backend, target, draft, stop_ids: list[int],
                 head=None):
        self.shape, self.backend, self.target, self.draft = shape, backend, target, draft
        self.head = head if shape.head else None  # a HeadDrafter (core/heads.py)
        k, width, device = shape.k, shape.width, target.device
        self.device = device
        self.greedy = spec.greedy
        z = dict(device=device)
        self.feed = torch.zeros(1, k + 1, dtype=torch.long, **z)  # [B, k+1] last, d0 .. d(k-1)
        self.drafts = self.feed[0, 1:]  # [k]
        self.pending = torch.zeros(1, 2, dtype=torch.long, **z)  # [B, 2] committed[-2:]
        self.follow = torch.zeros(k + 2, dtype=torch.long, **z)  # committed[-2], last, drafts
        self.budget = torch.zeros(1, dtype=torch.int32, **z)  # [B] drafts the host allows
        self.num_drafts = torch.zeros(1, dtype=torch.int32, **z)  # [B] drafts that count (cu, B = 1)
        self.generated = torch.zeros((), dtype=torch.long, **z)  # tokens emitted so far
        # the request's max_tokens - 1: drafts stop counting where they would pass max_tokens (the
        # round's last token is the target's), on the device, so that a round can be queued before
        # the host has read how many tokens the one before emitted
        self.limit = torch.full((), 1 << 62, dtype=torch.long, **z)
        self.params = WarpParams.from_spec(spec, k + 1, device)
        self.draft_params = WarpParams.from_spec(draft_spec(spec, shape.cut), 1, device)
        self.padding = None
        if shape.vocab_size < width:  # logits columns with no token behind them can never be produced
            self.padding = torch.zeros(width, dtype=torch.bool, **z)
            self.padding[shape.vocab_size:] = True
        self.stop_cols = torch.zeros(width, dtype=torch.bool, **z)
        self.stop_cols[[i for i in stop_ids if i < width]] = True
        self.min_tokens = spec.min_tokens
        self.steps = torch.arange(k + 1, **z)
        self.counts = torch.zeros(width, dtype=torch.int32, **z)  # output counts (penalties)
        self.seen = torch.zeros(width, dtype=torch.bool, **z)  # prompt or output ids (penalties)
        self.draft_counts = torch.zeros_like(self.counts)
        self.ones = torch.ones(k, dtype=torch.int32, **z)
        self.target_logits = torch.full((k + 1, width), float("-inf"), dtype=torch.float32, **z)
        self.draft_logits = {n: torch.full((n, width), float("-inf"), dtype=torch.float32, **z)
                             for n in (1, 2, k + 2)} if shape.has_draft else {}
        sampled, gumbel = not self.greedy, shape.gumbel
        self.draft_races = shape.sample_draft and sampled  # draft picks race q against a noise row
        draft_rows = k if self.draft_races else 0
        # Rejection: Exp(1) rows, one per sampled draft step then the target's recovery row, and
        # the uniforms, one buffer each (draw()). Gumbel: one row per position of the round.
        rows = k + 1 if gumbel else draft_rows + 1
        self.noise = torch.ones(rows, width, dtype=torch.float32, **z) if sampled else None
        self.uniform = torch.ones(k, dtype=torch.float32, **z) if sampled and not gumbel else None
        self.q = torch.zeros(k, width, dtype=torch.float32, **z) if draft_rows and not gumbel else None
        self.key = torch.zeros(2, dtype=torch.long, **z)  # the seed as Philox's key words (Gumbel)
        self.origin = torch.zeros((), dtype=torch.long, **z)  # the prompt's length: position of token 0
        self.first = torch.zeros((), dtype=torch.long, **z)  # position of this round's row 0
        self.choice = torch.zeros(k + 1, dtype=torch.long, **z)  # Gumbel: the target's x per row
        self.q_token = torch.zeros(k, dtype=torch.float32, **z)  # q(d_i) (sampled or insight)
        self.confident = torch.ones(k, dtype=torch.bool, **z)  # per step: confidence >= p_min
        self.rows: tuple = ()  # the target rows' (params, penalties, bad_mask) of the last round
        # ... in buffers of their own, so that rows reads the last round whichever capture ran it
        self.row_counts = torch.zeros(k + 1, width, dtype=torch.int32, **z) if shape.penalties else None
        self.row_seen = torch.zeros(k + 1, width, dtype=torch.bool, **z) if shape.penalties else None
        self.row_bad = torch.zeros(k + 1, width, dtype=torch.bool, **z) if shape.min_tokens else None
        floats = 3 * k if shape.insight else (2 * k if sampled and not gumbel else 0)
        self.stage_ids = torch.zeros(2 * k + 2, dtype=torch.long, **z)  # [out (k+1) | drafts (k) | n]
        self.stage_f = torch.zeros(max(floats, 1), dtype=torch.float32, **z)  # [p(d) | q(d) | H(p)]
        self.out = torch.zeros(1, k + 1, dtype=torch.long, **z)
        self.emitted = torch.ones((), dtype=torch.long, **z)  # tokens the last round emitted (a head's extend)

    # -- host side, before a round ----------------------------------------------------------------

    @property
    def runners(self) -> list:
        """What holds a cache: the target, the draft model, the head (each with a position, a
        capacity, a generation and use_graphs, which capture reads)."""
        return [r for r in (self.target, self.draft, self.head) if r is not None]

    @property
    def floats(self) -> bool:
        """Whether the round stages float results (p(d), q(d), entropy) for the host."""
        return self.shape.k > 0 and (self.shape.insight or not (self.greedy or self.shape.gumbel))

    @property
    def has_p(self) -> bool:
        return self.floats

    def has_q(self, mode: Mode) -> bool:
        """q(d_i) is staged: drafts drawn from q, or insight (q of argmax drafts); n-gram q is one-hot."""
        return self.floats and mode is Mode.MODEL and (self.shape.insight or self.q is not None)

    def state(self) -> list[torch.Tensor]:
        """The buffers a round reads and writes that outlive it (a capture's warm-up restores them)."""
        kept = [self.out, self.emitted, self.head.tap.out] if self.head is not None else []
        return [self.feed, self.pending, self.budget, self.num_drafts, self.generated, self.counts, self.seen,
                self.draft_counts, self.confident, self.limit, *kept]

    def reserve(self, positions: int) -> None:
        """Room in both caches for a request that may reach `positions`."""
        for runner in self.runners:
            runner.reserve(positions)

    def start(self, prompt_ids: list[int], seed: int = 0, max_tokens: int | None = None) -> None:
        """Prefill both caches (target: all but the last id; draft: all but the last two) and set the
        first round's inputs. A one-token prompt: the draft sees that id twice (its cache needs two
        committed ids to start from); only its first guesses can change, never the output.
        seed: Gumbel coupling's key (rejection coupling draws from the caller's generator);
        max_tokens: no round counts drafts past it (None: no limit but the host's budget)."""
        ids = list(prompt_ids)
        self.limit.fill_(1 << 62 if max_tokens is None else max_tokens - 1)
        self.key.copy_(torch.tensor(noise.split_seed(seed)))
        self.origin.fill_(len(ids))
        self.target.reset()
        if self.head is not None:
            self._prefill_head(ids)
        else:
            self.target.forward(torch.tensor(ids[:-1], dtype=torch.long), want_logits=False)
        if self.draft is not None:
            self.draft.reset()
            self.draft.forward(torch.tensor(ids[:-2], dtype=torch.long), want_logits=False)
        self.feed[0, 0].fill_(ids[-1])
        self.pending[0].copy_(torch.tensor((ids * 2)[-2:], device=self.device))
        self.generated.zero_()
        if self.shape.penalties:
            self.counts.zero_()
            self.seen.zero_()
            self.seen[torch.tensor(ids, dtype=torch.long, device=self.device)] = True

    def _prefill_head(self, ids: list[int]) -> None:
        """The target's prefill, feeding the head as it goes (core/heads.py); the first round then
        extends over the prompt's last target row as if the previous round had emitted `last`."""
        prefill_head(self.head, self.target, ids, self.device)
        self.out.fill_(-1)
        self.out[0, 0].fill_(ids[-1])
        self.emitted.fill_(1)

    def set_host_drafts(self, tokens: list[int]) -> None:
        if tokens:
            self.drafts[: len(tokens)].copy_(torch.tensor(tokens, dtype=torch.long), non_blocking=True)
        self.budget.fill_(len(tokens))

    def set_budget(self, n: int) -> None:
        self.budget.fill_(n)

    def draw(self, generator: torch.Generator) -> None:
        """The next round's random numbers, in place: the Exp(1) rows (sampled draft steps, then the
        target's recovery row) in one draw, then the uniforms (greedy rounds draw nothing). The host
        launches these between replays, so they are as few calls as the buffers allow: on the GPU
        each call costs the decode loop a few microseconds of host time a round."""
        if self.noise is None or self.shape.gumbel:
            return
        exponentials_(self.noise, generator)
        uniforms_(self.uniform, generator)

    # -- the device program -----------------------------------------------------------------------

    def body(self, mode: Mode, mark: Callable[[], None]) -> None:
        """One round on the device, no host sync. mark() is called between the phases (timing)."""
        mark()
        if self.shape.gumbel:
            torch.add(self.origin, self.generated, out=self.first)
            self.backend.gumbel_noise(self.noise, self.key, self.first)
        self._draft(mode)
        mark()
        with self.target.step_context(self.shape.k + 1):
            self.target.step(self.feed[0], self.target_logits)
        mark()
        self._verify(mode)
        self._commit(mode)
        mark()

    def _draft(self, mode: Mode) -> None:
        shape, k = self.shape, self.shape.k
        if shape.penalties:
            self.draft_counts.copy_(self.counts)
        if mode is Mode.HOST:
            self.num_drafts.copy_(self.budget)
            if self.head is not None:  # its cache follows the target's rows whoever drafts
                self._head_extend()
            if self.draft is not None:  # keep the draft cache following the committed sequence
                self.follow[:1].copy_(self.pending[0, :1])
                self.follow[1:].copy_(self.feed[0])
                with self.draft.step_context(k + 2):
                    self.draft.step(self.follow, self.draft_logits[k + 2])
            return
        if k == 0:  # target-only: a bonus token per round
            self.num_drafts.zero_()
            return
        if self.head is not None:
            self._head_draft()
            return
        ids = self.pending[0]
        for i in range(k):
            n = ids.shape[0]
            with self.draft.step_context(n):
                self.draft.step(ids, self.draft_logits[n])
            self._pick(i, self.draft_logits[n][n - 1 :])
            ids = self.drafts[i : i + 1]
        self._count_drafts()

    def _count_drafts(self) -> None:
        """Drafts that count: the host's budget, cut at the first step below p_min and at max_tokens
        (core/bookkeeping.py)."""
        self.backend.count_drafts(self.confident, self.budget, self.limit, self.generated, self.num_drafts)

    def _head_extend(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over the previous round's k + 1 target rows (core/heads.py): the logits and
        hidden state of its last emitted row, which predict the token after `last`."""
        k, head = self.shape.k, self.head
        ids = self.out[0].clamp_min(0)  # accepted drafts, then the new token; stale ids past them
        positions = (self.target.position - self.emitted + self.steps).clamp_min(0)
        logits, hidden = head.extend(ids, head.features(k + 1), positions)
        last = (self.emitted - 1).view(1)
        return logits.index_select(0, last), hidden.index_select(0, last)

    def _head_draft(self) -> None:
        logits, hidden = self._head_extend()
        self._pick(0, logits)
        for i in range(1, self.shape.k):  # step i embeds draft i - 1 at position P + i - 1
            logits, hidden = self.head.step(self.drafts[i - 1 : i], hidden, (self.target.position + (i - 1)).view(1))
            self._pick(i, logits)
        self._count_drafts()

    def _pick(self, i: int, logits: torch.Tensor) -> None:
        """Draft step i's id into drafts[i] (and q, its confidence and q(d_i) where needed)."""
        shape, out = self.shape, self.drafts[i : i + 1]
        params, penalties, bad = self.draft_params, None, self._bad_mask(1, i)
        if shape.penalties:
            penalties = PenaltyRows(self.draft_counts.unsqueeze(0), (self.seen | (self.draft_counts > 0)).unsqueeze(0))
        need_q = shape.p_min > 0 or shape.insight
        probs = None
        if self.draft_races:  # the probs straight into q's row: no copy between the pick and the next step
            probs = self.backend.warp_and_race(logits, params, self.noise[i : i + 1], out, penalties, bad,
                                               probs_out=self.q[i : i + 1] if self.q is not None else None)
        elif penalties is None and bad is None and not need_q:
            self.backend.argmax(logits, out)
        else:
            out.copy_(self.backend.warp(logits, params, penalties, bad)[0])
        if need_q:
            q = probs if probs is not None else logprobs_from_logits(logits, params, penalties, bad).exp()
            self.q_token[i : i + 1].copy_(q[0, out])
            self.confident[i : i + 1].copy_(q.max(dim=-1).values >= shape.p_min)
        if shape.penalties:
            self.draft_counts.index_add_(0, out, torch.ones_like(out, dtype=torch.int32))

    def _bad_mask(self, rows: int, first: int = 0, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """Rows first .. first+rows-1: padding columns, and stop ids while below min_tokens (into out)."""
        if not self.shape.min_tokens:
            return self.padding
        short = (self.generated + self.steps[first : first + rows]) < self.min_tokens  # [rows]
        mask = torch.logical_and(short.unsqueeze(1), self.stop_cols, out=out)  # [rows, V]
        return mask if self.padding is None else torch.logical_or(mask, self.padding, out=out)

    def _verify(self, mode: Mode) -> None:
        k, shape = self.shape.k, self.shape
        penalties = None
        if shape.penalties:
            step = torch.zeros(k + 1, shape.width, dtype=torch.int32, device=self.device)
            step.index_put_((self.steps[1:], self.drafts), self.ones)  # a device value: capturable
            cum = step.cumsum(0, dtype=torch.int32)  # row i also counts drafts[:i]
            penalties = PenaltyRows(torch.add(self.counts, cum, out=self.row_counts),
                                    torch.logical_or(self.seen, cum > 0, out=self.row_seen))
        bad = self._bad_mask(k + 1, out=self.row_bad)
        self.rows = (self.params, penalties, bad)
        q = self.q if mode is Mode.MODEL and self.q is not None else None
        if shape.gumbel:  # x_i = argmax p̃_i / E_i; a draft is accepted iff it equals x_i
            probs = self.backend.warp_and_race(self.target_logits, self.params, self.noise, self.choice,
                                               penalties, bad)
            self.out.copy_(self.backend.verify_greedy(self.drafts, self.num_drafts, self.choice, k))
            self._stage(mode, probs if shape.insight else None, q)
            return
        argmax, probs = self.backend.warp(self.target_logits, self.params, penalties, bad)
        if probs is None:
            out = self.backend.verify_greedy(self.drafts, self.num_drafts, argmax, k)
        else:
            out = self.backend.verify_random(self.drafts, self.num_drafts, q, probs, self.uniform,
                                             self.noise[-1:], k)
        self.out.copy_(out)
        self._stage(mode, probs, q)

    def _stage(self, mode: Mode, probs, q) -> None:
        """The float results the host reads (p(d), q(d), entropy), into stage_f; the ids go into
        stage_ids with the commit."""
        k = self.shape.k
        if k == 0 or (not self.shape.insight and probs is None):
            return
        index = self.steps[:k]
        if probs is None:  # greedy insight: p is the softmax of the penalised logits
            params, penalties, bad = self.rows
            probs = logprobs_from_logits(self.target_logits, params, penalties, bad).exp()
        p_token = probs[index, self.drafts]
        q_token = q[index, self.drafts] if q is not None else self.q_token
        if mode is Mode.HOST:
            q_token = torch.ones_like(p_token)  # one-hot q
        parts = [p_token, q_token]
        if self.shape.insight:
            parts.append(torch.special.entr(probs[:k]).sum(dim=-1))
        torch.cat(parts, out=self.stage_f)

    def _commit(self, mode: Mode) -> None:
        """The ids staged for the host; both caches back to the accepted length; the next round's
        inputs from this one's output (core/bookkeeping.py)."""
        k, row, draft = self.shape.k, self.out[0], self.draft
        self.backend.commit(CommitBuffers(
            row=row, feed=self.feed[0], num_drafts=self.num_drafts, stage=self.stage_ids,
            target_position=self.target.position, emitted=self.emitted, generated=self.generated,
            draft_position=draft.position if draft is not None else None,
            pending=self.pending[0] if draft is not None else None,
            ran=k + 2 if mode is Mode.HOST else k + 1))  # rows the draft ran past committed[:-2], less one
        if self.shape.penalties:
            valid = row >= 0
            self.counts.index_add_(0, row.clamp_min(0), valid.int())
            self.seen |= self.counts > 0
