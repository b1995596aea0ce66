"""A round's bookkeeping on the device, the torch reference: how many drafts count, and the commit
that stages the round's ids for the host and moves both caches and the next round's inputs.

Why a module of its own: in the round (core/round/round.py) these are some 25 tensor operations on a
handful of integers, each a kernel of about a microsecond plus its gap once captured, about 45 µs
of a round on an H200. gpu/kernels/commit.py computes each of the two in one kernel; this is what it must equal
(tests/gpu/kernels/test_commit.py), and what the torch backend runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def count_drafts(confident: torch.Tensor, budget: torch.Tensor, limit: torch.Tensor, generated: torch.Tensor,
                 out: torch.Tensor) -> None:
    """Drafts that count, into out [1] int32: the host's budget [1] int32, cut at the first step
    whose confidence flag confident [k] bool is off, and at the room left before the request's
    limit [] (its max_tokens - 1) given generated [] tokens so far."""
    k = confident.shape[0]
    stop = confident.logical_not().int().argmax().int()  # first unsure step (0 if none)
    first_unsure = torch.where(confident.all(), k, stop)
    room = (limit - generated).clamp(0, k)
    torch.minimum(torch.minimum(budget, first_unsure.view(1)), room.view(1), out=out)


@dataclass(frozen=True)
class CommitBuffers:
    """What a commit reads and writes (the round's buffers, int64 unless said): the verifier's
    output row [k + 1] (emitted tokens, then -1), feed [k + 1] (the round's `last`, then its
    drafts), num_drafts [1] int32, stage [2k + 2] (out | drafts | n, the host's one copy), the
    target's position [], emitted [] and generated []; with a draft model, its position [] and
    pending [2] (the committed sequence's last two ids, its next round's first step), and `ran`:
    the rows it ran past committed[:-2], less one."""

    row: torch.Tensor
    feed: torch.Tensor
    num_drafts: torch.Tensor
    stage: torch.Tensor
    target_position: torch.Tensor
    emitted: torch.Tensor
    generated: torch.Tensor
    draft_position: torch.Tensor | None = None
    pending: torch.Tensor | None = None
    ran: int = 0


def commit(b: CommitBuffers) -> None:
    """Stage the ids, then roll both caches back to the accepted length and write the next round's
    inputs. m = emitted = the row's ids >= 0 (accepted + 1; an error sentinel makes it garbage,
    which the host raises on); the newest token, row[m - 1], becomes feed[0]."""
    k = b.row.shape[0] - 1
    torch.cat([b.row, b.feed[1:], b.num_drafts.long()], out=b.stage)
    emitted = (b.row >= 0).sum()
    last = (emitted - 1).clamp(0, k).view(1)
    newest = b.row.index_select(0, last)  # the recovered or bonus token
    b.target_position.sub_(k + 1 - emitted)
    if b.draft_position is not None:
        b.draft_position.sub_(b.ran - emitted)
        b.pending[:1].copy_(b.feed.index_select(0, last))  # the last accepted (or `last`)
        b.pending[1:].copy_(newest)
    b.feed[:1].copy_(newest)
    b.emitted.copy_(emitted)
    b.generated.add_(emitted)


# -- a batch's rows (core/round/batch_round.py) ------------------------------------------------------
# The same two operations over B rows at once, each row computing what count_drafts and commit
# compute for it alone (integers only: exactly). Why not a loop of the above: captured, each row's
# call is a launch of its own, and a batch of 16 would pay 16 of them per operation per round.


def count_drafts_rows(confident: torch.Tensor, budget: torch.Tensor, limit: torch.Tensor, generated: torch.Tensor,
                      out: torch.Tensor) -> None:
    """count_drafts for B rows: budget and out [B] int32, limit and generated [B]; confident [k]
    bool, shared by the rows (draft_p_min is not taken by batches: it is all True there)."""
    k = confident.shape[0]
    stop = confident.logical_not().int().argmax().int()
    first_unsure = torch.where(confident.all(), k, stop)
    room = (limit - generated).clamp(0, k)
    torch.minimum(torch.minimum(budget, first_unsure), room, out=out)


def commit_rows(b: CommitBuffers) -> None:
    """commit for B rows: every CommitBuffers tensor with a leading batch dimension (row and feed
    [B, k + 1], num_drafts [B] int32, stage [B, 2k + 2], the positions, emitted and generated
    [B], pending [B, 2]); `ran` is the rows' common one."""
    k = b.row.shape[1] - 1
    torch.cat([b.row, b.feed[:, 1:], b.num_drafts.long()[:, None]], dim=1, out=b.stage)
    emitted = (b.row >= 0).sum(1)
    last = (emitted - 1).clamp(0, k)[:, None]  # [B, 1]
    newest = b.row.gather(1, last)
    b.target_position.sub_(k + 1 - emitted)
    if b.draft_position is not None:
        b.draft_position.sub_(b.ran - emitted)
        b.pending[:, :1].copy_(b.feed.gather(1, last))
        b.pending[:, 1:].copy_(newest)
    b.feed[:, :1].copy_(newest)
    b.emitted.copy_(emitted)
    b.generated.add_(emitted)
