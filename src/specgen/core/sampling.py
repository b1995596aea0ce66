"""The warp chain: logits -> the distribution a token is drawn from. Pure torch reference.

One implementation serves the target's k+1 rows (`p`) and the draft's rows (`q`), so both are
warped identically; gpu/ kernels must reproduce it exactly. The chain, in order:

1. bad-token mask: masked ids get -inf (padding rows, EOS while fewer than min_tokens exist, ...);
2. repetition penalty on ids seen in the prompt or output: l > 0 ? l / r : l * r;
3. frequency and presence penalties on output ids: l -= f * count + pres * (count > 0);
4. greedy rows (temperature 0) stop here: the token is the argmax (first index on ties);
5. temperature: l / T;
6. top-k: keep ids whose logit is >= the k-th largest logit (ties at the boundary are kept);
7. softmax in float32;
8. top-p: keep id x iff the mass of ids strictly more probable than x is < top_p; min-p: keep x iff
   p(x) >= min_p * max p; renormalise once over the kept ids.

Penalty counts at round position i include the tokens drafted at positions < i of the same round;
`penalty_rows` builds them. Randomness is passed in: tokens are drawn by the exponential race
argmax(p / E), E ~ Exp(1), which samples x with probability p(x) and needs no normalisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.core.errors import DecodeError
from specgen.core.settings import SamplingSpec

# Exp(1) draws are clamped to this so p / E never divides by zero (changes nothing measurable).
MIN_EXPONENTIAL = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class WarpParams:
    """Per-row warp parameters: every tensor is [N] for N rows of logits."""

    temperature: torch.Tensor  # [N] float32, 0 = greedy
    top_k: torch.Tensor  # [N] int32, -1 = off
    top_p: torch.Tensor  # [N] float32, 1 = off
    min_p: torch.Tensor  # [N] float32, 0 = off
    repetition_penalty: torch.Tensor  # [N] float32, 1 = off
    presence_penalty: torch.Tensor  # [N] float32
    frequency_penalty: torch.Tensor  # [N] float32

    @staticmethod
    def from_spec(spec: SamplingSpec, rows: int, device: torch.device | str = "cpu") -> "WarpParams":
        def full(value, dtype=torch.float32):
            return torch.full((rows,), value, dtype=dtype, device=device)

        return WarpParams(
            temperature=full(spec.temperature),
            top_k=full(spec.top_k, torch.int32),
            top_p=full(spec.top_p),
            min_p=full(spec.min_p),
            repetition_penalty=full(spec.repetition_penalty),
            presence_penalty=full(spec.presence_penalty),
            frequency_penalty=full(spec.frequency_penalty),
        )

    def slice(self, start: int, stop: int) -> "WarpParams":
        return WarpParams(*(getattr(self, f)[start:stop] for f in self.__dataclass_fields__))


@dataclass(frozen=True)
class PenaltyRows:
    """Per-row penalty state for N rows."""

    counts: torch.Tensor  # [N, V] int32: occurrences of each id in the output so far
    seen: torch.Tensor  # [N, V] bool: id occurs in the prompt or the output so far


def penalty_rows(counts: torch.Tensor, seen: torch.Tensor, drafted: torch.Tensor) -> PenaltyRows:
    """Rows 0..n for a round that drafted n tokens: row i also counts drafted[:i].

    counts: [V] int32 output counts before the round; seen: [V] bool; drafted: [n] int64.
    """
    n = drafted.shape[0]
    vocab = counts.shape[0]
    step = torch.zeros(n + 1, vocab, dtype=torch.int32, device=counts.device)  # [n+1, V]
    if n:
        step[torch.arange(1, n + 1, device=counts.device), drafted] = 1
    cum = step.cumsum(0, dtype=torch.int32)  # row i counts drafted[:i]
    rows_counts = counts.unsqueeze(0) + cum
    return PenaltyRows(counts=rows_counts, seen=seen.unsqueeze(0) | (cum > 0))


def check_logits(logits: torch.Tensor) -> None:
    """NaN or +inf logits mean a broken model or dtype overflow: say so instead of sampling garbage."""
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        raise DecodeError(
            "the model produced NaN or +inf logits",
            hint="try --dtype float32 (bfloat16/float16 can overflow) or check the checkpoint",
        )


def apply_penalties(
    logits: torch.Tensor,  # [N, V] float32, modified copy returned
    params: WarpParams,
    penalties: PenaltyRows | None,
    bad_mask: torch.Tensor | None,  # [N, V] or [V] bool
) -> torch.Tensor:
    out = logits.float().clone()
    if bad_mask is not None:
        out.masked_fill_(bad_mask.expand_as(out), float("-inf"))
    if penalties is not None:
        rep = params.repetition_penalty.unsqueeze(1)  # [N, 1]
        penalised = torch.where(out > 0, out / rep, out * rep)
        out = torch.where(penalties.seen, penalised, out)
        counts = penalties.counts.float()
        out = out - params.frequency_penalty.unsqueeze(1) * counts
        out = out - params.presence_penalty.unsqueeze(1) * (counts > 0).float()
    return out


def probs_from_logits(logits: torch.Tensor, params: WarpParams) -> torch.Tensor:
    """Steps 5-8 for non-greedy rows: penalised logits [N, V] -> warped probabilities [N, V]."""
    temperature = params.temperature.clamp_min(1e-6).unsqueeze(1)  # greedy rows never get here
    scaled = logits / temperature
    scaled = _top_k_mask(scaled, params.top_k)
    probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
    keep = _top_p_keep(probs, params.top_p) & _min_p_keep(probs, params.min_p)
    kept = probs * keep
    total = kept.sum(dim=-1, keepdim=True)
    if (total <= 0).any():
        raise DecodeError(
            "every token was masked out by the sampling settings",
            hint="relax top_k / top_p / min_p or the stop/min_tokens settings",
        )
    return kept / total


def _top_k_mask(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[-1]
    active = (top_k > 0) & (top_k < vocab)
    if not bool(active.any()):
        return logits
    k = torch.where(active, top_k, torch.full_like(top_k, vocab)).long()  # [N]
    kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))  # [N, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p_keep(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    if bool((top_p >= 1).all()):
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs = probs.sort(dim=-1, descending=True).values  # [N, V]
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # exclusive prefix sums
    kept_in_sorted = mass_before < top_p.unsqueeze(1)
    last_kept = kept_in_sorted.sum(dim=-1, keepdim=True) - 1  # [N, 1], >= 0 since mass_before[0] = 0
    threshold = sorted_probs.gather(1, last_kept)
    keep = probs >= threshold
    return keep | (top_p >= 1).unsqueeze(1)


def _min_p_keep(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    top = probs.max(dim=-1, keepdim=True).values
    return probs >= min_p.unsqueeze(1) * top


def warp(
    logits: torch.Tensor,  # [N, V]
    params: WarpParams,
    penalties: PenaltyRows | None = None,
    bad_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The whole chain. Returns (argmax [N] int64, probs [N, V] float32 or None when all greedy).

    For greedy rows the probs row is one-hot at the argmax, so the verifier can treat every row alike.
    """
    check_logits(logits)
    penalised = apply_penalties(logits, params, penalties, bad_mask)
    argmax = penalised.argmax(dim=-1)
    greedy = params.temperature == 0
    if bool(greedy.all()):
        return argmax, None
    probs = probs_from_logits(penalised, params)
    if bool(greedy.any()):
        one_hot = torch.nn.functional.one_hot(argmax, probs.shape[-1]).to(probs.dtype)
        probs = torch.where(greedy.unsqueeze(1), one_hot, probs)
    return argmax, probs


def logprobs_from_logits(logits: torch.Tensor, params: WarpParams, penalties=None, bad_mask=None):
    """Log of the warped distribution; for greedy rows, log-softmax of the penalised logits."""
    penalised = apply_penalties(logits, params, penalties, bad_mask)
    greedy = params.temperature == 0
    if bool(greedy.all()):
        return torch.log_softmax(penalised, dim=-1)
    probs = probs_from_logits(penalised, params)
    logp = torch.log(probs)
    return torch.where(greedy.unsqueeze(1), torch.log_softmax(penalised, dim=-1), logp)


def exponentials(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Exp(1) draws for the exponential race, never exactly zero."""
    e = torch.empty(shape, dtype=torch.float32, device=device).exponential_(generator=generator)
    return e.clamp_min_(MIN_EXPONENTIAL)


def uniforms(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniform draws in (0, 1]: never 0, so a token with p(x) = 0 is always rejected."""
    u = torch.rand(shape, dtype=torch.float32, device=device, generator=generator)
    return 1.0 - u


def sample_race(probs: torch.Tensor, expo: torch.Tensor) -> torch.Tensor:
    """Draw one id per row from probs [N, V] with Exp(1) draws expo [N, V]: argmax(p / E)."""
    return (probs / expo).argmax(dim=-1)
