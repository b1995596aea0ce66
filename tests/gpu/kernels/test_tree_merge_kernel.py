"""gpu/kernels/tree_merge.py against core/round/merged_tree.py's merge (the reference), through the
two ops tables (TritonRoundOps and TorchRoundOps): every buffer of the Tree and the point lanes
equal after the merge, over many random merged trees. The model's trees come from the builders
(core/round/tree.py, top-w and drawn children, scores that tie and -inf where the vocabulary runs
out) at depths 1, 2, 4 and 6, widths 2 and 4 and budgets of 4 to 32 nodes (up to the pool); some
have their scores scrambled afterwards (±inf, ties, a selection that is not ancestor-closed) so
that every branch of the ranks is taken. The lookup's tries are random: empty, one node, any
size, and as full as the envelope allows (every root lane the lookup's: no model node kept). And
in hybrid rounds on tiny models (the ngram lookup's real tries over the draft model's trees, top-w
and drawn): the kernel's merge equals the reference's in every merged round, and the text is
target-only's. On CPU (CI) the kernel runs in the Triton interpreter (tests/triton_cpu.py); on a GPU the compiled
kernel, with and without dependent launch.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import random
import types

import pytest
import torch

from decode_helpers import finish, make_profile
from kernel_inputs import tree_logq
from specgen.core.drafters.ngram import LookupTree
from specgen.core.engine import Engine, target_only
from specgen.core.round.host_tree import pack_tree, packed_sizes
from specgen.core.round.ops import TorchRoundOps
from specgen.core.round.tree import Tree, envelope
from specgen.core.settings import ProposerSpec
from specgen.gpu.round_ops import TritonRoundOps
from specgen.gpu.workspace import Workspace
from tiny_models import build_pair

DEPENDENT = [False, True] if DEVICE.type == "cuda" else [False]
VOCAB = 12


def _model_tree(k: int, w: int, n: int, drawn: bool, tied: bool, scrambled: bool, gen: torch.Generator) -> Tree:
    """A model's tree as its round's selection leaves it (the reference's builders)."""
    ops, tree = TorchRoundOps(), Tree(k, w, n, DEVICE, drawn=drawn)
    start = torch.tensor([int(torch.randint(0, 40, (1,), generator=gen))], device=DEVICE)

    def fed(rows: int):
        noise = torch.empty(rows, VOCAB).exponential_(generator=gen).to(DEVICE) if drawn else None
        return tree_logq(rows, VOCAB, gen, tied).to(DEVICE), noise

    tree.root(torch.randint(0, VOCAB, (1,), generator=gen).to(DEVICE), *fed(1), start, ops)
    for level in range(1, k):
        tree.expand(level, *fed(w), start, ops)
    tree.select(start + 7, ops)
    if scrambled:  # keys the builders never give: ±inf, ties everywhere, parents ranked below children
        grid = torch.tensor([float("-inf"), -1.0, -0.5, 0.0, float("inf")])
        tree.scores.copy_(grid[torch.randint(0, 5, tree.scores.shape, generator=gen)])
    return tree


def _lookup(k: int, w: int, n: int, size: str, gen: torch.Generator):
    """A random trie (LookupTree) packed as the host stages it: children [n+1, w], ids [n],
    parents [n+1]. size: empty, one, some (any number of nodes), full (as many as fit)."""
    tokens, parents, depth, kids = [], [], [], {-1: 0}
    want = {"empty": 0, "one": 1, "some": int(torch.randint(0, n + 1, (1,), generator=gen)), "full": n}[size]
    while len(tokens) < want:
        open_ = [p for p in range(-1, len(tokens)) if kids.get(p, 0) < w and (p < 0 or depth[p] < k)]
        if not open_:
            break
        p = open_[int(torch.randint(0, len(open_), (1,), generator=gen))] if size != "full" else open_[0]
        kids[p] = kids.get(p, 0) + 1
        depth.append(1 if p < 0 else depth[p] + 1)
        tokens.append(int(torch.randint(0, VOCAB, (1,), generator=gen)))
        parents.append(p)
    packed = pack_tree(LookupTree(tokens, parents), k, w, n).to(DEVICE)
    ids, up, children, *_ = packed.split(packed_sizes(k, w, n))
    return types.SimpleNamespace(ids=ids, parents=up, children=children.view(n + 1, w))


def _copy(tree: Tree) -> Tree:
    other = Tree(tree.k, tree.w, tree.n, DEVICE, drawn=tree.sampled)
    for name, value in tree.stack.buffers().items():
        getattr(other.stack, name).copy_(value)
    return other


def _merge_both(k: int, w: int, n: int, drawn: bool, tied: bool, scrambled: bool, size: str, seed: int,
                dependent: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    ours = _model_tree(k, w, n, drawn, tied, scrambled, gen)
    theirs = _copy(ours)
    lookup = _lookup(k, w, n, size, gen)
    start = torch.tensor([int(torch.randint(0, 100, (1,), generator=gen))], device=DEVICE)
    points = [torch.randint(0, 2, (n + 1, w), generator=gen).bool().to(DEVICE) for _ in range(2)]  # stale
    points[1].copy_(points[0])
    TritonRoundOps(Workspace(DEVICE), dependent).tree_merge(ours, lookup, start, points[0])
    TorchRoundOps().tree_merge(theirs, lookup, start, points[1])
    when = f"k={k} w={w} n={n} drawn={drawn} tied={tied} scrambled={scrambled} lookup={size} seed={seed}"
    for name, value in theirs.stack.buffers().items():
        got = getattr(ours.stack, name)
        assert torch.equal(got, value), f"{when}, {name}: kernel {got.tolist()} reference {value.tolist()}"
    assert torch.equal(points[0], points[1]), f"{when}, point: kernel {points[0].tolist()} reference {points[1].tolist()}"


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("drawn", [False, True], ids=["top-w", "drawn"])
@pytest.mark.parametrize("k, w", [(1, 2), (1, 4), (2, 2), (2, 4), (4, 2), (4, 4), (6, 2), (6, 4)])
def test_the_merge_kernel_matches_the_reference(k, w, drawn, dependent):
    pool = envelope(k, w)
    seed = 0
    for n in sorted({min(n, pool) for n in (4, 8, 16, 32)}):
        for size in ("empty", "one", "some", "some", "full"):
            for tied, scrambled in ((False, False), (True, False), (True, True)):
                seed += 1
                _merge_both(k, w, n, drawn, tied, scrambled, size, seed=1000 * k + 100 * w + seed, dependent=dependent)


def test_a_full_root_leaves_the_model_no_lane():
    """A trie that takes every lane of the root keeps no model node: the merged tree is the
    lookup's alone (the kernel's rows equal the reference's, and the model's rows are gone)."""
    k, w, n = 3, 2, 8
    gen = torch.Generator().manual_seed(3)
    tree = _model_tree(k, w, n, drawn=False, tied=False, scrambled=False, gen=gen)
    lookup = _lookup(k, w, n, "full", gen)
    assert int((lookup.children[0] >= 0).sum()) == w
    point = torch.zeros(n + 1, w, dtype=torch.bool, device=DEVICE)
    TritonRoundOps(Workspace(DEVICE)).tree_merge(tree, lookup, torch.tensor([5], device=DEVICE), point)
    assert torch.equal(tree.children, lookup.children) and torch.equal(tree.parents, lookup.parents)
    assert torch.equal(point, lookup.children >= 0) and int(tree.row_of.max()) == 0


class CheckedMerge(TorchRoundOps):
    """The references' table, but a round's merge is the kernel's, checked against the reference's
    on a copy of the same inputs."""

    def __init__(self):
        self.kernel, self.merged = TritonRoundOps(Workspace(DEVICE)), []

    def tree_merge(self, tree, lookup, start, point):
        want, want_point = _copy(tree), point.clone()
        super().tree_merge(want, lookup, start, want_point)
        self.kernel.tree_merge(tree, lookup, start, point)
        for name, value in want.stack.buffers().items():
            assert torch.equal(getattr(tree.stack, name), value), name
        assert torch.equal(point, want_point)
        self.merged.append((int((lookup.children >= 0).sum()), int((tree.row_of > 0).sum())))


@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.0, top_k=20, seed=3)], ids=["greedy", "drawn"])
def test_hybrid_rounds_merge_with_the_kernel(tmp_path, sampling):
    """Hybrid tree rounds (k = 4, width 3, 10 nodes) on repetitive prompts, the merge by the
    kernel: each merged round's tree equals the reference's merge of the same inputs, and greedy
    text is target-only's."""
    pair = build_pair(tmp_path, noisy=0.1)
    proposer = ProposerSpec(kind="hybrid", ngram_min=1, ngram_max=3)
    backend = "cuda" if DEVICE.type == "cuda" else "torch"  # on a GPU: rounds run eagerly (the table's references)
    profile = make_profile(pair[0], pair[1], k=4, backend=backend, proposer=proposer,
                           speculation=dict(tree_width=3, tree_nodes=10, hybrid_merge="always"), max_tokens=24,
                           **sampling)
    engine = Engine(profile)
    rng = random.Random(1)
    ops, table = CheckedMerge(), engine.backend.ops
    for _ in range(5):
        piece = [rng.randrange(engine.pair.vocab_size) for _ in range(rng.randint(2, 5))]
        prompt = piece * 3 + piece[:2]  # the lookup finds continuations
        want = finish(engine.decoder(target_only(profile)), prompt).token_ids
        engine.backend.ops = ops
        got = finish(engine.decoder(), prompt).token_ids
        engine.backend.ops = table
        if not sampling:
            assert got == want
    assert len(ops.merged) > 3 and any(m > 0 and kept > 0 for m, kept in ops.merged), ops.merged
