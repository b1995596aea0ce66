"""A crafted recursive walk (core/sampling/tree_walk.recursive_walk) whose outcome is known by
hand: trees where recursive rejection accepts a drawn child that the tree left out (the walk
ends on it, `taken` = 1), next to ones that follow an accepted child, recover or stop at the
limit. Shared by tests/core/sampling/test_tree_walk.py (the reference) and
tests/gpu/kernels/test_tree_walk_kernel.py (the kernel, the same outputs).

Every row has p = (0.2, 0.1, 0.7, 0) and q = (0, 0.5, 0.5, 0); Exp(1) all ones, so a race is
argmax p (2), or argmax r. With draws (1, 2) at a node: u_1 = 0.9 rejects 1 (0.9 · 0.5 > 0.1),
leaving r = (0.2, 0, 0.2, 0), z = 0.4 and q_2 = (0, 0, 1, 0); then u_2 = 0.25 accepts 2
(0.25 · 0.4 <= 0.2) and u_2 = 0.9 rejects it, leaving r = (0.2, 0, 0, 0): the recovered token is 0.
u_1 = 0.1 accepts 1 (0.05 <= 0.1); a first draw of 2 is accepted by u_1 = 0.5 (0.25 <= 0.7).
"""

from __future__ import annotations

import torch

K, WIDTH, ROWS, VOCAB = 2, 2, 3, 4
NONE = [-1, -1]
# per tree: (children [R, w], drawn [R, w], tokens [R], uniforms [k, w], limit)
TREES = [
    # 1 rejected, 2 accepted: not in the tree, the walk ends on it
    ([[1, -1], NONE, NONE], [[1, 2], NONE, NONE], [0, 1, 3], [[0.9, 0.25], [1, 1]], 2),
    # the same draws with 2 in the tree: the walk moves there, and recovers at the leaf (p's race)
    ([[1, 2], NONE, NONE], [[1, 2], NONE, NONE], [0, 1, 2], [[0.9, 0.25], [1, 1]], 2),
    # 1 accepted (row 1), whose first draw 2 is accepted outside the tree: ends at depth 1
    ([[1, -1], NONE, NONE], [[1, 2], [2, 1], NONE], [0, 1, 3], [[0.1, 1], [0.5, 1]], 2),
    # both rejected: recovered from the residual
    ([[1, -1], NONE, NONE], [[1, 2], NONE, NONE], [0, 1, 3], [[0.9, 0.9], [1, 1]], 2),
    # the first tree with no draft that counts: p's race, the same token, not a draft's
    ([[1, -1], NONE, NONE], [[1, 2], NONE, NONE], [0, 1, 3], [[0.9, 0.25], [1, 1]], 0),
    # the first draw, 2, accepted though only the second (1) is in the tree
    ([[-1, 1], NONE, NONE], [[2, 1], NONE, NONE], [0, 1, 3], [[0.1, 1], [1, 1]], 2),
]
OUT = [[2, -1, -1], [2, 2, -1], [1, 2, -1], [0, -1, -1], [2, -1, -1], [2, -1, -1]]
PATH = [[0, 0], [2, 0], [1, 0], [0, 0], [0, 0], [0, 0]]
TAKEN = [1, 0, 1, 0, 0, 1]


def outside_tree_inputs(device="cpu") -> tuple:
    """(children, drawn, tokens, probs, q, uniforms, expo, limit) of the TREES, for recursive_walk(..., K)."""
    batch = len(TREES)
    children, drawn, tokens, uniforms, limit = (torch.tensor([tree[i] for tree in TREES]) for i in range(5))
    probs = torch.tensor([0.2, 0.1, 0.7, 0.0]).expand(batch, ROWS, VOCAB).contiguous()
    q = torch.tensor([0.0, 0.5, 0.5, 0.0]).expand(batch, ROWS, VOCAB).contiguous()
    expo = torch.ones(batch, VOCAB)
    tensors = (children, drawn, tokens, probs, q, uniforms.float(), expo, limit.int())
    return tuple(t.to(device) for t in tensors)
