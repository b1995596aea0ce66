"""The warp chain: logits -> the distribution a token is drawn from. Pure torch reference.

One implementation serves the target's k+1 rows (`p`) and the draft's rows (`q`), so both are
warped identically; gpu/kernels/warp.py reproduces it. The chain, in order:

1. bad-token mask: masked ids get -inf (padding rows, EOS while fewer than min_tokens exist, ...);
2. repetition penalty on ids seen in the prompt or output: l > 0 ? l / r : l * r;
3. frequency and presence penalties on output ids: l -= f * count, then l -= pres * (count > 0);
4. greedy rows (temperature 0) stop here: the token is the argmax (first index on ties);
5. temperature: s = (l - max l) / T;
6. top-k: keep x iff fewer than k ids have a strictly larger logit (ties at the boundary are kept);
7. softmax over the top-k survivors in float32: p_k;
8. top-p: keep x iff the p_k-mass of ids with a strictly larger logit is < top_p (tie groups are
   kept or dropped whole); min-p: keep x iff p_k(x) >= min_p * max p_k, i.e. s(x) >= log(min_p);
   renormalise exp(s) once over the kept ids.

Every keep decision is taken on the penalised logits l (or on s, computed as (l - max) / T with
round-to-nearest division), never on rounded probabilities, so the Triton kernels reproduce it
bit for bit; the one quantity that depends on summation order is the top-p mass, and only an id
whose mass-above lies within float32 rounding (~1e-6) of top_p can land on different sides of the
cut in the two implementations (tests keep top_p away from such ties).

Penalty counts at round position i include the tokens drafted at positions < i of the same round;
`penalty_rows` builds them. Randomness is passed in: tokens are drawn by the exponential race
argmax(p / E), E ~ Exp(1), which samples x with probability p(x) and needs no normalisation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from specgen.core.errors import DecodeError
from specgen.core.settings import SamplingSpec

# Exp(1) draws are clamped to this so p / E never divides by zero (changes nothing measurable).
MIN_EXPONENTIAL = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class WarpFlags:
    """Host-side summary of a WarpParams: which steps any row uses (decided without a device sync)."""

    all_greedy: bool
    top_k: bool  # some row has top_k > 0 (it is a no-op where top_k >= V)
    top_p: bool  # some row has top_p < 1
    min_p: bool  # some row has min_p > 0
    # some row is greedy (the default: where a caller does not say, the greedy rows' branch runs)
    any_greedy: bool = True


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

        params = WarpParams(
            temperature=full(spec.temperature),
            top_k=full(spec.top_k, torch.int32),
            top_p=full(spec.top_p),
            min_p=full(spec.min_p),
            repetition_penalty=full(spec.repetition_penalty),
            presence_penalty=full(spec.presence_penalty),
            frequency_penalty=full(spec.frequency_penalty),
        )
        greedy = spec.temperature == 0
        flags = WarpFlags(greedy, spec.top_k > 0, spec.top_p < 1, spec.min_p > 0, greedy)
        params.__dict__["flags"] = flags  # known on the host: no sync later
        return params

    def slice(self, start: int, stop: int) -> "WarpParams":
        part = WarpParams(*(getattr(self, f)[start:stop] for f in self.__dataclass_fields__))
        if "flags" in self.__dict__:
            # What the slice uses is a subset: at worst a filter runs as a no-op (rows built by
            # from_spec are uniform, so even all_greedy is exact for their slices).
            part.__dict__["flags"] = self.flags
        return part

    @functools.cached_property
    def flags(self) -> WarpFlags:
        """One device sync the first time for params not built by from_spec; cached afterwards."""
        summary = torch.stack([
            (self.temperature == 0).all(),
            (self.top_k > 0).any(),
            (self.top_p < 1).any(),
            (self.min_p > 0).any(),
            (self.temperature == 0).any(),
        ]).tolist()
        return WarpFlags(*summary)

    @functools.cached_property
    def log_min_p(self) -> torch.Tensor:
        """[N] log(min_p) (-inf where off): min-p is decided as s >= log(min_p) on both paths."""
        return torch.log(self.min_p)


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
        raise bad_logits_error()


def bad_logits_error() -> DecodeError:
    return DecodeError(
        "the model produced NaN or +inf logits",
        hint="try --dtype float32 (bfloat16/float16 can overflow) or check the checkpoint",
    )


def all_masked_error() -> DecodeError:
    return DecodeError(
        "every token was masked out by the sampling settings",
        hint="relax top_k / top_p / min_p or the stop/min_tokens settings",
    )


def apply_penalties(
    logits: torch.Tensor,  # [N, V] float32, never modified: a copy is returned where anything applies
    params: WarpParams,
    penalties: PenaltyRows | None,
    bad_mask: torch.Tensor | None,  # [N, V] or [V] bool
) -> torch.Tensor:
    """Steps 1-3. The kernel repeats these float32 operations in this order, so l matches bitwise.
    Every step is out of place (no clone first: a launch fewer, per draft level of a tree too)."""
    out = logits.float()
    if bad_mask is not None:
        out = out.masked_fill(bad_mask.expand_as(out), float("-inf"))
    if penalties is not None:
        rep = params.repetition_penalty.unsqueeze(1)  # [N, 1]
        penalised = torch.where(out > 0, out / rep, out * rep)
        out = torch.where(penalties.seen, penalised, out)
        counts = penalties.counts.float()
        out = out - params.frequency_penalty.unsqueeze(1) * counts
        out = out - params.presence_penalty.unsqueeze(1) * (counts > 0).float()
    return out


def probs_from_logits(logits: torch.Tensor, params: WarpParams) -> torch.Tensor:
    """Steps 5-8 for non-greedy rows: penalised logits [N, V] -> warped probabilities [N, V].

    Rows must have a finite max (warp raises first otherwise); greedy rows get T = 1 here and are
    replaced by their one-hot argmax in warp.
    """
    flags = params.flags
    top = logits.max(dim=-1, keepdim=True).values  # [N, 1]
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0).unsqueeze(1)  # [N, 1]
    scaled = (logits - top) / temperature  # [N, V] s <= 0, -inf for masked ids
    e = torch.exp(scaled)
    keep = None
    if flags.top_k:
        keep = logits >= _top_k_cut(logits, params.top_k)
        e = torch.where(keep, e, 0.0)
    if flags.top_p:
        cut = _top_p_cut(logits, e / e.sum(dim=-1, keepdim=True), params.top_p)
        keep = logits >= cut if keep is None else keep & (logits >= cut)
    if flags.min_p:
        above = scaled >= params.log_min_p.unsqueeze(1)
        keep = above if keep is None else keep & above
    kept = e if keep is None else torch.where(keep, e, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _top_k_cut(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """[N, 1]: keep ids with logit >= this (the k-th largest logit; -inf where top-k is off)."""
    vocab = logits.shape[-1]
    active = (top_k > 0) & (top_k < vocab)
    k = torch.where(active, top_k, vocab).long()  # [N]
    kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))  # [N, 1]
    return torch.where(active.unsqueeze(1), kth, float("-inf"))


def _top_p_cut(logits: torch.Tensor, probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[N, 1]: keep ids with logit >= this (-inf where top-p is off).

    The cut is the smallest logit whose mass-before in descending logit order is < top_p; the
    first id of a tie group has exactly the mass of the strictly larger logits, so `>=` keeps
    tie groups whole. top_p is clamped above 0 so the most likely ids always survive.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [N, V]
    sorted_probs = probs.gather(1, order)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # exclusive prefix sums
    bound = top_p.clamp_min(MIN_EXPONENTIAL).unsqueeze(1)  # [N, 1]
    candidates = torch.where(mass_before < bound, sorted_logits, float("inf"))
    cut = candidates.min(dim=-1, keepdim=True).values
    return torch.where((top_p < 1).unsqueeze(1), cut, float("-inf"))


def warp(
    logits: torch.Tensor,  # [N, V]
    params: WarpParams,
    penalties: PenaltyRows | None = None,
    bad_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The whole chain. Returns (argmax [N] int64, probs [N, V] float32 or None when all greedy).

    For greedy rows the probs row is one-hot at the argmax, so the verifier can treat every row alike.
    Raises DecodeError for NaN/+inf logits and for a row whose every id is masked.
    """
    check_logits(logits)
    penalised = apply_penalties(logits, params, penalties, bad_mask)
    if bool((penalised.max(dim=-1).values == float("-inf")).any()):
        raise all_masked_error()
    argmax = penalised.argmax(dim=-1)
    if params.flags.all_greedy:
        return argmax, None
    probs = probs_from_logits(penalised, params)
    if not params.flags.any_greedy:  # no greedy row's one-hot to put in
        return argmax, probs
    greedy = params.temperature == 0
    one_hot = torch.nn.functional.one_hot(argmax, probs.shape[-1]).to(probs.dtype)
    probs = torch.where(greedy.unsqueeze(1), one_hot, probs)
    return argmax, probs


def logprobs_from_logits(logits: torch.Tensor, params: WarpParams, penalties=None, bad_mask=None):
    """Log of the warped distribution; for greedy rows, log-softmax of the penalised logits."""
    penalised = apply_penalties(logits, params, penalties, bad_mask)
    if params.flags.all_greedy:
        return torch.log_softmax(penalised, dim=-1)
    probs = probs_from_logits(penalised, params)
    logp = torch.log(probs)
    if not params.flags.any_greedy:  # the where below would keep logp whole: three launches fewer (a tree's
        return logp  # draft runs this at every level)
    greedy = params.temperature == 0
    return torch.where(greedy.unsqueeze(1), torch.log_softmax(penalised, dim=-1), logp)


def exponentials(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Exp(1) draws for the exponential race, never exactly zero."""
    return exponentials_(torch.empty(shape, dtype=torch.float32, device=device), generator)


def exponentials_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """exponentials() into an existing float32 buffer (same draws for the same generator state)."""
    return out.exponential_(generator=generator).clamp_min_(MIN_EXPONENTIAL)


def uniforms(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniform draws in (0, 1]: never 0, so a token with p(x) = 0 is always rejected."""
    return uniforms_(torch.empty(shape, dtype=torch.float32, device=device), generator)


def uniforms_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """uniforms() into an existing float32 buffer: 1 - U[0, 1), drawn as -U[-1, 0) (the same values
    for the same generator state, both exact in float32, in two calls instead of three)."""
    return out.uniform_(-1.0, 0.0, generator=generator).neg_()


def sample_race(probs: torch.Tensor, expo: torch.Tensor) -> torch.Tensor:
    """Draw one id per row from probs [N, V] with Exp(1) draws expo [N, V]: argmax(p / E)."""
    return (probs / expo).argmax(dim=-1)
