"""core/round/batch_rows.py: each batch row's penalties and min_tokens mask equal the chain round's
processors (core/round/rows.py) for that row alone."""

from __future__ import annotations

import torch

from specgen.core.round.batch_rows import BatchLogitsRows, BatchMinTokens, BatchPenalties
from specgen.core.round.rows import MinTokens, Penalties
from specgen.core.round.staging import Staging
from specgen.core.settings import SamplingSpec

CPU = torch.device("cpu")
K, WIDTH, VOCAB = 3, 16, 14
PROMPTS = [[1, 2, 2, 5], [7], [3, 3, 3, 9, 0]]
# each row's rounds: (drafts [k], output row [k + 1]: emitted ids, then -1)
ROUNDS = [[([6, 3, 3], [6, 3, -1, -1]), ([2, 2, 8], [2, 2, 8, 1])],
          [([4, 4, 4], [9, -1, -1, -1]), ([1, 5, 1], [1, 5, 13, -1])],
          [([0, 1, 2], [0, 1, 2, 3]), ([3, 3, 3], [11, -1, -1, -1])]]


def test_each_rows_penalties_equal_the_chain_rounds():
    """Draft step i and the k + 1 target rows of every batch row, over two rounds, equal Penalties'
    for that row alone; its counts are its output's (the commit counts each row's own ids)."""
    batch = BatchPenalties(len(PROMPTS), K + 1, WIDTH, CPU, Staging(CPU))
    alone = [Penalties(K, WIDTH, torch.arange(K + 1), CPU) for _ in PROMPTS]
    for b, (ids, single) in enumerate(zip(PROMPTS, alone)):
        batch.start(b, ids)
        single.start(ids)
    active = torch.ones(len(PROMPTS), dtype=torch.bool)
    for r in range(2):
        drafts = torch.tensor([rounds[r][0] for rounds in ROUNDS])
        out = torch.tensor([rounds[r][1] for rounds in ROUNDS])
        batch.begin()
        for single in alone:
            single.begin()
        for i in range(K):
            rows = batch.draft_row()
            for b, single in enumerate(alone):
                want = single.draft_row()
                assert torch.equal(rows.counts[b], want.counts[0]) and torch.equal(rows.seen[b], want.seen[0])
                single.picked(drafts[b, i : i + 1])
            batch.picked(drafts[:, i].contiguous())
        rows = batch.target_rows(drafts)
        for b, single in enumerate(alone):
            want, at = single.target_rows(drafts[b]), slice(b * (K + 1), (b + 1) * (K + 1))
            assert torch.equal(rows.counts[at], want.counts) and torch.equal(rows.seen[at], want.seen), (r, b)
            single.commit(out[b])
        batch.commit(out, active)
    for b, rounds in enumerate(ROUNDS):
        emitted = torch.tensor([t for _, row in rounds for t in row if t >= 0])
        assert torch.equal(batch.counts[b], torch.bincount(emitted, minlength=WIDTH).int()), b
        assert torch.equal(batch.counts[b], alone[b].counts) and torch.equal(batch.seen[b], alone[b].seen)


def test_a_row_without_a_prompt_counts_nothing_and_a_refill_clears_its_row():
    batch = BatchPenalties(2, K + 1, WIDTH, CPU, Staging(CPU))
    batch.start(0, [4, 5])
    batch.start(1, [6])
    batch.commit(torch.tensor([[1, 1, -1, -1], [2, 3, 4, 5]]), torch.tensor([True, False]))
    assert batch.counts[0].nonzero().flatten().tolist() == [1] and batch.counts[0, 1] == 2
    assert not batch.counts[1].any() and batch.seen[1].nonzero().flatten().tolist() == [6]
    batch.start(0, [9])
    assert not batch.counts[0].any() and batch.seen[0].nonzero().flatten().tolist() == [9]


def test_each_rows_min_tokens_mask_equals_the_chain_rounds():
    """Rows with their own stop ids, eos (or ignore_eos), min_tokens and tokens so far: draft step
    i's mask and the target rows' equal MinTokens' for that row alone (padding columns included)."""
    eos = [13]
    specs = [SamplingSpec(min_tokens=4, stop_token_ids=(2, 40), ignore_eos=False), SamplingSpec(),
             SamplingSpec(min_tokens=3, ignore_eos=True, stop_token_ids=(5,)), SamplingSpec(min_tokens=9)]
    generated = torch.tensor([2, 0, 1, 8])
    steps = torch.arange(K + 1)
    batch = BatchMinTokens(len(specs), K + 1, WIDTH, VOCAB, eos, generated, Staging(CPU))
    for b, spec in enumerate(specs):
        batch.start(b, spec)
    rows = batch.target_rows()
    drafts = [batch.draft_row(i).clone() for i in range(K)]
    for b, spec in enumerate(specs):
        stops = sorted(set(spec.stop_token_ids) | (set() if spec.ignore_eos else set(eos)))
        single = MinTokens(WIDTH, VOCAB, stops, spec.min_tokens, generated[b], steps)
        assert torch.equal(rows[b * (K + 1): (b + 1) * (K + 1)], single.target_rows()), b
        for i in range(K):
            assert torch.equal(drafts[i][b], single.draft_row(i)[0]), (b, i)
    assert rows[: K + 1, 2].tolist() == [True, True, False, False]  # 2 + i < 4
    assert not rows[K + 1: 2 * (K + 1), :VOCAB].any()  # min_tokens 0: the padding alone


def test_rows_without_parts_hand_the_padding_alone():
    padding = torch.zeros(WIDTH, dtype=torch.bool)
    rows = BatchLogitsRows(None, None, padding)
    assert rows.plain and rows.state() == []
    penalties, bad = rows.draft_row(0)
    assert penalties is None and bad is padding
    penalties, bad = rows.target_rows(torch.zeros(2, K, dtype=torch.long))
    assert penalties is None and bad is padding


def test_each_tree_row_counts_the_drafts_on_its_path_and_masks_by_its_depth():
    """A tree's rows (BatchPenalties.tree_rows, BatchMinTokens.tree_rows): row r of row b counts b's
    output and the ids of r's ancestors below the root and its own; a row at depth d is masked as a
    chain's row d - 1. Two rows' trees: root, a child, its child, and a second child of the root."""
    ids = torch.tensor([[3, 5, 5, 7], [1, 2, 9, 2]])
    path = torch.tensor([[0, 0, 0], [0, 1, 0], [0, 1, 2], [0, 3, 0]]).expand(2, -1, -1)  # past a depth: unread
    depth = torch.tensor([[1, 2, 3, 2]] * 2)
    penalties = BatchPenalties(2, 4, WIDTH, CPU, Staging(CPU))
    penalties.start(0, [8])
    penalties.start(1, [])
    penalties.commit(torch.tensor([[5, 4, -1, -1], [6, -1, -1, -1]]), torch.ones(2, dtype=torch.bool))
    rows = penalties.tree_rows(ids, path, depth)
    on_path = {0: [[], [5], [5, 5], [7]], 1: [[], [2], [2, 9], [2]]}
    for b in range(2):
        for r in range(4):
            want = penalties.counts[b] + torch.bincount(torch.tensor(on_path[b][r], dtype=torch.long),
                                                        minlength=WIDTH).int()
            assert torch.equal(rows.counts[b * 4 + r], want), (b, r)
            assert torch.equal(rows.seen[b * 4 + r], penalties.seen[b] | (want > 0)), (b, r)
    generated = torch.tensor([1, 5])
    mask = BatchMinTokens(2, 4, WIDTH, VOCAB, [13], generated, Staging(CPU))
    mask.start(0, SamplingSpec(min_tokens=3))
    mask.start(1, SamplingSpec(min_tokens=3))
    bad = mask.tree_rows(depth)
    assert bad[:4, 13].tolist() == [True, True, False, True]  # 1 + d - 1 < 3
    assert not bad[4:, :VOCAB].any()  # 5 tokens already: nothing masked but the padding
