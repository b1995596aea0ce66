"""Dispatch warp and verify between the torch reference (core/) and the Triton kernels (gpu/).

CUDA tensors go to gpu/warp.py and gpu/verify.py when Triton imports; everything else (CPU, or no
Triton) goes to core/sampling.py and core/rejection.py. Signatures are the reference's, so the
decode loop and the proposers call these functions without knowing which path runs. gpu/ is
imported on first use only: core/ imports without Triton or CUDA.

Errors without a host sync: the reference raises DecodeError inside warp (NaN/+inf logits, a row
with every id masked). The kernels cannot raise, so they set a per-device error flag that the
verify kernels turn into a sentinel in the output row; `emitted(output)`, the round's one host
read, raises the same DecodeError. A warp whose round never reaches verify reports at the next one.
So always read verify output through `emitted`.
"""

from __future__ import annotations

import functools

import torch

from specgen.core import rejection, sampling

_error_flags: dict[torch.device, torch.Tensor] = {}

# gpu/warp.py's cut kernel (top-k / top-p / min-p) matched the reference on an H200 at vocab 151936
# and 128256 (benchmarks/bench_verify.py, docs/benchmarks.md "Verification kernels"). The switch
# stays so a GPU/Triton combination that misbehaves can be sent back to the torch reference.
CUT_KERNEL_ON_GPU = True


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(device: torch.device) -> bool:
    return device.type == "cuda" and _triton_available()


def _gpu():
    from specgen.gpu import verify, warp as gpu_warp

    return gpu_warp, verify


def _error_flag(device: torch.device) -> torch.Tensor:
    flag = _error_flags.get(device)
    if flag is None:
        flag = _error_flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return flag


def warp(
    logits: torch.Tensor,  # [N, V]
    params: sampling.WarpParams,
    penalties: sampling.PenaltyRows | None = None,
    bad_mask: torch.Tensor | None = None,  # [N, V] or [V] bool
) -> tuple[torch.Tensor, torch.Tensor | None]:  # argmax [N] int64, probs [N, V] float32 | None
    if _warp_by_reference(logits, params):
        return sampling.warp(logits, params, penalties, bad_mask)
    return _gpu()[0].warp(logits.contiguous(), params, penalties, bad_mask, _error_flag(logits.device))


def _warp_by_reference(logits: torch.Tensor, params: sampling.WarpParams) -> bool:
    """The torch reference warps these logits: off CUDA, or a cut while the cut kernel is switched off."""
    flags = params.flags
    needs_cut = not flags.all_greedy and (flags.top_k or flags.top_p or flags.min_p)
    return not use_triton(logits.device) or (needs_cut and not CUT_KERNEL_ON_GPU)


def warp_and_race(
    logits: torch.Tensor,  # [N, V]
    params: sampling.WarpParams,
    expo: torch.Tensor,  # [N, V] float32 Exp(1) draws
    out: torch.Tensor,  # [N] int64: sampling.sample_race(probs, expo)
) -> torch.Tensor | None:  # probs [N, V] float32, None when every row is greedy (out = argmax then)
    """warp() without penalties or a bad mask, then the exponential race into `out`: on CUDA one
    launch less, the race done by the warp's last kernel."""
    if _warp_by_reference(logits, params):
        argmax, probs = sampling.warp(logits, params)
        out.copy_(argmax if probs is None else sampling.sample_race(probs, expo))
        return probs
    _, probs = _gpu()[0].warp(logits.contiguous(), params, None, None, _error_flag(logits.device), expo, out)
    return probs


def verify_greedy(
    draft_token_ids: torch.Tensor,  # [T] int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    target_argmax: torch.Tensor,  # [T + B] int64
    max_spec_len: int,
) -> torch.Tensor:  # [B, max_spec_len + 1] int64
    if not use_triton(target_argmax.device):
        return rejection.verify_greedy(draft_token_ids, cu_num_draft_tokens, target_argmax, max_spec_len)
    return _gpu()[1].verify_greedy(draft_token_ids, cu_num_draft_tokens, target_argmax, max_spec_len,
                                   _error_flag(target_argmax.device))


def verify_random(
    draft_token_ids: torch.Tensor,  # [T] int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    draft_probs: torch.Tensor | None,  # [T, V] float32, None = one-hot q
    target_probs: torch.Tensor,  # [T + B, V] float32
    uniform_draws: torch.Tensor,  # [T] float32 in (0, 1]
    exponential_draws: torch.Tensor,  # [B, V] float32 > 0
    max_spec_len: int,
) -> torch.Tensor:  # [B, max_spec_len + 1] int64
    if not use_triton(target_probs.device):
        return rejection.verify_random(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs,
                                       uniform_draws, exponential_draws, max_spec_len)
    return _gpu()[1].verify_random(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, uniform_draws,
                                   exponential_draws, max_spec_len, _error_flag(target_probs.device))


def verify(
    draft_token_ids: torch.Tensor,  # [T] int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    draft_probs: torch.Tensor | None,  # [T, V] float32, None = one-hot q
    target_argmax: torch.Tensor,  # [T + B] int64
    target_probs: torch.Tensor | None,  # [T + B, V] float32, None = all greedy (warp's output)
    uniform_draws: torch.Tensor | None,  # [T] float32 (random only)
    exponential_draws: torch.Tensor | None,  # [B, V] float32 (random only)
    max_spec_len: int,
) -> torch.Tensor:  # [B, max_spec_len + 1] int64
    """Greedy verification when warp returned no probabilities, random rejection otherwise."""
    if target_probs is None:
        return verify_greedy(draft_token_ids, cu_num_draft_tokens, target_argmax, max_spec_len)
    return verify_random(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, uniform_draws,
                         exponential_draws, max_spec_len)


def emitted(output_token_ids: torch.Tensor) -> list[list[int]]:
    """[B, max_spec_len + 1] -> each request's emitted ids; the host read that reports kernel errors."""
    rows = output_token_ids.tolist()
    first = min((row[0] for row in rows), default=rejection.PLACEHOLDER)
    if first < rejection.PLACEHOLDER:  # an error sentinel from gpu/verify.py
        _error_flag(output_token_ids.device).zero_()
        if first == _gpu()[1].ERROR_BAD_LOGITS:
            raise sampling.bad_logits_error()
        raise sampling.all_masked_error()
    return [[t for t in row if t >= 0] for row in rows]
