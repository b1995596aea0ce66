"""Per-request sampling state: what the warp chain needs to know about one request's history.

Both the proposer (for q) and the loop (for p) ask it for the rows of a round, so the draft and
the target see the same penalties, masks and parameters at every position.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specgen.core.sampling import PenaltyRows, WarpParams, penalty_rows
from specgen.core.settings import SamplingSpec


def draft_spec(spec: SamplingSpec, cut: bool) -> SamplingSpec:
    """What the draft warps its logits with: the request's own settings (cut), or its temperature and
    penalties without top-k / top-p / min-p (speculation.draft_sampling = "temperature": a cheaper
    pick, q wider than p). Any q keeps the output lossless, as long as the draft samples from it."""
    return spec if cut else replace(spec, top_k=-1, top_p=1.0, min_p=0.0)


@dataclass(frozen=True)
class RoundRows:
    params: WarpParams  # [n+1]
    penalties: PenaltyRows | None  # [n+1, V]
    bad_mask: torch.Tensor | None  # [n+1, V] or [V]


class SamplingState:
    def __init__(self, spec: SamplingSpec, width: int, vocab_size: int, stop_ids: set[int],
                 max_rows: int, device: torch.device):
        self.spec = spec
        self.width = width
        self.stop_ids = sorted(i for i in stop_ids if i < width)
        self.device = device
        self.params = WarpParams.from_spec(spec, max_rows, device)
        self.uncut_params = WarpParams.from_spec(draft_spec(spec, False), max_rows, device)
        self.use_penalties = (
            spec.repetition_penalty != 1.0 or spec.presence_penalty != 0.0 or spec.frequency_penalty != 0.0
        )
        self.padding = None
        if vocab_size < width:  # logits columns with no token behind them can never be produced
            self.padding = torch.zeros(width, dtype=torch.bool, device=device)
            self.padding[vocab_size:] = True
        self.counts = torch.zeros(width, dtype=torch.int32, device=device)
        self.seen = torch.zeros(width, dtype=torch.bool, device=device)
        self.generated = 0

    def start(self, prompt_ids: list[int]) -> None:
        self.generated = 0
        if self.use_penalties:  # counts and seen are read by the penalties only
            self.counts.zero_()
            self.seen.zero_()
            self.seen[torch.tensor(prompt_ids, dtype=torch.long, device=self.device)] = True

    def rows(self, drafted: torch.Tensor) -> RoundRows:
        """Rows 0..n of a round whose drafted tokens so far are `drafted` [n]."""
        n = drafted.shape[0]
        penalties = penalty_rows(self.counts, self.seen, drafted) if self.use_penalties else None
        return RoundRows(self.params.slice(0, n + 1), penalties, self._bad_mask(n + 1))

    def last_row(self, drafted: torch.Tensor, cut: bool = True) -> RoundRows:
        """Only row n (the draft's next step): the values rows(drafted) gives for it, built alone,
        so a draft step costs one row rather than the whole round so far. cut=False: the draft's
        temperature-only parameters (draft_spec)."""
        n = drafted.shape[0]
        penalties = None
        if self.use_penalties:
            counts = self.counts.index_add(0, drafted, torch.ones_like(drafted, dtype=torch.int32))
            penalties = PenaltyRows(counts.unsqueeze(0), (self.seen | (counts > self.counts)).unsqueeze(0))
        params = self.params if cut else self.uncut_params
        return RoundRows(params.slice(n, n + 1), penalties, self._bad_mask(1, first=n))

    def _bad_mask(self, rows: int, first: int = 0) -> torch.Tensor | None:
        """Rows first..first+rows-1 of a round: EOS and stop ids are masked at positions still below
        min_tokens."""
        short = max(0, min(rows, self.spec.min_tokens - self.generated - first))
        if short == 0 or not self.stop_ids:
            return self.padding
        mask = torch.zeros(rows, self.width, dtype=torch.bool, device=self.device)
        if self.padding is not None:
            mask |= self.padding
        mask[:short, self.stop_ids] = True
        return mask

    def commit(self, emitted) -> None:
        """emitted: a list of ids, or an int64 tensor already on the device (no host-to-device copy)."""
        self.generated += len(emitted)
        if not self.use_penalties:  # nothing reads counts and seen: no device work between rounds
            return
        ids = torch.as_tensor(emitted, dtype=torch.long, device=self.device)
        self.counts.index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
        self.seen[ids] = True
