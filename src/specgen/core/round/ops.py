"""The round's ops: the table of tensor operations the round's parts call (warp, argmax, the race,
Gumbel noise, verification, the draft count, the commit, a token tree's construction and its
walks), chosen once by the backend.

`TorchRoundOps` is the table of references (core/sampling/warp.py, core/sampling/rejection.py,
core/sampling/noise.py, core/sampling/bookkeeping.py, core/round/tree.py, core/round/merged_tree.py,
core/sampling/tree_walk.py): what the torch backend runs, and the CUDA backend too where the
target's kernel policy turns the round's kernels off. gpu/round_ops.py's `TritonRoundOps` computes
the same results with Triton kernels (tests/gpu/test_round_ops.py compares the two on one round's
inputs, tests/gpu/kernels/test_tree_build_kernel.py the tree's and test_tree_merge_kernel.py the
merged tree's). A table holds what its calls share (the Triton one: the device's workspace and the
dependent-launch flag), so the parts pass only their tensors.
"""

from __future__ import annotations

from typing import Protocol

import torch

from specgen.core.round import merged_tree
from specgen.core.round import tree as tree_build
from specgen.core.sampling import bookkeeping

from specgen.core.sampling import noise

from specgen.core.sampling import rejection

from specgen.core.sampling import tree_walk

from specgen.core.sampling import warp as sampling
from specgen.core.sampling.bookkeeping import CommitBuffers, TreeCommitBuffers


class RoundOps(Protocol):
    capturable: bool  # no op syncs with the host: a round on this table may be captured as a graph

    def warp(self, logits, params, penalties=None, bad_mask=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(argmax [N], probs [N, V] or None when every row is greedy): core/sampling/warp.warp."""

    def argmax(self, logits, out) -> None: ...

    def warp_and_race(self, logits, params, expo, out, penalties=None, bad_mask=None,
                      probs_out=None) -> torch.Tensor | None:
        """warp, then the race's ids into out; returns the probs (None when every row is greedy),
        which are probs_out, filled, when it is given."""

    def gumbel_noise(self, out, key, first) -> None:
        """out <- Exp(1) rows from (key, first + row, id): core/sampling/noise.exponential."""

    def verify_greedy(self, drafts, cu, target_argmax, max_spec_len: int) -> torch.Tensor: ...

    def verify_random(self, drafts, cu, draft_probs, target_probs, uniforms, expo,
                      max_spec_len: int) -> torch.Tensor: ...

    def greedy_walk(self, children, tokens, choice, limit, k: int) -> tuple:
        """A token tree's walk (out, path, shown, taken): core/sampling/tree_walk.py's, as are the two below."""

    def sibling_walk(self, children, tokens, probs, uniforms, expo, limit, k: int) -> tuple: ...

    def recursive_walk(self, children, drawn, tokens, probs, q, uniforms, expo, limit, k: int,
                       point=None) -> tuple: ...

    def count_drafts(self, confident, budget, limit, generated, out) -> None: ...

    def commit(self, buffers: CommitBuffers) -> None: ...

    def tree_commit(self, buffers: TreeCommitBuffers) -> None:
        """A tree round's commit after its walk, B rows at once: core/sampling/bookkeeping.tree_commit."""

    def tree_logq(self, logits, params, bad_mask=None) -> torch.Tensor:
        """A tree level's warped log q [R, V] from the drafter's logits [R, V] (float32), whose top-w
        are the level's children: core/sampling/warp.logprobs_from_logits (no penalties)."""

    def tree_children(self, logq, noise, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [R, w], log q [R, w]): each row's top-w of log q [R, V] (of log q − log E with
        noise E [R or 1, V]), larger first, ties to the lower id: core/round/tree.draw_children."""

    def tree_expand(self, trees, level: int, tokens, logq, start, root_id=None) -> None:
        """Every tree of a TreeStack (B rows; a Tree's own stack: B = 1) at once: each row's level
        from its children (tokens, log q [B w, w]; level 0: the roots' [B, w], root_id [B]), its
        next frontier and its draft rows past its start [B]: core/round/tree.grow."""

    def tree_select(self, trees, start) -> None:
        """Every tree of a TreeStack at once: each row's n best nodes as rows, and the target's
        rows past its start [B]: core/round/tree.pick."""

    def tree_merge(self, tree, lookup, start, point) -> None:
        """A hybrid round's merged tree: `tree` (a Tree, as its selection left it) rewritten as the
        lookup's staged trie (a StagedLookup) and the tree's best nodes, with the target's rows
        past start [1], and point [n + 1, w] the lookup's lanes: core/round/merged_tree.merge."""
    # -- a batch's rows (core/round/batch_round.py): B rows in one call, each as it computes alone --

    def gumbel_noise_rows(self, out, key, first) -> None:
        """out [B, R, V] <- each sequence's Exp(1) rows from its key [B, 2] and first [B]."""

    def count_drafts_rows(self, confident, budget, limit, generated, out) -> None: ...

    def commit_rows(self, buffers: CommitBuffers) -> None: ...


class TorchRoundOps:
    """The references. They raise inside warp (bad logits, all masked) and sync to do so: a round on
    them runs eagerly."""

    capturable = False

    def warp(self, logits, params, penalties=None, bad_mask=None):
        return sampling.warp(logits, params, penalties, bad_mask)

    def argmax(self, logits, out):
        torch.argmax(logits, dim=-1, out=out)

    def warp_and_race(self, logits, params, expo, out, penalties=None, bad_mask=None, probs_out=None):
        argmax, probs = sampling.warp(logits, params, penalties, bad_mask)
        out.copy_(argmax if probs is None else sampling.sample_race(probs, expo))
        return probs if probs is None or probs_out is None else probs_out.copy_(probs)

    def gumbel_noise(self, out, key, first):
        out.copy_(noise.uniform(key, first, *out.shape))
        noise.exponential_(out)

    def verify_greedy(self, drafts, cu, target_argmax, max_spec_len):
        return rejection.verify_greedy(drafts, cu, target_argmax, max_spec_len)

    def verify_random(self, drafts, cu, draft_probs, target_probs, uniforms, expo, max_spec_len):
        return rejection.verify_random(drafts, cu, draft_probs, target_probs, uniforms, expo, max_spec_len)

    def greedy_walk(self, children, tokens, choice, limit, k):
        return tree_walk.greedy_walk(children, tokens, choice, limit, k)

    def sibling_walk(self, children, tokens, probs, uniforms, expo, limit, k):
        return tree_walk.sibling_walk(children, tokens, probs, uniforms, expo, limit, k)

    def recursive_walk(self, children, drawn, tokens, probs, q, uniforms, expo, limit, k, point=None):
        return tree_walk.recursive_walk(children, drawn, tokens, probs, q, uniforms, expo, limit, k, point)

    def count_drafts(self, confident, budget, limit, generated, out):
        bookkeeping.count_drafts(confident, budget, limit, generated, out)

    def commit(self, buffers):
        bookkeeping.commit(buffers)

    def tree_commit(self, buffers):
        bookkeeping.tree_commit(buffers)

    def tree_logq(self, logits, params, bad_mask=None):
        return sampling.logprobs_from_logits(logits, params, None, bad_mask)

    def tree_children(self, logq, noise, w):
        return tree_build.draw_children(logq, noise, w)

    def tree_expand(self, trees, level, tokens, logq, start, root_id=None):
        tree_build.grow(trees, level, tokens, logq, start, root_id)

    def tree_select(self, trees, start):
        tree_build.pick(trees, start)

    def tree_merge(self, tree, lookup, start, point):
        merged_tree.merge(tree, lookup, start, point)
    # -- a batch's rows (core/round/batch_round.py) ---------------------------------------------

    def gumbel_noise_rows(self, out, key, first):
        out.copy_(noise.uniform_rows(key, first, out.shape[1], out.shape[2]))
        noise.exponential_(out)

    def count_drafts_rows(self, confident, budget, limit, generated, out):
        bookkeeping.count_drafts_rows(confident, budget, limit, generated, out)

    def commit_rows(self, buffers):
        bookkeeping.commit_rows(buffers)
