"""core/sampling/tree_walk.py: verification of a token tree.

Greedy (and Gumbel) walk: against a plain-Python walk on random trees. The sibling walk
(rejection coupling): the tokens it emits follow the target's warped distribution at every node,
under every warp combination (χ², like tests/test_lossless.py), and a rule that does not zero the
rejected siblings fails the same test.

Setup of the χ² tests: vocab 30, a full tree of depth 2 and width 2 (rows: 0 the root, 1-2 its
children, 3-6 theirs), fixed target logits per row and the children as the top-2 of draft logits
(the target's plus noise) at their parent, as core/round/tree.py picks them. ROUNDS rounds walk
the same tree in one batch. At the root the first token must follow p_0; among the rounds whose
first token is child c's, the second must follow p_c; among those that went on to grandchild g,
the third (the bonus) p_g. Pearson χ² with bins of expectation < 5 pooled; a token of target
probability 0 must never appear. Each comparison uses alpha = 1e-6 / COMPARISONS, so a correct
walk fails this file with probability <= 1e-6. Power: the wrong rule moves about 10% of the
mass at the root (p-value far below 1e-20 at these counts).
"""

from __future__ import annotations

import random

import pytest
import torch
from scipy import stats

from specgen.core.sampling import tree_walk
from specgen.core.sampling import warp as sampling
from specgen.core.settings import SamplingSpec

VOCAB, DEPTH, WIDTH = 30, 2, 2
ROUNDS = 40_000
PARENTS = [-1, 0, 0, 1, 1, 2, 2]  # tree rows: a full binary tree of depth 2 below the root
COMBOS = {
    "t0.5": dict(temperature=0.5),
    "t1": dict(temperature=1.0),
    "t1.5": dict(temperature=1.5),
    "top_k": dict(temperature=1.0, top_k=4),
    "top_p": dict(temperature=1.0, top_p=0.8),
    "min_p": dict(temperature=1.0, min_p=0.1),
    "all": dict(temperature=0.8, top_k=12, top_p=0.9, min_p=0.05),
}
COMPARISONS = len(COMBOS) * len(PARENTS)
ALPHA = 1e-6 / COMPARISONS


def full_tree(seed: int, combo: dict, draft_noise: float = 1.0):
    """(children [R, w], tokens [R], probs [R, V]) of the fixed tree; the root's token is 0."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(len(PARENTS), VOCAB, generator=gen) * 2
    draft = target + torch.randn(len(PARENTS), VOCAB, generator=gen) * draft_noise
    tokens = torch.zeros(len(PARENTS), dtype=torch.long)
    children = torch.full((len(PARENTS), WIDTH), -1, dtype=torch.long)
    for parent in range(len(PARENTS)):
        kids = [i for i, p in enumerate(PARENTS) if p == parent]
        if kids:
            tokens[kids] = draft[parent].topk(WIDTH).indices
            children[parent] = torch.tensor(kids)
    params = sampling.WarpParams.from_spec(SamplingSpec(**combo), len(PARENTS))
    _, probs = sampling.warp(target, params)
    return children, tokens, probs


def walk_many(children, tokens, probs, seed: int, pick=None):
    """ROUNDS walks of the one tree with fresh uniforms and Exp(1) draws: out [ROUNDS, DEPTH + 1]."""
    gen = torch.Generator().manual_seed(seed)
    batch = (lambda t: t.expand(ROUNDS, *t.shape))
    uniforms = sampling.uniforms((ROUNDS, DEPTH, WIDTH), gen, "cpu")
    expo = sampling.exponentials((ROUNDS, VOCAB), gen, "cpu")
    limit = torch.tensor([DEPTH], dtype=torch.int32)
    if pick is None:
        return tree_walk.sibling_walk(batch(children), batch(tokens), batch(probs), uniforms, expo, limit, DEPTH)[0]
    return tree_walk.walk(batch(children), batch(tokens), limit, DEPTH, pick(probs, uniforms, expo),
                          lambda node: (probs[node] / expo).argmax(1))[0]


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    assert observed[expected == 0].sum() == 0, "a token with target probability 0 was emitted"
    big = expected >= 5
    small = ~big & (expected > 0)
    obs, exp = observed[big].tolist(), expected[big].tolist()
    if small.any():  # pooled; joined to the smallest big bin when too little to stand alone
        if expected[small].sum() >= 5:
            obs.append(float(observed[small].sum()))
            exp.append(float(expected[small].sum()))
        else:
            j = min(range(len(exp)), key=exp.__getitem__)
            obs[j] += float(observed[small].sum())
            exp[j] += float(expected[small].sum())
    if len(obs) < 2:
        return 1.0
    total = sum(obs) / sum(exp)  # float32 rows sum to 1 within rounding only
    return float(stats.chisquare(obs, [e * total for e in exp]).pvalue)


def node_pvalues(out: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor, rows: int = len(PARENTS)) -> list[float]:
    """Per tree row (the first `rows`): the χ² p-value of the tokens emitted right after reaching it."""
    pvalues = []
    for row in range(rows):
        path, node = [], row
        while node > 0:
            path.insert(0, int(tokens[node]))
            node = PARENTS[node]
        reached = torch.ones(out.shape[0], dtype=torch.bool)
        for depth, token in enumerate(path):
            reached &= out[:, depth] == token
        emitted = out[reached, len(path)]
        counts = torch.bincount(emitted, minlength=VOCAB).double()
        pvalues.append(chi2_pvalue(counts, probs[row].double() * int(reached.sum())))
    return pvalues


@pytest.mark.parametrize("combo", list(COMBOS))
def test_sibling_walk_emits_the_target_distribution_at_every_node(combo):
    children, tokens, probs = full_tree(len(combo), COMBOS[combo])
    out = walk_many(children, tokens, probs, seed=len(combo) + 100)
    assert (out[:, DEPTH] >= 0).any(), "no round accepted a whole path"
    assert min(node_pvalues(out, tokens, probs)) > ALPHA


def _no_zeroing(probs, uniforms, expo):
    """The wrong rule: each sibling accepted with probability p(c_i), the rejected ones left in p."""

    def pick(depth, node, kids, kid_tokens, allowed):
        p = probs[node]
        hit = torch.zeros_like(allowed)
        index = torch.zeros_like(node)
        for i in range(kids.shape[1]):
            mass = p.gather(1, kid_tokens[:, i : i + 1])[:, 0]
            accept = allowed & (kids[:, i] >= 0) & ~hit & (uniforms[:, depth, i] <= mass)
            index = torch.where(accept, i, index)
            hit = hit | accept
        token = torch.where(hit, kid_tokens.gather(1, index[:, None])[:, 0], (p / expo).argmax(1))
        return hit, index, token

    return pick


def test_a_walk_that_keeps_rejected_siblings_fails():
    children, tokens, probs = full_tree(7, COMBOS["t1"], draft_noise=0.0)  # children: the target's own top 2
    assert min(node_pvalues(walk_many(children, tokens, probs, seed=8), tokens, probs)) > ALPHA
    wrong = walk_many(children, tokens, probs, seed=8, pick=_no_zeroing)
    assert node_pvalues(wrong, tokens, probs, rows=1)[0] < ALPHA


def test_the_walk_stops_at_the_drafts_that_count():
    """limit 1: the second token is drawn at the child from p (no sibling of depth 2 is tried)."""
    children, tokens, probs = full_tree(3, COMBOS["t1"])
    gen = torch.Generator().manual_seed(4)
    rounds = 5000
    uniforms = sampling.uniforms((rounds, DEPTH, WIDTH), gen, "cpu")
    expo = sampling.exponentials((rounds, VOCAB), gen, "cpu")
    out, path, _ = tree_walk.sibling_walk(children.expand(rounds, -1, -1), tokens.expand(rounds, -1),
                                          probs.expand(rounds, -1, -1), uniforms, expo,
                                          torch.tensor([1], dtype=torch.int32), DEPTH)
    assert (out[:, 2] == -1).all() and (path[:, 1] == 0).all()
    went = out[:, 0] == tokens[1]
    assert torch.equal(out[went, 1], (probs[1] / expo[went]).argmax(1))


def python_greedy(children: list[list[int]], tokens: list[int], choice: list[int], limit: int, k: int):
    out, path, node = [], [], 0
    for depth in range(k):
        x = choice[node]
        nxt = next((c for c in children[node] if c >= 0 and tokens[c] == x), None) if depth < limit else None
        out.append(x)
        if nxt is None:
            return out + [-1] * (k + 1 - len(out)), path + [0] * (k - len(path))
        path.append(nxt)
        node = nxt
    return out + [choice[node]], path


@pytest.mark.parametrize("seed", range(6))
def test_greedy_walk_follows_the_targets_tokens(seed):
    rng = random.Random(seed)
    k, w, rows = 3, 3, 12
    parents = [-1] + [rng.randrange(0, r) for r in range(1, rows)]
    children = [[c for c in range(rows) if parents[c] == r][:w] for r in range(rows)]
    children = [kids + [-1] * (w - len(kids)) for kids in children]
    tokens = [rng.randrange(4) for _ in range(rows)]
    choice = [rng.randrange(4) for _ in range(rows)]
    limit = rng.randint(0, k)
    out, path, _ = tree_walk.greedy_walk(torch.tensor(children)[None], torch.tensor(tokens)[None],
                                         torch.tensor(choice)[None], torch.tensor([limit], dtype=torch.int32), k)
    want_out, want_path = python_greedy(children, tokens, choice, limit, k)
    assert out[0].tolist() == want_out and path[0].tolist() == want_path
