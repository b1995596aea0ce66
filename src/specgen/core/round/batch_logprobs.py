"""Each batch row's logprobs: the single decode loop's (core/decode.py, `Decoder._logprobs`) for
every row of a BatchRound at once, staged on the device for the round's one copy to the host.

After a round whose rows ask for logprobs (sampling.logprobs), the batch loop queues this part
behind the round (core/batch_decode.py): its ops run on the device, in the stream's order, before
the next round rewrites the logits, and read nothing from the host. From the round's target rows
in emitted order (`logprob_rows`: a chain's k + 1 rows; a tree's root and accepted nodes, in path
order, as core/round/tree_round.py's `keep_path_rows` gathers them for one request) it computes
what one request computes from its own:

    warped  logprobs_from_logits over the rows the verification warps (the row's params and mask),
            the distribution its tokens are drawn from (greedy rows: the penalised log-softmax)
    raw     log_softmax of the target's logits

then each emitted token's logprob (a gather at the round's output row) and, for rows asking for
N > 0 alternatives, topk(N): the same ops over more rows, each row's values depending on its own
row only. It stages them in one float32 buffer [B, k + 1, 1 + 2 MAX]: per target row, the emitted
token's logprob, then the N best values, then their ids (int32 bits, viewed as such), which the
loop copies into a host buffer of the round's own in one copy and reads per row (`entries`).

A round none of whose rows asks computes nothing: the loop does not call it. Rows of other
settings share the batch: rows that ask for no logprobs get none (their staged values are unread),
rows of raw and warped modes each take their own, rows of different N their own topk.
"""

from __future__ import annotations

import torch

from specgen.core.events import logprob_entries
from specgen.core.sampling.warp import logprobs_from_logits
from specgen.core.settings import SamplingSpec

MAX_LOGPROBS = 20  # sampling.logprobs' largest (core/profile.py)


class BatchLogprobs:
    """The staged logprobs of a BatchRound's rows (`staged`, allocated on the first round asked)."""

    columns = 1 + 2 * MAX_LOGPROBS
    rows_at_once = 256  # target rows per group: a [256, 152k] float32 temporary is 156 MB

    def __init__(self, rnd):
        self.rnd = rnd
        self.staged: torch.Tensor | None = None  # [B, k + 1, columns] float32

    def stage(self, specs: list[SamplingSpec | None]) -> torch.Tensor:
        """Queue the computation for the round just launched, each row with specs[b] (None, or a
        spec without logprobs: none for it); returns the staged buffer (a device tensor). The rows
        go in groups of at most `rows_at_once` target rows (each op's temporaries [rows, width]
        stay bounded at any B; every op is row by row, so the groups change no value), and a
        group where no row asks is left out."""
        rnd = self.rnd
        batch, rows = rnd.batch, rnd.k + 1
        if self.staged is None:
            self.staged = torch.zeros(batch, rows, self.columns, dtype=torch.float32, device=rnd.device)
        asking = [s if s is not None and s.logprobs is not None else None for s in specs]
        logits, params, bad = rnd.logprob_rows()  # [B (k + 1), width]
        per = max(1, self.rows_at_once // rows)
        for first in range(0, batch, per):
            last = min(batch, first + per)
            if any(asking[first:last]):
                at = slice(first * rows, last * rows)
                mask = bad[at] if bad is not None and bad.dim() == 2 else bad
                own = params.slice(at.start, at.stop)
                own.__dict__["log_min_p"] = params.log_min_p[at]  # the round's, as its warp reads it
                self._stage(slice(first, last), asking[first:last], logits[at], own, mask)
        return self.staged

    def _stage(self, group: slice, asking: list[SamplingSpec | None], logits: torch.Tensor, params, bad) -> None:
        """The rows `group` (asking: their specs, None where a row asks none): logits [R, width]
        their target rows, and their warp's inputs."""
        count, rows = len(asking), self.rnd.k + 1
        raw = [s is not None and s.logprobs_mode == "raw" for s in asking]
        warped = [s is not None and s.logprobs_mode != "raw" for s in asking]
        # no penalty rows: batches refuse logprobs with penalties or min_tokens (core/engine.py)
        logp = logprobs_from_logits(logits, params, None, bad) if any(warped) else None
        if any(raw):
            own = torch.log_softmax(logits, dim=-1)
            logp = own if logp is None else torch.where(self._rows(raw), own.view(count, rows, -1),
                                                        logp.view(count, rows, -1))
        logp = logp.view(count, rows, -1)
        staged = self.staged[group]
        ids = self.rnd.stage_ids[group, :rows].clamp_min(0)  # the round's output row (-1 past what it emitted)
        staged[:, :, 0].copy_(logp.gather(2, ids[:, :, None])[:, :, 0])
        ids_bits = staged[:, :, 1 + MAX_LOGPROBS:].view(torch.int32)
        tops = sorted({s.logprobs for s in asking if s is not None and s.logprobs > 0})
        for n in tops:
            top = logp.topk(n, dim=-1)
            values, indices = staged[:, :, 1 : 1 + n], ids_bits[:, :, :n]
            if len(tops) == 1:
                values.copy_(top.values)
                indices.copy_(top.indices)
            else:  # rows of other N keep theirs
                mask = self._rows([s is not None and s.logprobs == n for s in asking])
                torch.where(mask, top.values, values, out=values)
                torch.where(mask, top.indices.int(), indices, out=indices)

    def _rows(self, chosen: list[bool]) -> torch.Tensor:
        """[R, 1, 1] bool: which of a group's rows are chosen, on the device (its copy queued, no stall)."""
        return self.rnd.staging.put(torch.tensor(chosen, dtype=torch.bool))[:, None, None]

    @staticmethod
    def entries(host: torch.Tensor, b: int, emitted: list[int], spec: SamplingSpec) -> list[dict]:
        """Row b's entries for the tokens it emitted this round, from the host copy of the staged
        buffer: core/decode.py's, value for value."""
        block = host[b, : len(emitted)]
        n = spec.logprobs
        values = block[:, 1 : 1 + n].tolist() if n > 0 else None
        indices = block[:, 1 + MAX_LOGPROBS : 1 + MAX_LOGPROBS + n].view(torch.int32).tolist() if n > 0 else None
        return logprob_entries(emitted, block[:, 0].tolist(), values, indices)
