"""The round's ops in Triton (core/round/ops.py's table): gpu/kernels/warp.py, gpu/kernels/verify.py,
gpu/kernels/noise.py, gpu/kernels/commit.py, gpu/kernels/tree_commit.py, gpu/kernels/log_softmax.py,
gpu/kernels/topw.py, gpu/kernels/tree_build.py, gpu/kernels/tree_merge.py and
gpu/kernels/tree_walk.py over one device's workspace, each launched dependent on the kernel before
when the target's kernel policy says so (gpu/kernels/dependent.py).

The kernels cannot raise: they leave a sentinel in the output row, which the backend's check()
reads with the round (gpu/kernels/verify.check_output). tests/gpu/test_round_ops.py compares this table with
the references on one round's inputs.
"""

from __future__ import annotations

import torch

from specgen.core.sampling import bookkeeping
from specgen.core.sampling import noise
from specgen.core.sampling import warp as sampling
from specgen.gpu.kernels import argmax as gpu_argmax
from specgen.gpu.kernels import commit as gpu_commit
from specgen.gpu.kernels import log_softmax as gpu_log_softmax
from specgen.gpu.kernels import noise as gpu_noise
from specgen.gpu.kernels import topw as gpu_topw
from specgen.gpu.kernels import tree_build as gpu_tree
from specgen.gpu.kernels import tree_commit as gpu_tree_commit
from specgen.gpu.kernels import tree_merge as gpu_tree_merge
from specgen.gpu.kernels import tree_walk as gpu_tree_walk
from specgen.gpu.kernels import verify as gpu_verify
from specgen.gpu.kernels import warp as gpu_warp
from specgen.gpu.workspace import Workspace


class TritonRoundOps:
    capturable = True

    def __init__(self, workspace: Workspace, dependent: bool = False):
        self.workspace = workspace
        self.dependent = dependent  # every launch waits on the kernel before (gpu/kernels/dependent.py)

    def warp(self, logits, params, penalties=None, bad_mask=None):
        return gpu_warp.warp(logits.contiguous(), params, penalties, bad_mask, self.workspace, dependent=self.dependent)

    def argmax(self, logits, out):
        gpu_argmax.argmax(logits.contiguous(), out, self.workspace, dependent=self.dependent)

    def warp_and_race(self, logits, params, expo, out, penalties=None, bad_mask=None, probs_out=None):
        return gpu_warp.warp(logits.contiguous(), params, penalties, bad_mask, self.workspace, expo, out,
                         probs_out=probs_out, dependent=self.dependent)[1]

    def gumbel_noise(self, out, key, first):
        """The uniforms from the kernel, the log by torch (as the reference): E is the same bits."""
        gpu_noise.uniform_(out, key, first)
        noise.exponential_(out)

    def verify_greedy(self, drafts, cu, target_argmax, max_spec_len):
        return gpu_verify.verify_greedy(drafts, cu, target_argmax, max_spec_len, self.workspace,
                                        dependent=self.dependent)

    def verify_random(self, drafts, cu, draft_probs, target_probs, uniforms, expo, max_spec_len):
        return gpu_verify.verify_random(drafts, cu, draft_probs, target_probs, uniforms, expo, max_spec_len,
                                    self.workspace, dependent=self.dependent)

    def greedy_walk(self, children, tokens, choice, limit, k):
        return gpu_tree_walk.greedy_walk(children, tokens, choice, limit, k, self.workspace, dependent=self.dependent)

    def sibling_walk(self, children, tokens, probs, uniforms, expo, limit, k):
        return gpu_tree_walk.sibling_walk(children, tokens, probs, uniforms, expo, limit, k, self.workspace,
                                          dependent=self.dependent)

    def recursive_walk(self, children, drawn, tokens, probs, q, uniforms, expo, limit, k, point=None):
        return gpu_tree_walk.recursive_walk(children, drawn, tokens, probs, q, uniforms, expo, limit, k,
                                            self.workspace, dependent=self.dependent, point=point)

    def count_drafts(self, confident, budget, limit, generated, out):
        gpu_commit.count_drafts(confident, budget, limit, generated, out, dependent=self.dependent)

    def commit(self, buffers):
        """One kernel, which reads every tensor on the round's device: where a runner's position lies
        on another device (a draft placed on another GPU), the reference's tensor ops do the commit."""
        positions = (buffers.target_position, buffers.draft_position, buffers.pending)
        if all(t is None or t.device == buffers.row.device for t in positions):
            gpu_commit.commit(buffers, dependent=self.dependent)
        else:
            bookkeeping.commit(buffers)

    def tree_commit(self, buffers):
        """One kernel, as commit: where a draft model's position lies on another device, the
        reference's tensor ops."""
        if buffers.draft_position is None or buffers.draft_position.device == buffers.out.device:
            gpu_tree_commit.tree_commit(buffers, dependent=self.dependent)
        else:
            bookkeeping.tree_commit(buffers)

    def tree_logq(self, logits, params, bad_mask=None):
        """Greedy levels: the penalised logits' log_softmax over chunks of each row (torch's kernel
        takes one block a row: gpu/kernels/log_softmax.py); sampled ones: the log of the warp
        kernels' q, the chain's warp (torch's top-p cut sorts each row); rows of both kinds (a
        batch's): the reference."""
        flags = params.flags
        if flags.all_greedy:
            penalised = sampling.apply_penalties(logits, params, None, bad_mask).contiguous()
            return gpu_log_softmax.log_softmax(penalised, self.workspace, dependent=self.dependent)
        if not flags.any_greedy:
            return torch.log(self.warp(logits, params, None, bad_mask)[1])
        return sampling.logprobs_from_logits(logits, params, None, bad_mask)

    def tree_children(self, logq, noise, w):
        return gpu_topw.top_w(logq.contiguous(), noise, w, self.workspace, dependent=self.dependent)

    def tree_expand(self, trees, level, tokens, logq, start, root_id=None):
        gpu_tree.expand(trees, level, tokens, logq, start, root_id, dependent=self.dependent)

    def tree_select(self, trees, start):
        gpu_tree.select(trees, start, dependent=self.dependent)

    def tree_merge(self, tree, lookup, start, point):
        gpu_tree_merge.merge(tree, lookup, start, point, self.workspace, dependent=self.dependent)
    # -- a batch's rows (core/round/batch_round.py) ---------------------------------------------

    def gumbel_noise_rows(self, out, key, first):
        gpu_noise.uniform_rows_(out, key, first)
        noise.exponential_(out)

    def count_drafts_rows(self, confident, budget, limit, generated, out):
        gpu_commit.count_drafts_rows(confident, budget, limit, generated, out, dependent=self.dependent)

    def commit_rows(self, buffers):
        """One launch for every row; a batch's buffers all lie on the round's device (batches
        refuse models spread over several GPUs)."""
        gpu_commit.commit_rows(buffers, dependent=self.dependent)
