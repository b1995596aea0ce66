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
    """count_drafts for B rows: budget and out [B] int32, limit and generated [B]; confident [B, k]
    bool, each row's own flags (draft_p_min cuts each row at its own first unsure step)."""
    k = confident.shape[-1]
    stop = confident.logical_not().int().argmax(-1).int()
    first_unsure = torch.where(confident.all(-1), k, stop)
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


# -- a token tree's commit (core/round/tree_round.py) -----------------------------------------------
# What a tree round does after its walk, in one op: the sibling ranks of the accepted path, the staged
# ids, the slots each cache's compaction moves, the next round's inputs and every position. Why: as
# tensor operations these were some 50 kernels a round (0.10 ms of a round on an H200, against a
# chain round's 0.015 ms for its commit); gpu/kernels/tree_commit.py does them in one launch. B rows
# (a round alone: B = 1), integers only, so the kernel equals this exactly.


@dataclass(frozen=True)
class TreeCommitBuffers:
    """What a tree round's commit reads and writes, every tensor with a leading row dimension B
    (int64 unless said). The walk's (core/sampling/tree_walk.py): out [B, k + 1], path [B, k], shown
    [B, k], taken [B]. The tree's (core/round/tree.py): children [B, n + 1, w] (tree rows by rank),
    tokens [B, n + 1], and drawn [B, n + 1, w] where the ranks are read among drawn children (None:
    among `children`). The round's: num_drafts [B] int32, stage [B, 3k + 3] (out | shown | n | taken |
    ranks, the host's one copy), rows [B, k + 1] (written: the root's row 0, then path: the rows
    whose logits the host reads, and an EAGLE-3 head's next extend), feed [B, k + 1] (its column 0,
    `last`, written), the target's position [B], emitted [B], generated [B], target_slots [B, 2, k]
    (written: the target's compaction, sources then destinations). With a draft model: its position
    [B], pending [B, 2] and `ran` (its position moves by emitted - ran), and in its own rounds
    offset [B, n + 1] (a tree row's slot past its position) and draft_slots [B, 2, k - 1] (written:
    its compaction's)."""

    out: torch.Tensor
    path: torch.Tensor
    shown: torch.Tensor
    taken: torch.Tensor
    children: torch.Tensor
    tokens: torch.Tensor
    drawn: torch.Tensor | None
    num_drafts: torch.Tensor
    stage: torch.Tensor
    rows: torch.Tensor
    feed: torch.Tensor
    target_position: torch.Tensor
    emitted: torch.Tensor
    generated: torch.Tensor
    target_slots: torch.Tensor
    draft_position: torch.Tensor | None = None
    pending: torch.Tensor | None = None
    ran: int = 0
    offset: torch.Tensor | None = None
    draft_slots: torch.Tensor | None = None


def path_ranks(rows: torch.Tensor, out: torch.Tensor, emitted: torch.Tensor, taken: torch.Tensor,
               children: torch.Tensor, tokens: torch.Tensor, drawn: torch.Tensor | None,
               drawn_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Each accepted node's index among its parent's children, [B, k] (-1 past the accepted
    nodes): rows [B, k + 1] the root's tree row then the path's; out [B, k + 1] the walk's tokens;
    emitted, taken [B]; children [B, n + 1, w] and tokens [B, n + 1] the tree's; drawn [B, n + 1, w]
    the drawn children's tokens (None: no row's are drawn; drawn_rows [B] bool: the rows whose
    are, None: every row's). A node's token names it: siblings hold distinct tokens."""
    k = out.shape[1] - 1
    steps = torch.arange(k, device=out.device)
    parents = rows[:, :k]  # each depth's parent row (the root first)
    kids = children.gather(1, parents[:, :, None].expand(-1, -1, children.shape[2]))
    siblings = torch.where(kids >= 0, tokens.gather(1, kids.clamp(min=0).flatten(1)).view(kids.shape), -1)
    if drawn is not None:
        draws = drawn.gather(1, parents[:, :, None].expand(-1, -1, drawn.shape[2]))  # [B, k, w]
        siblings = draws if drawn_rows is None else torch.where(drawn_rows[:, None, None], draws, siblings)
    match = (siblings == out[:, :k, None]) & (siblings >= 0)
    accepted = emitted[:, None] - 1 + taken[:, None]
    return torch.where(match.any(2) & (steps < accepted), match.int().argmax(2), -1)


def tree_commit(b: TreeCommitBuffers) -> None:
    """m = emitted = out's ids >= 0 (an error sentinel makes it garbage, which the host raises on).
    Stages out, shown (where the walk ended on a draw it accepted outside the tree, `taken`, that
    draw at its depth m - 1: the draft proposed it there), n, taken and the ranks: each accepted
    node's index among its parent's children (its token names it: siblings hold distinct tokens;
    -1 past the accepted nodes). The target keeps the root and the m - 1 accepted nodes (slots
    past its position); a draft model, in its rounds, the m - 2 accepted nodes it stepped (its
    last two ids wait in `pending`). feed[0] and pending[1] take the newest token out[m - 1],
    pending[0] the one before it (the root where m = 1)."""
    k = b.path.shape[1]
    steps = torch.arange(k, device=b.out.device)
    emitted = (b.out >= 0).sum(1)  # [B]
    last = (emitted - 1).clamp(0, k)[:, None]  # [B, 1]
    taken = b.taken[:, None]
    root = b.feed[:, :1].clone()  # before feed[0] moves
    torch.cat([b.path[:, :1] * 0, b.path], dim=1, out=b.rows)
    ranks = path_ranks(b.rows, b.out, emitted, b.taken, b.children, b.tokens, b.drawn)
    shown = torch.where((taken > 0) & (steps == emitted[:, None] - 1), b.out[:, :k], b.shown)
    torch.cat([b.out, shown, b.num_drafts.long()[:, None], taken, ranks], dim=1, out=b.stage)
    # the compactions' slots, from the positions before they move
    target = b.target_position[:, None]
    dst = target + 1 + steps
    b.target_slots[:, 1].copy_(dst)
    b.target_slots[:, 0].copy_(torch.where(steps < emitted[:, None] - 1, target + b.path, dst))
    newest = b.out.gather(1, last)
    if b.draft_position is not None:
        if b.draft_slots is not None:
            draft = b.draft_position[:, None]
            dst = draft + steps[: k - 1]
            src = draft + b.offset.gather(1, b.path[:, : k - 1])
            b.draft_slots[:, 1].copy_(dst)
            b.draft_slots[:, 0].copy_(torch.where(steps[: k - 1] < emitted[:, None] - 2, src, dst))
        before = torch.cat([root, b.out], dim=1).gather(1, last)  # the root where m = 1
        b.pending.copy_(torch.cat([before, newest], dim=1))
        b.draft_position.add_(emitted - b.ran)
    b.feed[:, :1].copy_(newest)
    b.target_position.add_(emitted)
    b.emitted.copy_(emitted)
    b.generated.add_(emitted)
