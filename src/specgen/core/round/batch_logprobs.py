"""Each batch row's logprobs: the single decode loop's (core/decode.py, `Decoder._logprobs`) for
every row of a BatchRound at once, staged on the device for the round's one copy to the host.

After a round whose rows ask for logprobs (sampling.logprobs), the batch loop queues this part
behind the round (core/batch_decode.py): its ops run on the device, in the stream's order, before
the next round rewrites the logits, and read nothing from the host. From the round's target rows
in emitted order (`logprob_rows`: a chain's k + 1 rows; a tree's root and accepted nodes, in path
order, as core/round/tree_round.py's `keep_path_rows` gathers them for one request) it computes
what one request computes from its own:

    warped  logprobs_from_logits over the rows the verification warps (the row's params, its
            penalty rows and mask, as the round's logits-row parts left them: BatchLogitsRows.last),
            the distribution its tokens are drawn from (greedy rows: the penalised log-softmax)
    raw     log_softmax of the target's logits

then each emitted token's logprob (a gather at the round's output row) and, for rows asking for
N > 0 alternatives, topk(N): the same ops over each asking row's own k + 1 target rows, the
shapes of its request alone (see `stage`). It stages them in one float32 buffer [B, k + 1, 1 + 2 MAX]: per target row, the emitted
token's logprob, then the N best values, then their ids (int32 bits, viewed as such), which the
loop copies into a host buffer of the round's own in one copy and reads per row (`entries`).

A round none of whose rows asks computes nothing: the loop does not call it. Rows of other
settings share the batch: rows that ask for no logprobs get none (their staged values are unread),
rows of raw and warped modes each take their own, rows of different N their own topk.
"""

from __future__ import annotations

import torch

from specgen.core.events import logprob_entries
from specgen.core.sampling.warp import PenaltyRows, logprobs_from_logits
from specgen.core.settings import SamplingSpec

MAX_LOGPROBS = 20  # sampling.logprobs' largest (core/profile.py)


class BatchLogprobs:
    """The staged logprobs of a BatchRound's rows (`staged`, allocated on the first round asked)."""

    columns = 1 + 2 * MAX_LOGPROBS

    def __init__(self, rnd):
        self.rnd = rnd
        self.staged: torch.Tensor | None = None  # [B, k + 1, columns] float32

    def stage(self, specs: list[SamplingSpec | None]) -> torch.Tensor:
        """Queue the computation for the round just launched, each row with specs[b] (None, or a
        spec without logprobs: none for it); returns the staged buffer (a device tensor). Each row
        that asks takes its own k + 1 target rows alone, the shapes its request computes alone:
        torch's reductions (a softmax's sum, a top-p's cumulative sum) choose how to split a row
        by the number of rows, so over [B (k + 1), V] a row's values move by an ulp (H200 bf16,
        t 0.8 / top-k 20: -0.5106384754 against -0.5106385350 alone; a 64-core CPU likewise).
        A row that asks nothing costs nothing."""
        rnd = self.rnd
        batch, rows = rnd.batch, rnd.k + 1
        if self.staged is None:
            self.staged = torch.zeros(batch, rows, self.columns, dtype=torch.float32, device=rnd.device)
        logits, params, penalties, bad = rnd.logprob_rows()  # [B (k + 1), width]
        for b, spec in enumerate(specs):
            if spec is not None and spec.logprobs is not None:
                at = slice(b * rows, (b + 1) * rows)
                mask = bad[at] if bad is not None and bad.dim() == 2 else bad
                own = params.slice(at.start, at.stop)
                own.__dict__["log_min_p"] = params.log_min_p[at]  # the round's, as its warp reads it
                counted = None if penalties is None else PenaltyRows(penalties.counts[at], penalties.seen[at])
                self._stage(b, spec, logits[at], own, counted, mask)
        return self.staged

    def _stage(self, b: int, spec: SamplingSpec, logits: torch.Tensor, params, penalties, bad) -> None:
        """Row b's entries (spec: its settings): logits [k + 1, width] its target rows, and its
        warp's inputs (params, penalty rows, mask), as core/decode.py's `Decoder._logprobs` computes them."""
        if spec.logprobs_mode == "raw":
            logp = torch.log_softmax(logits, dim=-1)
        else:
            logp = logprobs_from_logits(logits, params, penalties, bad)
        staged = self.staged[b]
        ids = self.rnd.stage_ids[b, : self.rnd.k + 1].clamp_min(0)  # the round's output row (-1 past what it emitted)
        staged[:, 0].copy_(logp.gather(1, ids[:, None])[:, 0])
        if spec.logprobs > 0:
            top = logp.topk(spec.logprobs, dim=-1)
            staged[:, 1 : 1 + spec.logprobs].copy_(top.values)
            staged[:, 1 + MAX_LOGPROBS : 1 + MAX_LOGPROBS + spec.logprobs].view(torch.int32).copy_(top.indices)

    @staticmethod
    def entries(host: torch.Tensor, b: int, emitted: list[int], spec: SamplingSpec) -> list[dict]:
        """Row b's entries for the tokens it emitted this round, from the host copy of the staged
        buffer: core/decode.py's, value for value."""
        block = host[b, : len(emitted)]
        n = spec.logprobs
        values = block[:, 1 : 1 + n].tolist() if n > 0 else None
        indices = block[:, 1 + MAX_LOGPROBS : 1 + MAX_LOGPROBS + n].view(torch.int32).tolist() if n > 0 else None
        return logprob_entries(emitted, block[:, 0].tolist(), values, indices)
