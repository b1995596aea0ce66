"""Verification of a token tree: the walk from the root, the torch reference (no host sync).

B trees at once (a round has one; the statistical tests walk many). Each comes as tree rows
(core/round/tree.py): row 0 the root, `children` [B, R, w] each row's children's rows by the
draft's rank (-1: none), `tokens` [B, R] each row's token. The walk visits one node per depth, at
most `limit` ([1] or [B] int32, the drafts that count) deep, and writes:

    out    [B, k + 1]: the accepted path's tokens, then the recovered or bonus token, then -1
    path   [B, k]: the accepted nodes' rows (0 past them)
    shown  [B, k]: per depth, the node the walk followed or, once stopped, the draft's best child
           below (its token is what the host reports as drafted; a branch that ends repeats its last)
    taken  [B] int64: 1 where the last emitted token is a child the walk accepted that is not in
           the tree (drawn children only: a drafted token the target accepted, which ends the walk
           as a recovered token would), else 0; the host counts it as accepted (core/round/tree_round.py)

Greedy and Gumbel coupling: `choice` [B, R] is the target's token at each row (its argmax, or the
race x = argmax p~/E with noise keyed by the row's absolute position); the walk moves to the child
whose token is x, else stops and emits x. Whatever the tree, the emitted tokens are the target's.

Rejection coupling (`sibling_walk`), exact for deterministic children c_1 .. c_w at a node with
the target's warped p: r = p; for each child, accept c_i with probability r(c_i) / sum(r) (u_i
sum(r) <= r(c_i), u_i ~ U(0, 1]), else set r(c_i) = 0; if every child is rejected, the token is
drawn from r / sum(r) (the race argmax r / E; from p where rounding left r all zero). Each step
is rejection sampling of a point mass against what is left of p, so the token follows p
(docs/sampling.md, "Token trees").

Rejection coupling with drawn children (`recursive_walk`), exact for children c_1 .. c_w drawn
from the draft's q without replacement, in that order: r = p, q_1 = q; accept c_i with probability
min(1, r(c_i) / q_i(c_i)); on rejection r <- max(0, r − q_i) normalised and q_(i+1) = q_i without
c_i, normalised; if every child is rejected, the token is drawn from r. A child accepted but not in
the tree (the budget left it out) is emitted and ends the walk, like a recovered token, but it is
a drafted token the target accepted: `taken` says so. At w = 1
this is the chain's rule (core/sampling/rejection.py), bit for bit.

Point masses among drawn children (`point`, a merged tree's: the hybrid proposer's lookup
children, deterministic functions of the committed sequence, q = δ_c): a node's point-mass lanes
come first, then its drawn ones. A point mass is tried against what is left of r with q = δ_c:
accept with probability r(c) / sum(r) (u z <= mass(c)), on rejection r(c) = 0 (max(0, r − δ_c)
normalised: the sibling rule), and q stays the draft's (the drawn children were drawn from it,
independently of the point masses' tests); the drawn children then take the recursive rule
against what is left. Without `point` the walk is the one above, bit for bit.

Sums over V (the normaliser of what is left at a node) are `total`'s: each value truncated to a
multiple of 2^-60 and added as an integer, so the sum is the same whatever the order of the adds,
and gpu/kernels/tree_walk.py, whose blocked passes add in another order than torch, computes the
same bits (a float32 sum would differ in its last bits with the order). The truncation (below
1e-18 a value) is far under float32's own rounding of a sum of order 1.
"""

from __future__ import annotations

from typing import Callable

import torch

# pick(depth, node, kids, kid_tokens, allowed) -> (hit, accepted, child index, token), each [B]:
# hit: the walk moves to a child in the tree; accepted: the token is a child accepted, in the tree
# (hit) or not; the token emitted at `node` (the accepted child's when accepted); kids, kid_tokens [B, w]
Pick = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
Walk = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # (out, path, shown, taken)


FIXED = 2.0**60  # the unit of `total`'s integer sums: rows of probabilities sum to < 8


def total(x: torch.Tensor) -> torch.Tensor:
    """x [B, V] >= 0 -> [B] float32: the sum of each row, in fixed point (exact, order-free)."""
    return (x * FIXED).long().sum(1).float() * (1.0 / FIXED)


def _at(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table [B, R, ...] at row index [B] of each tree -> [B, ...]."""
    return table[torch.arange(table.shape[0], device=table.device), index]


def walk(children: torch.Tensor, tokens: torch.Tensor, limit: torch.Tensor, k: int, pick: Pick,
         bonus: Callable[[torch.Tensor], torch.Tensor]) -> Walk:
    """(out [B, k + 1], path [B, k], shown [B, k], taken [B]); bonus(node): the token after k accepted."""
    b, device = tokens.shape[0], tokens.device
    out = torch.full((b, k + 1), -1, dtype=torch.long, device=device)
    path = torch.zeros(b, k, dtype=torch.long, device=device)
    shown = torch.zeros(b, k, dtype=torch.long, device=device)
    node = follow = torch.zeros(b, dtype=torch.long, device=device)
    alive = torch.ones(b, dtype=torch.bool, device=device)
    taken = torch.zeros(b, dtype=torch.bool, device=device)
    for depth in range(k):
        kids = _at(children, node)  # [B, w]
        kid_tokens = tokens.gather(1, kids.clamp(min=0))
        hit, accepted, index, token = pick(depth, node, kids, kid_tokens, alive & (limit > depth))
        taken = taken | (accepted & ~hit)  # accepted only where allowed: at most once, where the walk stops
        nxt = kids.gather(1, index[:, None])[:, 0]
        out[:, depth] = torch.where(alive, token, -1)
        path[:, depth] = torch.where(hit, nxt, 0)
        below = torch.where(hit, nxt, _at(children, follow)[:, 0])  # where the walk stopped: the draft's best
        follow = torch.where(below >= 0, below, follow)  # a branch that ends repeats its last token
        shown[:, depth] = tokens.gather(1, follow[:, None])[:, 0]
        alive, node = hit, torch.where(hit, nxt, node)
    out[:, k] = torch.where(alive, bonus(node), -1)
    return out, path, shown, taken.long()


def greedy_walk(children: torch.Tensor, tokens: torch.Tensor, choice: torch.Tensor, limit: torch.Tensor,
                k: int) -> Walk:
    """Follow the child equal to the target's token choice [B, R] at each node."""

    def pick(depth, node, kids, kid_tokens, allowed):
        x = choice.gather(1, node[:, None])[:, 0]
        match = (kids >= 0) & (kid_tokens == x[:, None])
        hit = match.any(1) & allowed
        return hit, hit, match.int().argmax(1), x

    return walk(children, tokens, limit, k, pick, lambda node: choice.gather(1, node[:, None])[:, 0])


def sibling_walk(children: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor, uniforms: torch.Tensor,
                 expo: torch.Tensor, limit: torch.Tensor, k: int) -> Walk:
    """Rejection coupling's walk: probs [B, R, V] the target's warped p per row, uniforms [B, k, w]
    in (0, 1], expo [B, V] Exp(1) (the one recovered or bonus token's race)."""

    def pick(depth, node, kids, kid_tokens, allowed):
        p = _at(probs, node)  # [B, V]
        left = p.clone()
        hit = torch.zeros_like(allowed)
        index = torch.zeros_like(node)
        for i in range(kids.shape[1]):
            token = kid_tokens[:, i : i + 1]
            valid = allowed & (kids[:, i] >= 0) & ~hit
            mass = left.gather(1, token)[:, 0]
            accept = valid & (uniforms[:, depth, i] * total(left) <= mass) & (mass > 0)
            index = torch.where(accept, i, index)
            hit = hit | accept
            left.scatter_(1, token, torch.where(valid & ~accept, 0.0, mass)[:, None])
        residual = torch.where((left > 0).any(1, keepdim=True), left, p)
        recovered = (residual / expo).argmax(1)
        return hit, hit, index, torch.where(hit, kid_tokens.gather(1, index[:, None])[:, 0], recovered)

    return walk(children, tokens, limit, k, pick, lambda node: (_at(probs, node) / expo).argmax(1))


def recursive_walk(children: torch.Tensor, drawn: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor,
                   q: torch.Tensor, uniforms: torch.Tensor, expo: torch.Tensor, limit: torch.Tensor,
                   k: int, point: torch.Tensor | None = None) -> Walk:
    """Rejection coupling's walk over drawn children: drawn [B, R, w] each row's children's tokens
    in draw order (-1: none drawn; children [B, R, w] their rows by the same rank, -1: not in the
    tree), q [B, R, V] the draft's warped q they were drawn from, probs, uniforms, expo as for
    sibling_walk. point [B, R, w] bool: lanes whose child is a point mass (before a row's drawn
    lanes; the module's text), None: none."""

    def pick(depth, node, kids, kid_tokens, allowed):
        p, draws = _at(probs, node), _at(drawn, node)  # [B, V], [B, w]
        flags = None if point is None else _at(point, node)  # [B, w]
        rest = _Residual(p, _at(q, node))
        accepted = torch.zeros_like(allowed)
        index = torch.zeros_like(node)
        for i in range(draws.shape[1]):
            token = draws[:, i : i + 1].clamp(min=0)
            valid = allowed & ~accepted & (draws[:, i] >= 0)
            mass = None if flags is None else flags[:, i]
            accept, tried = rest.try_draft(token, uniforms[:, depth, i], valid, mass)
            index = torch.where(accept, i, index)
            accepted = accepted | accept
            rest.reject(token, tried & ~accept, mass)
        chosen = draws.gather(1, index[:, None])[:, 0]
        hit = accepted & (kids.gather(1, index[:, None])[:, 0] >= 0)
        return hit, accepted, index, torch.where(accepted, chosen, rest.draw(expo))

    return walk(children, tokens, limit, k, pick, lambda node: (_at(probs, node) / expo).argmax(1))


class _Residual:
    """What is left at a node after rejected drafts: r = mass / z (mass unnormalised, z its sum;
    z = 1 at the start, so the first draft's test is the chain's u q(c) <= p(c) bit for bit) and
    the draft's q without the drafts tried, whose sum is 1 − taken."""

    def __init__(self, p: torch.Tensor, q: torch.Tensor):
        self.p, self.mass, self.left = p, p.clone(), q.clone()
        self.z = torch.ones(p.shape[0], device=p.device)
        self.kept = torch.ones(p.shape[0], device=p.device)  # 1 − the q mass of the drafts tried

    def try_draft(self, token: torch.Tensor, u: torch.Tensor, valid: torch.Tensor,
                  point: torch.Tensor | None = None) -> tuple:
        """(accepted, tried) [B]: accept when u q_i(c) z <= mass(c), i.e. u <= r(c) / q_i(c) (never
        where r(c) = 0, even once rounding has left z = 0); a token of q_i zero was not drawn (fewer
        than w ids had q > 0) and is not tried. point [B]: c is a point mass (q_i(c) = 1)."""
        qc = self.left.gather(1, token)[:, 0] / self.kept.clamp(min=1e-30)
        if point is not None:
            qc = torch.where(point, 1.0, qc)
        mass = self.mass.gather(1, token)[:, 0]
        tried = valid & (qc > 0)
        return tried & (mass > 0) & (u * qc * self.z <= mass), tried

    def reject(self, token: torch.Tensor, rejected: torch.Tensor, point: torch.Tensor | None = None) -> None:
        """r <- max(0, r − q_i) normalised, and c_i leaves q, where `rejected`; where c_i is a
        point mass (point [B]), r(c_i) = 0 alone and q stays (c_i was not drawn from it)."""
        q_i = self.left / self.kept.clamp(min=1e-30)[:, None]
        mass = (self.mass - self.z[:, None] * q_i).clamp(min=0.0)
        drawn = rejected
        if point is not None:
            mass = torch.where(point[:, None], self.mass.scatter(1, token, 0.0), mass)
            drawn = rejected & ~point
        rows = rejected[:, None]
        self.mass = torch.where(rows, mass, self.mass)
        self.z = torch.where(rejected, total(mass), self.z)
        taken = self.left.gather(1, token)[:, 0]
        self.kept = torch.where(drawn, self.kept - taken, self.kept)
        self.left = torch.where(drawn[:, None], self.left.scatter(1, token, 0.0), self.left)

    def draw(self, expo: torch.Tensor) -> torch.Tensor:
        """The token from r (the race argmax mass / E; from p where rounding left r all zero)."""
        residual = torch.where((self.mass > 0).any(1, keepdim=True), self.mass, self.p)
        return (residual / expo).argmax(1)
