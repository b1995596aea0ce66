"""A batch's logits-row processors: core/round/rows.py's, each row of the batch with its own state.

What the warp takes besides the logits and the rows' WarpParams (core/round/batch_round.py's
RowParams, which hold each row's penalty factors), for the draft steps [B, V] and the target's
rows [B * (k + 1), V], built on the device from buffers of the part's own:

    BatchPenalties   each row's output counts and seen ids [B, V] (set from its prompt at refill,
                     counted from its emitted ids at each commit); a draft step adds the row's own
                     picks, target row i the row's drafts before it: Penalties' rows, per row
    BatchMinTokens   each row's stop ids [B, V] masked in its rows below its min_tokens (with the
                     padding columns): MinTokens' mask, per row

A row that asks for neither gets the logits it gets without the part, bit for bit: repetition 1
divides and multiplies by 1, frequency and presence 0 subtract 0, and a row at min_tokens 0 masks
its padding columns alone. So a batch is built with a part when any of its prompts may use it
(core/engine.py), and its other rows share it. `BatchLogitsRows` holds one of each kind (None
where the round has none) and hands the couplings (penalties, bad_mask) for draft step i and
for the target rows.

Every op writes buffers allocated here, once (or temporaries of the op itself): the body reads no
host value, so a backend may capture it. A refill writes its row's state from staged host values
(core/round/staging.py): queued behind the round in flight, no stall.
"""

from __future__ import annotations

import torch

from specgen.core.errors import UsageError
from specgen.core.round.rows import Padding
from specgen.core.round.staging import Staging
from specgen.core.sampling.warp import PenaltyRows
from specgen.core.settings import SamplingSpec


def uses_penalties(spec: SamplingSpec) -> bool:
    return (spec.repetition_penalty, spec.presence_penalty, spec.frequency_penalty) != (1.0, 0.0, 0.0)


class BatchPenalties:
    """Penalties (core/round/rows.py) for B rows: counts [B, V] int32 of each row's output ids and
    seen [B, V] of its prompt's and output's; draft_counts, the counts with the round's picks so
    far; the target rows' counts and seen [B, R, V] (a chain's R = k + 1 rows: row i with the row's
    drafts[:i]; a tree's R = n + 1: each tree row with the drafts on its path), and the draft
    steps' seen [B, V], in buffers of their own."""

    def __init__(self, batch: int, rows: int, width: int, device: torch.device, staging: Staging):
        z = dict(device=device)
        self.staging = staging
        self.counts = torch.zeros(batch, width, dtype=torch.int32, **z)
        self.seen = torch.zeros(batch, width, dtype=torch.bool, **z)
        self.draft_counts = torch.zeros_like(self.counts)
        self.draft_seen = torch.zeros_like(self.seen)
        self.ones = torch.ones(batch, 1, dtype=torch.int32, **z)
        self.row_counts = torch.zeros(batch, rows, width, dtype=torch.int32, **z)
        self.row_seen = torch.zeros(batch, rows, width, dtype=torch.bool, **z)

    def state(self) -> list[torch.Tensor]:
        return [self.counts, self.seen, self.draft_counts]

    def start(self, b: int, ids: list[int]) -> None:
        """Row b's prompt: nothing counted, its ids seen (the ids staged: no stall)."""
        self.counts[b].zero_()
        self.seen[b].zero_()
        self.seen[b].index_fill_(0, self.staging.put(torch.tensor(ids, dtype=torch.long)), True)

    def begin(self) -> None:
        self.draft_counts.copy_(self.counts)

    def draft_row(self) -> PenaltyRows:
        torch.gt(self.draft_counts, 0, out=self.draft_seen)
        self.draft_seen.logical_or_(self.seen)
        return PenaltyRows(self.draft_counts, self.draft_seen)

    def picked(self, out: torch.Tensor) -> None:
        """A draft step's ids out [B]: each row counts its own."""
        self.draft_counts.scatter_add_(1, out[:, None], self.ones)

    def target_rows(self, drafts: torch.Tensor) -> PenaltyRows:
        """The target's rows [B * (k + 1), V] for the drafts [B, k]: row i of row b counts its
        output and drafts[b, :i] (every draft, as the chain round's: the rows past a row's count
        decide nothing)."""
        counts, seen = self.row_counts, self.row_seen
        counts.zero_()
        counts[:, 1:].scatter_(2, drafts[:, :, None], 1)
        counts.cumsum_(1)  # row i: drafts[:i]
        torch.gt(counts, 0, out=seen)
        seen.logical_or_(self.seen[:, None])
        counts.add_(self.counts[:, None])
        return PenaltyRows(counts.view(-1, counts.shape[-1]), seen.view(-1, seen.shape[-1]))

    def tree_rows(self, ids: torch.Tensor, path: torch.Tensor, depth: torch.Tensor) -> PenaltyRows:
        """Each row's tree rows [B * (n + 1), V], as the single round's TreeRows: a tree row counts
        its row's output and the drafted ids on its path (its ancestors below the root, and its
        own). ids [B, n + 1] the tree rows' tokens, path [B, n + 1, L] each tree row's tree rows
        from the root down, depth [B, n + 1] how many of them it sees."""
        counts, seen = self.row_counts, self.row_seen
        steps = torch.arange(path.shape[-1], device=path.device)
        drafted = ((steps > 0) & (steps < depth[..., None])).int()  # the root is counted already
        tokens = ids.gather(1, path.clamp(0, ids.shape[1] - 1).flatten(1)).view(path.shape)
        counts.zero_()
        counts.scatter_add_(2, tokens, drafted)
        torch.gt(counts, 0, out=seen)
        seen.logical_or_(self.seen[:, None])
        counts.add_(self.counts[:, None])
        return PenaltyRows(counts.view(-1, counts.shape[-1]), seen.view(-1, seen.shape[-1]))

    def commit(self, out: torch.Tensor, active: torch.Tensor) -> None:
        """The round's output rows [B, k + 1] (emitted ids, then -1) counted, each in its row; a row
        without a prompt counts nothing (its next prompt clears it anyway)."""
        valid = (out >= 0) & active[:, None]
        self.counts.scatter_add_(1, out.clamp_min(0), valid.int())
        self.seen.logical_or_(self.counts > 0)


class BatchMinTokens:
    """MinTokens (core/round/rows.py) for B rows: row b's stop ids (stop_token_ids, and the
    model's eos unless ignore_eos) masked in its rows where generated[b] + i < its min_tokens (i: a
    chain row's index, a tree row's depth - 1), with the padding columns. generated [B]: the
    round's tokens emitted so far per row; rows: the target rows per row (k + 1, or a tree's n + 1)."""

    def __init__(self, batch: int, rows: int, width: int, vocab_size: int, eos_ids, generated: torch.Tensor,
                 staging: Staging):
        z = dict(device=generated.device)
        self.width, self.eos_ids, self.generated, self.staging = width, frozenset(eos_ids), generated, staging
        self.padding = Padding(width, vocab_size, generated.device).padding
        self.min_tokens = torch.zeros(batch, dtype=torch.long, **z)
        self.stop_cols = torch.zeros(batch, width, dtype=torch.bool, **z)
        self.steps = torch.arange(rows, **z)
        self.short = torch.zeros(batch, rows, dtype=torch.bool, **z)  # the target rows' below min_tokens
        self.draft_short = torch.zeros(batch, 1, dtype=torch.bool, **z)
        self.row_bad = torch.zeros(batch, rows, width, dtype=torch.bool, **z)
        self.draft_bad = torch.zeros(batch, width, dtype=torch.bool, **z)

    def start(self, b: int, spec: SamplingSpec) -> None:
        """Row b's stop ids and min_tokens."""
        stops = set(spec.stop_token_ids) | (set() if spec.ignore_eos else self.eos_ids)
        self.stop_cols[b].zero_()
        stops = sorted(i for i in stops if i < self.width)
        if stops:
            self.stop_cols[b].index_fill_(0, self.staging.put(torch.tensor(stops, dtype=torch.long)), True)
        self.min_tokens[b].fill_(spec.min_tokens)

    def _mask(self, short: torch.Tensor, stops: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        torch.logical_and(short, stops, out=out)
        return out if self.padding is None else out.logical_or_(self.padding)

    def draft_row(self, i: int) -> torch.Tensor:
        """Draft step i's mask [B, V]."""
        torch.lt(self.generated[:, None] + i, self.min_tokens[:, None], out=self.draft_short)
        return self._mask(self.draft_short, self.stop_cols, self.draft_bad)

    def target_rows(self) -> torch.Tensor:
        """The target rows' mask [B * (k + 1), V]."""
        torch.lt(self.generated[:, None] + self.steps, self.min_tokens[:, None], out=self.short)
        return self._mask(self.short[:, :, None], self.stop_cols[:, None], self.row_bad).view(-1, self.width)

    def tree_rows(self, depth: torch.Tensor) -> torch.Tensor:
        """A tree's rows' mask [B * (n + 1), V]: a tree row at depth d stands where a chain's row d - 1 does."""
        torch.lt(self.generated[:, None] + depth - 1, self.min_tokens[:, None], out=self.short)
        return self._mask(self.short[:, :, None], self.stop_cols[:, None], self.row_bad).view(-1, self.width)


class BatchLogitsRows:
    """The warp's (penalties, bad_mask) for a batch's draft steps and target rows. penalties,
    min_tokens: the parts, or None where the round was built without them; padding: the padding
    columns' mask [V] (None: every column has a token), which a round without min_tokens masks
    alone. plain: neither part, so a draft step of an all-greedy batch may take the argmax."""

    def __init__(self, penalties: BatchPenalties | None, min_tokens: BatchMinTokens | None,
                 padding: torch.Tensor | None):
        self.penalties, self.min_tokens, self.padding = penalties, min_tokens, padding
        self.plain = penalties is None and min_tokens is None
        # the last round's target rows' (penalties, bad mask), as its verification warped them: what
        # its logprobs read (core/round/batch_logprobs.py) before the next round's rows rewrite them
        self.last: tuple = (None, padding)

    def state(self) -> list[torch.Tensor]:
        return self.penalties.state() if self.penalties is not None else []

    def start(self, b: int, ids: list[int], spec: SamplingSpec) -> None:
        """Row b's prompt and settings; a setting the round was built without is refused."""
        if self.penalties is None and uses_penalties(spec) or self.min_tokens is None and spec.min_tokens > 0:
            raise UsageError("this batch was built without penalties or min_tokens, and a prompt asks for them",
                             hint="give them in the profile or on the command line, for every prompt")
        if self.penalties is not None:
            self.penalties.start(b, ids)
        if self.min_tokens is not None:
            self.min_tokens.start(b, spec)

    def begin(self) -> None:
        if self.penalties is not None:
            self.penalties.begin()

    def draft_row(self, i: int) -> tuple:
        penalties = self.penalties.draft_row() if self.penalties is not None else None
        return penalties, self.min_tokens.draft_row(i) if self.min_tokens is not None else self.padding

    def picked(self, out: torch.Tensor) -> None:
        if self.penalties is not None:
            self.penalties.picked(out)

    def target_rows(self, drafts: torch.Tensor) -> tuple:
        penalties = self.penalties.target_rows(drafts) if self.penalties is not None else None
        self.last = (penalties, self.min_tokens.target_rows() if self.min_tokens is not None else self.padding)
        return self.last

    def tree_rows(self, rows) -> tuple:
        """A tree round's target rows (core/step/rows.py's Rows of B trees: BatchPenalties.tree_rows
        over each tree row's path, BatchMinTokens.tree_rows); without either part no launch."""
        penalties = None
        if self.penalties is not None:  # the tail holds slots past each row's start: tree rows from it
            penalties = self.penalties.tree_rows(rows.ids, rows.tail - rows.start[:, None, None], rows.depth)
        self.last = (penalties, self.min_tokens.tree_rows(rows.depth) if self.min_tokens is not None else self.padding)
        return self.last

    def commit(self, out: torch.Tensor, active: torch.Tensor) -> None:
        if self.penalties is not None:
            self.penalties.commit(out, active)
