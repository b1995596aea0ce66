"""gpu/kernels/tree_commit.py against core/sampling/bookkeeping.tree_commit (the torch reference):
every buffer equal after a tree round's commit, over the states a walk leaves (every accepted
count, a draw taken outside the tree, an error sentinel), ranks read among the tree's children or
among drawn children, with a draft model that compacts (its own rounds), one that only follows (a
host tree's rounds) and none, one row and several. On CPU (CI) the kernel runs in the Triton
interpreter (tests/triton_cpu.py); on a GPU the same tests run the compiled kernel, with and
without dependent launch.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import dataclasses

import pytest
import torch

from gpu_helpers import assert_same_buffers, copy_buffers
from specgen.core.sampling import bookkeeping
from specgen.gpu.kernels import tree_commit as gpu_tree_commit

DEPENDENT = [False, True] if DEVICE.type == "cuda" else [False]
LONG = dict(dtype=torch.long, device=DEVICE)


def _buffers(rows: int, k: int, w: int, nodes: int, accepted: list[int], drawn: bool, draft: str, seed: int,
             taken: bool = False, sentinel: bool = False) -> bookkeeping.TreeCommitBuffers:
    """A walk's outputs over random trees: row b accepted accepted[b] nodes, whose tokens are
    often their parent's children's (so ranks are found), then the emitted token, then -1."""
    gen = torch.Generator().manual_seed(seed)

    def ints(low, high, *shape):
        return torch.randint(low, high, shape, generator=gen)

    children = ints(-1, nodes + 1, rows, nodes + 1, w)
    tokens = ints(0, 60, rows, nodes + 1)
    table = ints(-1, 60, rows, nodes + 1, w)  # drawn children's tokens
    path = torch.zeros(rows, k, dtype=torch.long)
    out = torch.full((rows, k + 1), -1, dtype=torch.long)
    for b, m in enumerate(accepted):
        path[b, :m] = ints(1, nodes + 1, m)
        parents = torch.cat([torch.zeros(1, dtype=torch.long), path[b, :k]])
        for d in range(m + 1):
            kids = table[b, parents[d]] if drawn else tokens[b, children[b, parents[d]].clamp(min=0)]
            out[b, d] = kids[int(ints(0, w, 1))] if int(ints(0, 4, 1)) else int(ints(0, 60, 1))
    if sentinel:
        out[:, 0] = -2  # gpu/kernels/verify.py's ERROR_BAD_LOGITS
    compacts = draft == "compacts" and k > 1
    return bookkeeping.TreeCommitBuffers(
        out=out.to(DEVICE), path=path.to(DEVICE), shown=ints(0, 60, rows, k).to(DEVICE),
        taken=torch.tensor([int(taken and m < k) for m in accepted], **LONG),
        children=children.to(DEVICE), tokens=tokens.to(DEVICE), drawn=table.to(DEVICE) if drawn else None,
        num_drafts=ints(0, k + 1, rows).int().to(DEVICE), stage=torch.full((rows, 3 * k + 3), 7, **LONG),
        rows=torch.full((rows, k + 1), 5, **LONG), feed=ints(0, 60, rows, k + 1).to(DEVICE),
        target_position=ints(100, 200, rows).to(DEVICE), emitted=torch.full((rows,), 99, **LONG),
        generated=ints(0, 50, rows).to(DEVICE), target_slots=torch.full((rows, 2, k), 3, **LONG),
        draft_position=ints(100, 200, rows).to(DEVICE) if draft != "none" else None,
        pending=ints(0, 60, rows, 2).to(DEVICE) if draft != "none" else None,
        ran=2 if draft == "compacts" else k + 2,
        offset=ints(-1, 3 * w, rows, nodes + 1).to(DEVICE) if compacts else None,
        draft_slots=torch.full((rows, 2, k - 1), 4, **LONG) if compacts else None)


def _check(buffers: bookkeeping.TreeCommitBuffers, dependent: bool = False) -> bookkeeping.TreeCommitBuffers:
    theirs = copy_buffers(buffers)
    gpu_tree_commit.tree_commit(buffers, dependent=dependent)
    bookkeeping.tree_commit(theirs)
    assert_same_buffers(buffers, theirs)
    return buffers


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("draft", ["compacts", "follows", "none"])
@pytest.mark.parametrize("drawn", [False, True], ids=["children", "drawn"])
@pytest.mark.parametrize("k, w, nodes", [(1, 2, 2), (2, 3, 5), (4, 4, 16), (7, 2, 9)])
def test_tree_commit_matches_reference(k, w, nodes, drawn, draft, dependent):
    for taken in (False, True):
        for accepted in sorted({0, k // 2, k}):
            before = _buffers(1, k, w, nodes, [accepted], drawn, draft, seed=accepted + 10 * k, taken=taken)
            feed = before.feed.clone()
            ours = _check(before, dependent)
            m = accepted + 1
            # what the reference does, spelled out: the newest token leads the next feed; the
            # target moves past it; the root's row leads the path's rows
            assert ours.emitted.tolist() == [m] and ours.feed[0, 0] == ours.out[0, accepted]
            assert ours.rows[0, 0] == 0 and torch.equal(ours.rows[0, 1:], ours.path[0])
            assert torch.equal(ours.stage[0, : k + 1], ours.out[0]) and torch.equal(ours.feed[0, 1:], feed[0, 1:])
            if draft != "none":
                ids = [feed[0, 0].item()] + ours.out[0].tolist()  # the root, then the round's tokens
                assert ours.pending[0].tolist() == ids[accepted : accepted + 2]


def test_tree_commit_rows_are_each_rows_own():
    """Several rows in one launch: each row's buffers as that row's alone."""
    buffers = _buffers(3, 4, 3, 12, [0, 2, 4], True, "compacts", seed=5, taken=True)
    _check(buffers)
    for b, m in enumerate([0, 2, 4]):
        alone = _buffers(3, 4, 3, 12, [0, 2, 4], True, "compacts", seed=5, taken=True)
        row = dataclasses.replace(alone, **{f.name: getattr(alone, f.name)[b : b + 1].clone()
                                            for f in dataclasses.fields(alone)
                                            if isinstance(getattr(alone, f.name), torch.Tensor)})
        bookkeeping.tree_commit(row)
        assert torch.equal(row.stage[0], buffers.stage[b]) and row.emitted.item() == m + 1


def test_tree_commit_error_sentinel_matches_reference():
    """A sentinel in out's first id makes the counts garbage (the host raises on it); the
    kernel's garbage is the reference's."""
    ours = _check(_buffers(1, 3, 2, 5, [2], False, "compacts", seed=3, sentinel=True))
    assert ours.stage[0, 0].item() == -2
