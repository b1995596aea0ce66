"""Dispatch between the torch reference (CPU) and the Triton kernels (CUDA) for warp and verify."""

from __future__ import annotations

from specgen.core import rejection, sampling


def warp(logits, params, penalties=None, bad_mask=None):
    return sampling.warp(logits, params, penalties, bad_mask)


def verify_greedy(draft_token_ids, cu_num_draft_tokens, target_argmax, max_spec_len):
    return rejection.verify_greedy(draft_token_ids, cu_num_draft_tokens, target_argmax, max_spec_len)


def verify_random(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, uniform_draws,
                  exponential_draws, max_spec_len):
    return rejection.verify_random(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs,
                                   uniform_draws, exponential_draws, max_spec_len)
