"""gpu/kernels/commit.py against core/sampling/bookkeeping.py (the torch reference): every buffer equal after
count_drafts and after commit, over the states a round leaves (every accepted count, an error
sentinel, with and without a draft model, k from 0 to 32). On CPU (CI) the kernels run in the
Triton interpreter (tests/triton_cpu.py); on a GPU the same tests run the compiled kernels, with
and without dependent launch.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import dataclasses

import pytest
import torch

from gpu_helpers import assert_same_buffers, copy_buffers
from specgen.core.sampling import bookkeeping
from specgen.core.sampling.rejection import PLACEHOLDER
from specgen.gpu.kernels import commit as gpu_commit

DEPENDENT = [False, True] if DEVICE.type == "cuda" else [False]
LONG = dict(dtype=torch.long, device=DEVICE)


def _buffers(k: int, accepted: int, draft: bool, seed: int, sentinel: bool = False) -> bookkeeping.CommitBuffers:
    """A round's state after verification: `accepted` drafts kept, then the new token, then -1."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50_000, (2 * k + 4,), generator=gen)
    row = torch.full((k + 1,), PLACEHOLDER, dtype=torch.long)
    row[: accepted + 1] = ids[: accepted + 1]
    if sentinel:
        row[0] = -2  # gpu/kernels/verify.py's ERROR_BAD_LOGITS
    return bookkeeping.CommitBuffers(
        row=row.to(DEVICE), feed=ids[k + 2: 2 * k + 3].to(DEVICE),
        num_drafts=torch.tensor([accepted + int(ids[-1]) % (k + 1 - accepted)], dtype=torch.int32, device=DEVICE),
        stage=torch.full((2 * k + 2,), 7, **LONG), target_position=torch.tensor(1000 + seed, **LONG),
        emitted=torch.tensor(99, **LONG), generated=torch.tensor(40 + seed, **LONG),
        draft_position=torch.tensor(990 + seed, **LONG) if draft else None,
        pending=torch.tensor([3, 4], **LONG) if draft else None, ran=k + 1 + seed % 2)


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("draft", [True, False], ids=["draft-model", "no-draft"])
@pytest.mark.parametrize("k", [0, 1, 4, 7, 32])
def test_commit_matches_reference(k, draft, dependent):
    for accepted in sorted({0, k // 2, k}):
        ours = _buffers(k, accepted, draft, seed=accepted)
        theirs = copy_buffers(ours)
        before = ours.feed.clone()
        gpu_commit.commit(ours, dependent=dependent)
        bookkeeping.commit(theirs)
        assert_same_buffers(ours, theirs)
        # what the reference does, spelled out: the newest token leads the next feed
        assert ours.emitted.item() == accepted + 1 and ours.feed[0].item() == ours.row[accepted].item()
        assert torch.equal(ours.feed[1:], before[1:])
        if draft:
            assert ours.pending.tolist() == [before[accepted].item(), ours.row[accepted].item()]


def test_commit_error_sentinel_matches_reference():
    """A sentinel in the row's first id makes the counts garbage (the host raises on it); the
    kernel's garbage is the reference's."""
    ours = _buffers(4, 0, True, seed=3, sentinel=True)
    theirs = copy_buffers(ours)
    gpu_commit.commit(ours)
    bookkeeping.commit(theirs)
    assert_same_buffers(ours, theirs)
    assert ours.stage[0].item() == -2


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("k", [1, 4, 8, 32])
def test_count_drafts_matches_reference(k, dependent):
    gen = torch.Generator().manual_seed(k)
    cases = [(torch.ones(k, dtype=torch.bool), k, 1 << 62, 0),  # everything counts
             (torch.ones(k, dtype=torch.bool), 0, 1 << 62, 5),  # the host allows none
             (torch.ones(k, dtype=torch.bool), k, 10, 8),  # two before max_tokens
             (torch.ones(k, dtype=torch.bool), k, 10, 12)]  # past it: none, never negative
    for _ in range(6):
        cases.append((torch.rand(k, generator=gen) > 0.3, int(torch.randint(0, k + 1, (1,), generator=gen)),
                      int(torch.randint(0, 60, (1,), generator=gen)), int(torch.randint(0, 60, (1,), generator=gen))))
    for confident, budget, limit, generated in cases:
        args = (confident.to(DEVICE), torch.tensor([budget], dtype=torch.int32, device=DEVICE),
                torch.tensor(limit, **LONG), torch.tensor(generated, **LONG))
        ours = torch.full((1,), -5, dtype=torch.int32, device=DEVICE)
        theirs = ours.clone()
        gpu_commit.count_drafts(*args, ours, dependent=dependent)
        bookkeeping.count_drafts(*args, theirs)
        assert torch.equal(ours, theirs), (confident.tolist(), budget, limit, generated, ours, theirs)
        unsure = [i for i, sure in enumerate(confident.tolist()) if not sure]
        assert ours.item() == min(budget, unsure[0] if unsure else k, max(0, min(k, limit - generated)))


def _rows_of(rows: list[bookkeeping.CommitBuffers]) -> bookkeeping.CommitBuffers:
    """One-request buffers stacked as a batch's (core/round/batch_round.py): rows leading."""
    def stack(name):
        values = [getattr(r, name) for r in rows]
        if values[0] is None:
            return None
        shape = () if name == "num_drafts" else values[0].shape  # [B] int32, as the batch's
        return torch.stack(values).reshape(len(rows), *shape).contiguous()
    names = [f.name for f in dataclasses.fields(rows[0]) if f.name != "ran"]
    return bookkeeping.CommitBuffers(**{name: stack(name) for name in names}, ran=rows[0].ran)


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("draft", [True, False], ids=["draft-model", "no-draft"])
@pytest.mark.parametrize("k", [0, 1, 4, 7])
def test_commit_rows_equals_each_row_committed_alone(k, draft, dependent):
    """A batch of rows at every accepted count (and one error sentinel): the kernel and the
    reference over the batch each equal the one-row reference applied to every row."""
    alone = [_buffers(k, accepted, draft, seed=7) for accepted in range(k + 1)]
    alone.append(_buffers(k, 0, draft, seed=7, sentinel=True))
    alone = [dataclasses.replace(b, ran=k + 1) for b in alone]
    ours, theirs = _rows_of(alone), _rows_of(alone)
    gpu_commit.commit_rows(ours, dependent=dependent)
    bookkeeping.commit_rows(theirs)
    for b in alone:
        bookkeeping.commit(b)
    assert_same_buffers(ours, _rows_of(alone))
    assert_same_buffers(theirs, _rows_of(alone))


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("k", [1, 4, 8])
def test_count_drafts_rows_equals_each_row_counted_alone(k, dependent):
    gen = torch.Generator().manual_seed(k)
    batch = 9
    # each row its own flags (draft_p_min): every row sure, and rows cut at random steps
    confident = (torch.rand(batch, k, generator=gen) < 0.8).to(DEVICE)
    confident[:2] = True
    budget = torch.randint(0, k + 1, (batch,), generator=gen, dtype=torch.int32).to(DEVICE)
    limit = torch.randint(0, 60, (batch,), generator=gen).to(DEVICE)
    generated = torch.randint(0, 60, (batch,), generator=gen).to(DEVICE)
    ours = torch.full((batch,), -5, dtype=torch.int32, device=DEVICE)
    theirs = ours.clone()
    gpu_commit.count_drafts_rows(confident, budget, limit, generated, ours, dependent=dependent)
    bookkeeping.count_drafts_rows(confident, budget, limit, generated, theirs)
    for b in range(batch):
        one = torch.full((1,), -5, dtype=torch.int32, device=DEVICE)
        bookkeeping.count_drafts(confident[b], budget[b:b + 1], limit[b], generated[b], one)
        assert ours[b].item() == theirs[b].item() == one.item(), b
