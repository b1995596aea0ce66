"""core/round/rows.py: the logits-row processors, each against its reference (core/sampling/warp.py)."""

from __future__ import annotations

import torch

from round_helpers import shared
from specgen.core.sampling import warp as sampling
from specgen.core.round.rows import LogitsRows, MinTokens, NoPenalties, Padding, Penalties
from specgen.core.sampling.warp import WarpParams
from specgen.core.settings import SamplingSpec


def penalties(k: int = 4, width: int = 20) -> Penalties:
    rows = Penalties(k, width, torch.arange(k + 1), torch.device("cpu"))
    rows.start([1, 2, 2, 5])
    rows.commit(torch.tensor([5, 6, 6, -1, -1]))  # a round that emitted three ids
    return rows


def test_penalty_rows_equal_the_reference():
    """Target row i counts the output and drafts[:i]; draft step i's row equals target row i after
    the picks before it."""
    rows, drafts = penalties(), torch.tensor([6, 3, 3, 9])
    assert rows.counts.tolist()[5:7] == [1, 2] and bool(rows.seen[[1, 2, 5, 6]].all())
    want = sampling.penalty_rows(rows.counts, rows.seen, drafts)
    got = rows.target_rows(drafts)
    assert torch.equal(got.counts, want.counts) and torch.equal(got.seen, want.seen)
    rows.begin()
    for i, token in enumerate(drafts):
        step = rows.draft_row()
        assert torch.equal(step.counts[0], want.counts[i]) and torch.equal(step.seen[0], want.seen[i]), i
        rows.picked(token.view(1))


def test_no_penalties_build_nothing():
    rows = NoPenalties()
    assert rows.draft_row() is None and rows.target_rows(torch.tensor([1])) is None and rows.state() == []


def test_masks_cover_padding_and_stop_ids_below_min_tokens():
    k, width, vocab = 3, 12, 10
    generated, steps = torch.tensor(2), torch.arange(k + 1)
    assert Padding(width, width, torch.device("cpu")).target_rows() is None
    padding = Padding(width, vocab, torch.device("cpu")).target_rows()
    assert padding.tolist() == [False] * vocab + [True] * (width - vocab)
    mask = MinTokens(width, vocab, [4, 11, 40], 4, generated, steps)  # 40: not a column
    rows = mask.target_rows()
    for i in range(k + 1):
        stops = generated + i < 4
        assert rows[i].nonzero().flatten().tolist() == ([4] if stops else []) + [10, 11], i
        assert torch.equal(mask.draft_row(i)[0], rows[i]), i


def test_plain_rows_only_without_penalties_or_masks():
    params = WarpParams.from_spec(SamplingSpec(), 2)
    cpu = torch.device("cpu")
    assert LogitsRows(params, params, NoPenalties(), Padding(8, 8, cpu)).plain
    assert not LogitsRows(params, params, NoPenalties(), Padding(8, 6, cpu)).plain
    assert not LogitsRows(params, params, penalties(1, 8), Padding(8, 8, cpu)).plain
    rnd = shared(2, 8)
    min_tokens = MinTokens(8, 8, [1], 2, rnd.generated, rnd.steps)
    rows = LogitsRows(params, params, NoPenalties(), min_tokens)
    assert not rows.plain and rows.target_rows(rnd.drafts) is rows.last and rows.last[2].shape == (3, 8)
