"""gpu/kernels/tree_walk.py against core/sampling/tree_walk.py (the torch references): out, path,
shown and taken equal (torch.equal) for the greedy, sibling and recursive walks.

Random trees of several shapes (k, width, rows), B > 1, limits 0, 1 and k (one for all
trees) and one per tree, small token ranges so that children match, duplicate siblings, drawn
children missing from the tree and drafts of q = 0; vocabularies of one block and of several
(8193: a pass over V in three blocks, the last one short). On CPU (CI) the kernel runs in the Triton interpreter
(tests/triton_cpu.py); on a GPU the same tests run the compiled kernel.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from specgen.core.sampling import tree_walk
from specgen.core.sampling import warp as sampling
from specgen.gpu.kernels import tree_walk as gpu_walk
from specgen.gpu.workspace import Workspace
from tree_walk_cases import K, OUT, TAKEN, outside_tree_inputs

SHAPES = [(1, 1, 2), (2, 2, 5), (3, 3, 12), (4, 2, 9), (5, 4, 24)]  # (k, width, rows)
# (shape, seed) of the sampled walks: three random tree sets a shape, one for the widest, whose
# node launches (a program a row and lane) take the interpreter ~20 s a case
SAMPLED = [(shape, seed) for shape in SHAPES[:-1] for seed in range(3)] + [
    pytest.param(SHAPES[-1], 0, marks=pytest.mark.slow)]


def random_tree(k: int, width: int, rows: int, batch: int, gen: torch.Generator):
    """children [B, R, w] (-1: none) of random trees of depth <= k, each row's children by rank."""
    children = torch.full((batch, rows, width), -1, dtype=torch.long)
    for b in range(batch):
        depth, count = [0], [0] * rows
        for row in range(1, rows):
            parents = [r for r in range(row) if depth[r] < k and count[r] < width]
            parent = parents[int(torch.randint(len(parents), (1,), generator=gen))]
            children[b, parent, count[parent]] = row
            count[parent] += 1
            depth.append(depth[parent] + 1)
    return children


def limits(k: int, batch: int, gen: torch.Generator) -> list[torch.Tensor]:
    """No draft counts, one, all k (one limit for every tree), and one limit per tree."""
    each = [torch.tensor([n], dtype=torch.int32) for n in sorted({0, 1, k})]
    return [t.to(DEVICE) for t in each + [torch.randint(0, k + 1, (batch,), generator=gen, dtype=torch.int32)]]


def probabilities(batch: int, rows: int, vocab: int, gen: torch.Generator, draft: float | None = None):
    """Warped-looking rows: peaked, with ids of probability 0 (as top-k leaves them); with `draft`,
    (p, q) where q is p's logits plus that much noise, masked apart."""
    logits = torch.randn(batch, rows, vocab, generator=gen) * 3

    def warped(x):
        x = x.masked_fill(torch.rand(batch, rows, vocab, generator=gen) < 0.3, float("-inf"))
        x[..., 0] = 0.0  # never a row all masked
        return torch.softmax(x, dim=-1)

    if draft is None:
        return warped(logits)
    return warped(logits), warped(logits + torch.randn(batch, rows, vocab, generator=gen) * draft)


def assert_walks_equal(want, got) -> None:
    assert len(want) == len(got) == 4
    for name, a, b in zip(("out", "path", "shown", "taken"), want, got):
        assert torch.equal(a, b), f"{name}:\n{a.tolist()}\n{b.tolist()}"


def on(*tensors):
    return [t.to(DEVICE) for t in tensors]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", range(3))
def test_greedy_walk_kernel_equals_the_reference(shape, seed):
    k, width, rows = shape
    batch = 6
    gen = torch.Generator().manual_seed(seed * 31 + rows)
    children = random_tree(k, width, rows, batch, gen)
    tokens = torch.randint(0, 3, (batch, rows), generator=gen)
    choice = torch.randint(0, 3, (batch, rows), generator=gen)
    children, tokens, choice = on(children, tokens, choice)
    workspace = Workspace(DEVICE)
    for limit in limits(k, batch, gen):
        want = tree_walk.greedy_walk(children, tokens, choice, limit, k)
        assert_walks_equal(want, gpu_walk.greedy_walk(children, tokens, choice, limit, k, workspace))


def sibling_inputs(shape, batch: int, vocab: int, gen: torch.Generator):
    k, width, rows = shape
    children = random_tree(k, width, rows, batch, gen)
    probs = probabilities(batch, rows, vocab, gen)
    # each child's token drawn from its parent's p (often accepted), and some siblings repeated
    tokens = torch.zeros(batch, rows, dtype=torch.long)
    for b, row, rank in (children >= 0).nonzero().tolist():
        tokens[b, children[b, row, rank]] = torch.multinomial(probs[b, row], 1, generator=gen)[0]
        if rank and torch.rand(1, generator=gen) < 0.2:
            tokens[b, children[b, row, rank]] = tokens[b, children[b, row, 0]]
    uniforms = sampling.uniforms((batch, k, width), gen, "cpu")
    expo = sampling.exponentials((batch, vocab), gen, "cpu")
    return on(children, tokens, probs, uniforms, expo)


@pytest.mark.parametrize(("shape", "seed"), SAMPLED)
def test_sibling_walk_kernel_equals_the_reference(shape, seed):
    batch, vocab = 5, 40
    gen = torch.Generator().manual_seed(seed * 17 + shape[2])
    children, tokens, probs, uniforms, expo = sibling_inputs(shape, batch, vocab, gen)
    workspace = Workspace(DEVICE)
    for limit in limits(shape[0], batch, gen):
        want = tree_walk.sibling_walk(children, tokens, probs, uniforms, expo, limit, shape[0])
        got = gpu_walk.sibling_walk(children, tokens, probs, uniforms, expo, limit, shape[0], workspace)
        assert_walks_equal(want, got)


def recursive_inputs(shape, batch: int, vocab: int, gen: torch.Generator):
    """Each row's w draws from its q without replacement (some rows draw fewer: -1), a random part
    of them in the tree, and now and then a draft q gives 0 (not tried)."""
    k, width, rows = shape
    children = random_tree(k, width, rows, batch, gen)
    probs, q = probabilities(batch, rows, vocab, gen, draft=1.0)
    noise = sampling.exponentials((batch, rows, vocab), gen, "cpu")
    drawn = (q.log() - noise.log()).topk(width, dim=-1).indices  # Gumbel-top-w
    drawn[torch.rand(batch, rows, width, generator=gen) < 0.15] = -1  # fewer drawn (the rest follow suit)
    drawn = torch.where((drawn < 0).cumsum(-1) > 0, -1, drawn)
    zero = torch.rand(batch, rows, generator=gen) < 0.2  # the first draw's q is 0 at some rows
    q.scatter_(2, drawn[..., :1].clamp(min=0), torch.where(zero[..., None], 0.0, q.gather(2, drawn[..., :1].clamp(min=0))))
    tokens = torch.randint(0, vocab, (batch, rows), generator=gen)
    for b in range(batch):
        for row in range(rows):
            for rank in range(width):
                child = int(children[b, row, rank])
                if child >= 0:
                    if int(drawn[b, row, rank]) < 0 or torch.rand(1, generator=gen) < 0.2:
                        children[b, row, rank] = -1  # not in the tree (drawn, or not drawn at all)
                    else:
                        tokens[b, child] = drawn[b, row, rank]
    uniforms = sampling.uniforms((batch, k, width), gen, "cpu")
    expo = sampling.exponentials((batch, vocab), gen, "cpu")
    return on(children, drawn, tokens, probs, q, uniforms, expo)


@pytest.mark.parametrize(("shape", "seed"), SAMPLED)
def test_recursive_walk_kernel_equals_the_reference(shape, seed):
    batch, vocab = 5, 40
    gen = torch.Generator().manual_seed(seed * 13 + shape[2])
    inputs = recursive_inputs(shape, batch, vocab, gen)
    workspace = Workspace(DEVICE)
    for limit in limits(shape[0], batch, gen):
        want = tree_walk.recursive_walk(*inputs, limit, shape[0])
        assert_walks_equal(want, gpu_walk.recursive_walk(*inputs, limit, shape[0], workspace))


def with_point_masses(inputs, gen: torch.Generator):
    """recursive_inputs with point-mass lanes (a merged tree's lookup children): each row's first
    0 .. w lanes hold tokens of their own (distinct, often the p's likeliest, now and then a later
    draw's: that draw then has r = 0) flagged in `point`; their rows, where in the tree, take them."""
    children, drawn, tokens, probs, q, uniforms, expo = (t.cpu() for t in inputs)
    batch, rows, width = drawn.shape
    point = torch.zeros(batch, rows, width, dtype=torch.bool)
    for b in range(batch):
        for row in range(rows):
            lanes = int(torch.randint(0, width + 1, (1,), generator=gen))
            picks = probs[b, row].argsort(descending=True)[:width].tolist()
            for lane in range(lanes):
                token = picks[lane]
                if torch.rand(1, generator=gen) >= 0.7:
                    token = int(torch.randint(40, (1,), generator=gen))
                if token in drawn[b, row, :lane].tolist():
                    continue  # siblings hold distinct tokens
                drawn[b, row, lane], point[b, row, lane] = token, True
                if children[b, row, lane] >= 0:
                    tokens[b, children[b, row, lane]] = token
    return on(children, drawn, tokens, probs, q, uniforms, expo) + on(point)


@pytest.mark.parametrize(("shape", "seed"), SAMPLED)
def test_recursive_walk_kernel_with_point_masses_equals_the_reference(shape, seed):
    batch, vocab = 5, 40
    gen = torch.Generator().manual_seed(seed * 7 + shape[2])
    *inputs, point = with_point_masses(recursive_inputs(shape, batch, vocab, gen), gen)
    assert point.any() and not point.all()
    workspace = Workspace(DEVICE)
    for limit in limits(shape[0], batch, gen):
        want = tree_walk.recursive_walk(*inputs, limit, shape[0], point=point)
        got = gpu_walk.recursive_walk(*inputs, limit, shape[0], workspace, point=point)
        assert_walks_equal(want, got)


@pytest.mark.parametrize("walk", ["sibling", "recursive"])
def test_sampled_walks_over_several_vocabulary_blocks(walk):
    """8193 ids: each pass over V (sums, races) runs over three blocks, the last one short."""
    shape, batch, vocab = (3, 2, 7), 3, 8193
    gen = torch.Generator().manual_seed(5)
    limit = torch.tensor([3], dtype=torch.int32, device=DEVICE)
    workspace = Workspace(DEVICE)
    if walk == "sibling":
        inputs = sibling_inputs(shape, batch, vocab, gen)
        want = tree_walk.sibling_walk(*inputs, limit, 3)
        got = gpu_walk.sibling_walk(*inputs, limit, 3, workspace)
    else:
        inputs = recursive_inputs(shape, batch, vocab, gen)
        want = tree_walk.recursive_walk(*inputs, limit, 3)
        got = gpu_walk.recursive_walk(*inputs, limit, 3, workspace)
    assert_walks_equal(want, got)


def test_the_walks_cover_acceptance_rejection_and_the_bonus():
    """The random inputs above reach every outcome: whole paths (bonus), recovered tokens, a child
    accepted after its elder sibling was rejected (the sums after a rejection), and drawn children
    accepted outside the tree."""
    gen = torch.Generator().manual_seed(0)
    shape, batch = (3, 3, 12), 100
    limit = torch.tensor([3], dtype=torch.int32, device=DEVICE)
    children, tokens, probs, uniforms, expo = sibling_inputs(shape, batch, 40, gen)
    out, _, _, taken = tree_walk.sibling_walk(children, tokens, probs, uniforms, expo, limit, 3)
    kid_tokens = tokens.gather(1, children[:, 0].clamp(min=0))  # the root's children's
    later = (out[:, :1] == kid_tokens[:, 1:]).any(1) & (out[:, 0] != kid_tokens[:, 0]) & (children[:, 0, 1] >= 0)
    emitted = (out >= 0).sum(1)
    assert (emitted == 4).any() and (emitted == 1).any() and later.any()
    assert not taken.any()  # the tree holds every sibling
    children, drawn, *rest = recursive_inputs(shape, batch, 40, gen)
    out, path, _, taken = tree_walk.recursive_walk(children, drawn, *rest, limit, 3)
    later = (out[:, :1] == drawn[:, 0, 1:]).any(1) & (out[:, 0] != drawn[:, 0, 0])
    outside = ((out[:, :1] == drawn[:, 0]) & (children[:, 0] < 0)).any(1) & (path[:, 0] == 0)  # a draw, no row
    emitted = (out >= 0).sum(1)
    assert (emitted == 4).any() and (emitted == 1).any() and later.any() and outside.any()
    # taken: the walk ended on an accepted draw outside the tree, at the root (where it is one of
    # `outside`'s: a draw, no row) and deeper down
    taken, root = taken.bool(), path[:, 0] == 0
    assert (taken & root).any() and not (taken & root & ~outside).any() and (taken & ~root).any()


@pytest.mark.parametrize("width", [1, 2])
def test_a_residual_rounded_to_zero_draws_from_p(width):
    """A rejection that leaves r all zero (p just under q everywhere: max(0, p - q) = 0) makes
    the recovered token p's race, which the kernel runs as a pass of its own; with a second
    drawn lane, that lane meets z = 0 and is not accepted. Both as the reference."""
    vocab = 8193  # passes over several blocks
    gen = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(1, 2, vocab, generator=gen), -1)
    probs = q * 0.999
    drawn = torch.tensor([[[5, 9][:width], [-1] * width]])
    children = torch.tensor([[[1] + [-1] * (width - 1), [-1] * width]])
    tokens = torch.tensor([[0, 5]])
    uniforms = torch.ones(1, 1, width)  # u q z = q(5) > p(5): rejected
    expo = torch.empty(1, vocab).exponential_(generator=gen)
    inputs = on(children, drawn, tokens, probs, q, uniforms, expo)
    limit = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    want = tree_walk.recursive_walk(*inputs, limit, 1)
    assert want[0][0, 0].item() == int((probs[0, 0] / expo[0]).argmax()) and want[1][0, 0].item() == 0
    assert_walks_equal(want, gpu_walk.recursive_walk(*inputs, limit, 1, Workspace(DEVICE)))


def test_the_kernel_takes_the_crafted_draws_outside_the_tree():
    """tests/tree_walk_cases.py: the walks that end on a draw accepted outside the tree, and
    those that do not, as the reference (and by hand)."""
    want = tree_walk.recursive_walk(*outside_tree_inputs(), K)
    got = gpu_walk.recursive_walk(*outside_tree_inputs(DEVICE), K, Workspace(DEVICE))
    assert_walks_equal(want, [t.cpu() for t in got])
    assert got[3].tolist() == TAKEN and got[0].tolist() == OUT


def test_an_error_flag_leaves_the_sentinel():
    """The warp kernel's error flag (bad logits) turns out[b, 0] into verify.py's sentinel."""
    gen = torch.Generator().manual_seed(1)
    children, tokens = on(random_tree(2, 2, 5, 3, gen), torch.randint(0, 3, (3, 5), generator=gen))
    workspace = Workspace(DEVICE)
    workspace.error.fill_(1)
    out, _, _, _ = gpu_walk.greedy_walk(children, tokens, tokens, torch.tensor([2], dtype=torch.int32, device=DEVICE),
                                     2, workspace)
    assert out[:, 0].tolist() == [-2, -2, -2]
