"""gpu/kernels/tree_build.py against core/round/tree.py's grow and pick (the references): every
buffer of the Tree equal after each level's expansion and after the selection, through the two
ops tables (TritonRoundOps and TorchRoundOps, the children by each table's tree_children: the
kernels of gpu/kernels/topw.py against the reference), for top-w and drawn children, with scores that tie
(log q on a coarse grid, and -inf where the vocabulary runs out of finite entries), over depths 1
to 6, widths 2 to 4 and budgets from one node to the whole pool (pools past a block of 64). Stacks of
B = 1, 3 and 7 trees (a batch's rows, each with its own inputs, starts and drawn or top-w children)
built in one call per level: both tables equal, and every row equal to its tree built alone. On CPU
(CI) the kernels run in the Triton interpreter (tests/triton_cpu.py); on a GPU the same tests run the
compiled kernels, with and without dependent launch.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from kernel_inputs import tree_logq
from specgen.core.round.ops import TorchRoundOps
from specgen.core.round.tree import Tree, TreeStack, draw_children, envelope
from specgen.core.step import rows as rowsets
from specgen.gpu.round_ops import TritonRoundOps
from specgen.gpu.workspace import Workspace

DEPENDENT = [False, True] if DEVICE.type == "cuda" else [False]
VOCAB = 12


def _same(ours: Tree, theirs: Tree, when: str) -> None:
    for name, value in vars(theirs).items():
        if isinstance(value, torch.Tensor):
            got = getattr(ours, name)
            assert torch.equal(got, value), f"{when}, {name}: kernel {got.tolist()} reference {value.tolist()}"


def _build(k: int, w: int, n: int, drawn: bool, tied: bool, seed: int, dependent: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    trees = [Tree(k, w, n, DEVICE, drawn=drawn) for _ in range(2)]
    tables = [TritonRoundOps(Workspace(DEVICE), dependent), TorchRoundOps()]
    draft_start = torch.tensor([30 + seed], device=DEVICE)
    target_start = torch.tensor([100 + seed], device=DEVICE)

    def fed(rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        logq = tree_logq(rows, VOCAB, gen, tied).to(DEVICE)
        noise = torch.empty(rows, VOCAB).exponential_(generator=gen).to(DEVICE) if drawn else None
        return logq, noise

    for _round in range(2):  # a second round over the first's buffers: nothing stale survives
        root_id = torch.randint(0, VOCAB, (1,), generator=gen).to(DEVICE)
        logq, noise = fed(1)
        for tree, ops in zip(trees, tables):
            tree.root(root_id, logq, noise, draft_start, ops)
        _same(*trees, "root")
        for level in range(1, k):
            logq, noise = fed(w)
            for tree, ops in zip(trees, tables):
                tree.expand(level, logq, noise, draft_start, ops)
            _same(*trees, f"level {level}")
        for tree, ops in zip(trees, tables):
            tree.select(target_start, ops)
        _same(*trees, "select")
        ours = trees[0]
        want = rowsets.tree(ours.ids, ours.parents, target_start, levels=k + 1)
        got = ours.target_rows(target_start)
        for field in ("ids", "positions", "slots", "tail", "depth"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("tied", [False, True], ids=["random", "tied"])
@pytest.mark.parametrize("drawn", [False, True], ids=["top-w", "drawn"])
@pytest.mark.parametrize("k, w", [(1, 3), (2, 2), (2, 4), (3, 3), (4, 2), (4, 4), (5, 3)])
def test_tree_kernels_match_the_reference(k, w, drawn, tied, dependent):
    size = envelope(k, w)
    for n in sorted({1, min(k + 1, size), size // 2, size}):
        _build(k, w, n, drawn, tied, seed=n + 10 * k + w, dependent=dependent)


@pytest.mark.slow
@pytest.mark.parametrize("drawn", [False, True], ids=["top-w", "drawn"])
def test_tree_kernels_match_the_reference_past_a_block(drawn):
    """Pools and tree rows longer than the kernels' blocks of 64: the rank and row loops chunk."""
    for k, w, n in [(5, 4, 40), (5, 4, 68), (6, 4, 70)]:
        _build(k, w, n, drawn, tied=True, seed=k + n, dependent=False)
        _build(k, w, n, drawn, tied=False, seed=k + n, dependent=False)


def _same_stack(ours: TreeStack, theirs: TreeStack, when: str) -> None:
    for name, value in theirs.buffers().items():
        got = getattr(ours, name)
        assert torch.equal(got, value), f"{when}, {name}: kernel {got.tolist()} reference {value.tolist()}"


def _same_row(stack: TreeStack, b: int, alone: Tree, when: str) -> None:
    for name, value in alone.stack.buffers().items():
        got = getattr(stack, name)[b : b + 1]
        assert torch.equal(got, value), f"{when}, row {b}, {name}: batched {got.tolist()} alone {value.tolist()}"


def _batched(batch: int, k: int, w: int, n: int, seed: int, dependent: bool) -> None:
    """Rows tied or not (alternately), drawn or top-w (in a pattern that changes between the two
    rounds: a row that stops drawing keeps its `drawn`), each with its own starts and root: each
    level's children from the reference's draw_children over every row's log q (a top-w row's
    noise rows are ones, as the batch round gives them), then one call over the stack on each
    table, and one call per row over B trees alone."""
    gen = torch.Generator().manual_seed(seed)
    tables = [TritonRoundOps(Workspace(DEVICE), dependent), TorchRoundOps()]
    stacks = [TreeStack(batch, k, w, n, DEVICE) for _ in tables]
    alone = [[Tree(k, w, n, DEVICE) for _ in range(batch)] for _ in tables]
    for round_ in range(2):
        drawn = [(b + round_) % 3 != 0 for b in range(batch)]
        for stack, trees in zip(stacks, alone):
            stack.draws.copy_(torch.tensor(drawn, device=DEVICE))
            for tree, flag in zip(trees, drawn):
                tree.sampled = flag
        draft_start = torch.randint(0, 50, (batch,), generator=gen).to(DEVICE)
        target_start = draft_start + 60 + torch.randint(0, 9, (batch,), generator=gen).to(DEVICE)
        root_id = torch.randint(0, VOCAB, (batch,), generator=gen).to(DEVICE)

        def expand(level: int, rows: int) -> None:
            logq = torch.cat([tree_logq(rows, VOCAB, gen, tied=b % 2 == 1) for b in range(batch)])  # [B rows, V]
            noise = torch.empty(batch * rows, VOCAB).exponential_(generator=gen)
            noise[~torch.tensor(drawn).repeat_interleave(rows)] = 1.0
            tokens, values = (t.to(DEVICE) for t in draw_children(logq, noise, w))  # [B rows, w]
            root = root_id if level == 0 else None
            for stack, trees, ops in zip(stacks, alone, tables):
                ops.tree_expand(stack, level, tokens, values, draft_start, root)
                for b, tree in enumerate(trees):
                    at = slice(b * rows, (b + 1) * rows)
                    ops.tree_expand(tree.stack, level, tokens[at], values[at], draft_start[b : b + 1],
                                    None if root is None else root[b : b + 1])

        def check(when: str) -> None:
            _same_stack(*stacks, when)
            for stack, trees in zip(stacks, alone):
                for b, tree in enumerate(trees):
                    _same_row(stack, b, tree, when)

        expand(0, 1)
        check(f"round {round_} root")
        for level in range(1, k):
            expand(level, w)
            check(f"round {round_} level {level}")
        for stack, trees, ops in zip(stacks, alone, tables):
            ops.tree_select(stack, target_start)
            for b, tree in enumerate(trees):
                ops.tree_select(tree.stack, target_start[b : b + 1])
        check(f"round {round_} select")


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("batch", [1, 3, 7])
@pytest.mark.parametrize("k, w, n", [(1, 3, 2), (3, 2, 6), (4, 3, 12), (5, 3, 39)])
def test_a_stack_of_trees_is_each_row_alone(k, w, n, batch, dependent):
    """One call per level over B rows equals B calls over trees alone, on both tables, and the
    tables agree: every buffer bit for bit."""
    _batched(batch, k, w, n, seed=batch * 100 + k * 10 + w, dependent=dependent)


def test_a_tree_is_its_stacks_row():
    """Each Tree of a stack is a view of its row (what a batch's steps and walks read is what the
    ops wrote), and its `sampled` is its row's `draws` on the device."""
    stack = TreeStack(3, 3, 2, 5, DEVICE)
    trees = [Tree(3, 2, 5, DEVICE, stack=stack.row(b)) for b in range(3)]
    for b, tree in enumerate(trees):
        for name, value in stack.buffers().items():
            assert getattr(tree, name).data_ptr() == value[b].data_ptr() and getattr(tree, name).shape == value[b].shape
    trees[1].sampled = True
    assert stack.draws.tolist() == [False, True, False] and trees[1].sampled and not trees[0].sampled
