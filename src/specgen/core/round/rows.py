"""Logits-row processors: what the warp takes besides the logits, for draft steps and target rows.

Each processor is chosen once, when the round is built, and builds its rows on the device from
the round's buffers, so a captured round needs no host value per request (vLLM's sample/ops/):

    Penalties   repetition / presence / frequency: counts and seen ids of the output so far; a
                draft step adds its own picks, target row i the drafts before it
    Padding     logits columns with no token behind them (vocab_size < width): masked everywhere
    MinTokens   stop ids masked in the rows below min_tokens (with the padding columns)

`LogitsRows` holds one of each kind (a plain stand-in where the request does not use it) and hands
the warp (params, penalties, bad_mask) for draft step i and for the k + 1 target rows.
"""

from __future__ import annotations

import torch

from specgen.core.sampling.warp import PenaltyRows, WarpParams


class NoPenalties:
    """A request without penalties: nothing to count."""

    def state(self) -> list[torch.Tensor]:
        return []

    def start(self, ids: list[int]) -> None:
        pass

    def begin(self) -> None:
        pass

    def draft_row(self) -> PenaltyRows | None:
        return None

    def picked(self, out: torch.Tensor) -> None:
        pass

    def target_rows(self, drafts: torch.Tensor) -> PenaltyRows | None:
        return None

    def commit(self, row: torch.Tensor) -> None:
        pass


class Penalties(NoPenalties):
    """Counts of the output ids and the ids seen (prompt or output), kept on the device; the draft's
    steps count their own picks in `draft_counts`, and the target's rows are built from the drafts
    into buffers of their own (so that `LogitsRows.last` reads the last round whichever capture ran it)."""

    def __init__(self, k: int, width: int, steps: torch.Tensor, device: torch.device):
        z = dict(device=device)
        self.k, self.width, self.steps = k, width, steps
        self.counts = torch.zeros(width, dtype=torch.int32, **z)  # output counts
        self.seen = torch.zeros(width, dtype=torch.bool, **z)  # prompt or output ids
        self.draft_counts = torch.zeros_like(self.counts)
        self.ones = torch.ones(k, dtype=torch.int32, **z)
        self.row_counts = torch.zeros(k + 1, width, dtype=torch.int32, **z)
        self.row_seen = torch.zeros(k + 1, width, dtype=torch.bool, **z)

    def state(self) -> list[torch.Tensor]:
        return [self.counts, self.seen, self.draft_counts]

    def start(self, ids: list[int]) -> None:
        self.counts.zero_()
        self.seen.zero_()
        self.seen[torch.tensor(ids, dtype=torch.long, device=self.seen.device)] = True

    def begin(self) -> None:
        self.draft_counts.copy_(self.counts)

    def draft_row(self) -> PenaltyRows:
        return PenaltyRows(self.draft_counts.unsqueeze(0), (self.seen | (self.draft_counts > 0)).unsqueeze(0))

    def picked(self, out: torch.Tensor) -> None:
        self.draft_counts.index_add_(0, out, torch.ones_like(out, dtype=torch.int32))

    def target_rows(self, drafts: torch.Tensor) -> PenaltyRows:
        step = torch.zeros(self.k + 1, self.width, dtype=torch.int32, device=self.counts.device)
        step.index_put_((self.steps[1:], drafts), self.ones)  # a device value: capturable
        cum = step.cumsum(0, dtype=torch.int32)  # row i also counts drafts[:i]
        return PenaltyRows(torch.add(self.counts, cum, out=self.row_counts),
                           torch.logical_or(self.seen, cum > 0, out=self.row_seen))

    def commit(self, row: torch.Tensor) -> None:
        valid = row >= 0
        self.counts.index_add_(0, row.clamp_min(0), valid.int())
        self.seen |= self.counts > 0


class Padding:
    """Columns past vocab_size, masked in every row (None: every column has a token)."""

    def __init__(self, width: int, vocab_size: int, device: torch.device):
        self.padding = None
        if vocab_size < width:  # logits columns with no token behind them can never be produced
            self.padding = torch.zeros(width, dtype=torch.bool, device=device)
            self.padding[vocab_size:] = True

    def draft_row(self, i: int) -> torch.Tensor | None:
        return self.padding

    def target_rows(self) -> torch.Tensor | None:
        return self.padding


class MinTokens(Padding):
    """Stop ids masked in row i while generated + i < min_tokens (generated: the round's count of
    tokens emitted so far, read on the device), with the padding columns."""

    def __init__(self, width: int, vocab_size: int, stop_ids: list[int], min_tokens: int,
                 generated: torch.Tensor, steps: torch.Tensor):
        super().__init__(width, vocab_size, generated.device)
        self.min_tokens, self.generated, self.steps = min_tokens, generated, steps
        self.stop_cols = torch.zeros(width, dtype=torch.bool, device=generated.device)
        self.stop_cols[[i for i in stop_ids if i < width]] = True
        self.row_bad = torch.zeros(steps.shape[0], width, dtype=torch.bool, device=generated.device)

    def _mask(self, rows: int, first: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
        short = (self.generated + self.steps[first : first + rows]) < self.min_tokens  # [rows]
        mask = torch.logical_and(short.unsqueeze(1), self.stop_cols, out=out)  # [rows, V]
        return mask if self.padding is None else torch.logical_or(mask, self.padding, out=out)

    def draft_row(self, i: int) -> torch.Tensor:
        return self._mask(1, i)

    def target_rows(self) -> torch.Tensor:
        return self._mask(self.steps.shape[0], out=self.row_bad)


class LogitsRows:
    """The warp's inputs for the round's draft steps and target rows. plain: draft rows are the
    logits as they are (no penalties, no mask), so a draft that needs no q may take their argmax."""

    def __init__(self, params: WarpParams, draft_params: WarpParams, penalties: NoPenalties, mask: Padding):
        self.params, self.draft_params, self.penalties, self.mask = params, draft_params, penalties, mask
        self.plain = type(penalties) is NoPenalties and type(mask) is Padding and mask.padding is None
        self.last: tuple = ()  # the target rows' (params, penalties, bad_mask) of the last round (logprobs)

    def draft_row(self, i: int) -> tuple:
        bad = self.mask.draft_row(i)
        return self.draft_params, self.penalties.draft_row(), bad

    def target_rows(self, drafts: torch.Tensor) -> tuple:
        self.last = (self.params, self.penalties.target_rows(drafts), self.mask.target_rows())
        return self.last
