"""The speculation round, written once: the device program every backend runs or captures.

One round, from static buffers sized once for k, each phase a part chosen when the round is built:

    draft    the drafter (core/round/drafters.py): the draft model, a head, or the host's drafts
             (with the model following) writes feed = [last, d0 .. d(k-1)] and num_drafts
    target   one forward over feed  ->  k + 1 rows of logits
    rows     the warp's inputs for those rows (core/round/rows.py: penalties, min_tokens, padding)
    verify   the coupling (core/round/couplings.py: rejection or Gumbel) writes the output row:
             the accepted prefix, then the recovered or bonus token
    stage    the floats the host reads (core/round/stage.py: p(d), q(d), insight's entropy); the
             ids are staged with the commit, so the host copies one buffer per dtype
    commit   both caches roll back by moving their position; the next round's `last` (and the
             draft model's `pending`) are written from this round's output (core/sampling/bookkeeping.py)

The draft cache always holds the committed sequence minus its last two ids, the target cache all
but the last: with m tokens emitted, both positions move back by the rows they ran beyond that.
Rounds that draft fewer than k (the last ones, adaptive k, host proposals, an unsure draft) run
the same shapes; the verifier reads how many drafts count from `num_drafts`, and rows past them
are overwritten by the next round. The body makes no host sync and allocates nothing the next
replay needs, so a backend may capture it as one CUDA graph (gpu/backend.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import torch

from specgen.core.sampling.bookkeeping import CommitBuffers
from specgen.core.round.couplings import GumbelCoupling, RejectionCoupling
from specgen.core.round.draft_model import DraftModel
from specgen.core.round.drafters import DraftPick, HostLookup, NoDraft, draft_spec
from specgen.core.round.head import HeadDrafts
from specgen.core.round.rows import LogitsRows, MinTokens, NoPenalties, Padding, Penalties
from specgen.core.round.stage import DraftProbs, Insight, NoStage
from specgen.core.sampling.warp import WarpParams
from specgen.core.settings import SamplingSpec


class Mode(enum.Enum):
    MODEL = "model"  # the device drafter drafts (the draft model or a head)
    HOST = "host"  # the host wrote the drafts (n-gram); q is one-hot
    # the host's lookup found nothing: a tree round's program over the root alone, where a
    # lookup tree's program would step the target over n padding rows (core/round/tree_round.py)
    EMPTY = "empty"
    # a hybrid tree round whose lookup found continuations, merged with the model's tree
    # (core/round/merged_tree.py); HOST is then the lookup's trie alone (core/drafters/merge_rule.py)
    MERGED = "merged"


@dataclass(frozen=True)
class RoundShape:
    """What fixes a round's program, by the parts it is built from: captured once per shape and
    reused by every request."""

    k: int
    width: int  # logits columns
    vocab_size: int  # ids with a token behind them (< width: padding columns are masked)
    drafter: str = "none"  # the device drafter: "draft" (the draft model), "eagle" / "mtp" (a head), "none"
    draft_pick: str = "argmax"  # "argmax"; "sample" (draws from q); "temperature" (q without top-k/p, min-p)
    coupling: str = "rejection"  # "rejection" (greedy requests too) or "gumbel" (sampled)
    rows: tuple[str, ...] = ()  # logits-row processors besides padding: "penalties", "min_tokens"
    p_min: float = 0.0  # drafting stops at the first step whose confidence is below this (0 = off)
    stages: tuple[str, ...] = ()  # optional stages: "insight" (p(x), q(x), entropy per drafted token)
    tree_width: int = 1  # children a draft node may have: 1 is this chain round, more a TreeRound
    tree_nodes: int = 0  # the tree's nodes besides the root (tree_width > 1)


class Shared:
    """The buffers every part reads or writes (B = 1): feed [B, k+1] = last, d0 .. d(k-1); the output
    row [B, k+1]; num_drafts (drafts that count) and budget (drafts the host allows) [B] int32;
    generated and emitted (tokens so far, and in the last round); limit: the request's max_tokens
    - 1 (drafts stop counting where they would pass it, on the device, so that a round can be
    queued before the host has read how many tokens the one before emitted); the target's logits."""

    def __init__(self, k: int, width: int, backend, target):
        self.k, self.width, self.backend, self.target = k, width, backend, target
        self.device = device = target.device
        z = dict(device=device)
        self.feed = torch.zeros(1, k + 1, dtype=torch.long, **z)  # [B, k+1]
        self.drafts = self.feed[0, 1:]  # [k]
        self.out = torch.zeros(1, k + 1, dtype=torch.long, **z)
        self.budget = torch.zeros(1, dtype=torch.int32, **z)
        self.num_drafts = torch.zeros(1, dtype=torch.int32, **z)  # cu_num_draft_tokens with B = 1
        self.generated = torch.zeros((), dtype=torch.long, **z)
        self.emitted = torch.ones((), dtype=torch.long, **z)
        self.limit = torch.full((), 1 << 62, dtype=torch.long, **z)
        self.steps = torch.arange(k + 1, **z)
        self.target_logits = torch.full((k + 1, width), float("-inf"), dtype=torch.float32, **z)
        self.stage_ids = torch.zeros(2 * k + 2, dtype=torch.long, **z)  # [out (k+1) | drafts (k) | n]

    def read_ids(self, values: list[int]) -> tuple[list[int], list[int], int, bool]:
        """(out, drafted ids, drafts that count, whether the last token out is a draft accepted)
        from the host's copy of stage_ids. A chain's last token is never a draft: its accepted
        drafts come first, then the recovered or bonus token."""
        k = self.k
        return values[: k + 1], values[k + 1 : 2 * k + 1], values[2 * k + 1], False

    @property
    def ops(self):  # the backend's table (core/round/ops.py), read at each call (CUDA's follows the target)
        return self.backend.ops


class Round(Shared):
    """The shared buffers, the parts and the body. `body(mode, mark)` is the algorithm; a backend runs
    it eagerly or replays its captured form (see core/backend.py)."""

    def __init__(self, shape: RoundShape, spec: SamplingSpec, backend, target, draft, stop_ids: list[int],
                 head=None):
        super().__init__(shape.k, shape.width, backend, target)
        self.shape = shape
        k, width, vocab = shape.k, shape.width, shape.vocab_size
        races = shape.draft_pick != "argmax" and not spec.greedy  # draft picks race q against a noise row
        self.coupling = GumbelCoupling(self, races) if shape.coupling == "gumbel" else \
            RejectionCoupling(self, not spec.greedy, races)
        penalties = Penalties(k, width, self.steps, self.device) if "penalties" in shape.rows else NoPenalties()
        mask = MinTokens(width, vocab, stop_ids, spec.min_tokens, self.generated, self.steps) \
            if "min_tokens" in shape.rows else Padding(width, vocab, self.device)
        self.rows = LogitsRows(WarpParams.from_spec(spec, k + 1, self.device),
                               WarpParams.from_spec(draft_spec(spec, shape.draft_pick != "temperature"), 1,
                                                    self.device), penalties, mask)
        insight = "insight" in shape.stages
        self.pick = DraftPick(self, self.rows, self.coupling, shape.p_min, keep_q=insight)
        self.drafter = self._drafter(shape, draft, head)
        self.draft = draft if isinstance(self.drafter, DraftModel) else None  # the draft model's runner
        self.drafters = {Mode.MODEL: self.drafter, Mode.HOST: HostLookup(self, self.drafter)}
        self.stage = self._stage(insight, spec)

    def _drafter(self, shape: RoundShape, draft, head):
        if shape.k == 0 or shape.drafter == "none":
            return NoDraft(self)
        if shape.drafter == "draft":
            return DraftModel(self, draft, self.pick)
        return HeadDrafts(self, head, self.pick)

    def _stage(self, insight: bool, spec: SamplingSpec):
        if self.k == 0:
            return NoStage(self)
        if insight:
            return Insight(self, self.pick.q_token)
        if spec.greedy or self.shape.coupling == "gumbel":
            return NoStage(self)
        return DraftProbs(self, self.pick.q_token, has_q=self.coupling.q is not None)

    # -- host side, before a round ----------------------------------------------------------------

    @property
    def runners(self) -> list:
        """What holds a cache: the target, then the draft model or the head (each with a position, a
        capacity, a generation and use_graphs, which capture reads)."""
        return [self.target, *self.drafter.runners]

    @property
    def stage_f(self) -> torch.Tensor:
        return self.stage.out

    @property
    def floats(self) -> bool:
        """Whether the round stages float results (p(d), q(d), entropy) for the host."""
        return self.stage.staged

    def read_floats(self, floats: list[float], mode: Mode) -> tuple:
        """(p, q, entropy) from the host's copy of stage_f (each None where not staged)."""
        return self.stage.read(floats, self.drafters[mode].one_hot)

    def read_ranks(self, values: list[int]) -> list[int] | None:
        """A tree round's accepted nodes' sibling indices (core/round/tree_round.py); a chain has none."""
        return None

    def read_source(self, ranks: list[int] | None, accepted: int, lookup) -> tuple[str, int] | None:
        """A hybrid tree round's drafter of the accepted path (core/round/tree_stage.py); a chain has none."""
        return None

    def read_tree(self, floats: list[float], mode: Mode = Mode.MODEL):
        """A tree round's tree with insight (core/round/tree_stage.py's TreeView); a chain has none."""
        return None

    def state(self) -> list[torch.Tensor]:
        """The buffers a round reads and writes that outlive it (a capture's warm-up restores them)."""
        return [self.feed, self.budget, self.num_drafts, self.generated, self.limit,
                *self.rows.penalties.state(), *self.drafter.state()]

    @property
    def reach(self) -> int:
        """Slots past a cache's position that one round may write (a capture's warm-up starts this
        far before the end of each cache)."""
        return self.k + 3

    def reserve(self, positions: int) -> None:
        """Room in every cache for a request that may reach `positions`."""
        for runner in self.runners:
            runner.reserve(positions + self.reach - (self.k + 3))

    def start(self, prompt_ids: list[int], seed: int = 0, max_tokens: int | None = None) -> None:
        """Prefill the caches (target: all but the last id; the drafter: its own rule) and set the
        first round's inputs. seed: Gumbel coupling's key (rejection coupling draws from the
        caller's generator); max_tokens: no round counts drafts past it (None: only the host's budget)."""
        ids = list(prompt_ids)
        self.limit.fill_(1 << 62 if max_tokens is None else max_tokens - 1)
        self.coupling.start(seed, len(ids))
        self.target.reset()
        self.drafter.prefill(ids)
        self.feed[0, 0].fill_(ids[-1])
        self.generated.zero_()
        self.rows.penalties.start(ids)

    def set_host_drafts(self, tokens: list[int], mode: Mode = Mode.HOST) -> None:
        """The host's drafts for the next round of `mode` (HOST, or a hybrid tree's MERGED)."""
        self.drafters[mode].set_drafts(tokens)

    def set_budget(self, n: int) -> None:
        self.budget.fill_(n)

    def draw(self, generator: torch.Generator) -> None:
        """The next round's random numbers, if the coupling draws them on the host."""
        self.coupling.draw(generator)

    # -- the device program -----------------------------------------------------------------------

    def body(self, mode: Mode, mark: Callable[[], None]) -> None:
        """One round on the device, no host sync. mark() is called between the phases (timing)."""
        drafter = self.drafters[mode]
        mark()
        self.coupling.begin()
        self.rows.penalties.begin()
        drafter.draft()
        mark()
        with self.target.step_context(self.k + 1):
            self.target.step(self.feed[0], self.target_logits)
        mark()
        rows = self.rows.target_rows(self.drafts)
        probs, q = self.coupling.verify(rows, drafter.one_hot)
        self.stage.stage(probs, q, rows, drafter.one_hot)
        self.ops.commit(CommitBuffers(
            row=self.out[0], feed=self.feed[0], num_drafts=self.num_drafts, stage=self.stage_ids,
            target_position=self.target.position, emitted=self.emitted, generated=self.generated,
            **drafter.commit_fields()))
        self.rows.penalties.commit(self.out[0])
        mark()
