"""Losslessness: the tokens a round emits follow the target's warped distribution, whatever the draft.

Setup: vocab 50, k = 3, fixed target logits for the k + 1 positions and draft logits for the k
drafted ones (the target's plus noise, so every position is reached often). Rounds are the rows of
one batch: drafts are drawn from q position by position, the target rows are warped, one verify
call decides all rounds. Each warp combination (temperature 0.5 / 1 / 1.5, top-k, top-p, min-p,
penalties, all together) applies to p and q alike, as in the decode loop.

Test: at every position i, among the rounds that emitted a token at i, the token counts are
compared with their expectation, the sum over those rounds of the reference's warped target row
at i (the target distribution given the round's drafted prefix; penalties count that prefix, and
without penalties every row is equal and this is n * p_i). Pearson chi-square with bins of
expectation < 5 pooled; a token of target probability 0 must never appear (checked exactly).

False failures: every comparison uses alpha = 1e-6 / COMPARISONS (Bonferroni over positions,
combinations, drafting modes and both paths), so a correct verifier fails this file with
probability <= 1e-6. Rows that differ (penalties) make the counts a sum of independent,
non-identical categoricals whose covariance is below the multinomial's: that keeps the test valid
(conservative).

Rounds and power: 100k rounds through the torch reference, 20k through the Triton kernels (on CPU
the interpreter runs them; the kernels also pass the identity tests of
tests/gpu/kernels/test_warp_kernel.py and test_verify_kernel.py). At alpha
~1e-8 with ~30 bins, 20k rounds detect at position 0 (power 0.99) any deviation with noncentrality
n * sum((pi - p)^2 / p) >= 90, e.g. 0.6% of the mass moved between two tokens of probability 0.05;
test_mis_specified_q_is_detected shows both paths fail when the verifier is handed a q other than
the one the drafts were drawn from.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch
from scipy import stats

from specgen.core.sampling import noise

from specgen.core.sampling import rejection

from specgen.core.sampling import warp as sampling
from specgen.gpu.kernels import verify as gpu_verify
from specgen.gpu.kernels import warp as gpu_warp
from specgen.gpu.workspace import Workspace

VOCAB = 50
K = 3
COMBOS = {
    "t0.5": dict(temperature=0.5),
    "t1": dict(temperature=1.0),
    "t1.5": dict(temperature=1.5),
    "top_k": dict(temperature=1.0, top_k=8),
    "top_p": dict(temperature=1.0, top_p=0.8),
    "min_p": dict(temperature=1.0, min_p=0.1),
    "penalties": dict(temperature=1.0, repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.4),
    "all": dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, repetition_penalty=1.3, presence_penalty=0.3,
                frequency_penalty=0.2),
}
ONE_HOT = ["t1"]  # argmax drafting: q one-hot, no draft probabilities
UNCUT = ["top_p", "all"]  # draft_sampling = "temperature": q without the request's top-k / top-p / min-p
ROUNDS = {"reference": 100_000, "kernels": 20_000}
GUMBEL_ROUNDS = {"reference": 20_000, "kernels": 10_000}  # the noise costs ~130 int64 ops an element
COMPARISONS = (K + 1) * 2 * (2 * len(COMBOS) + len(ONE_HOT) + len(UNCUT))
ALPHA = 1e-6 / COMPARISONS
DEFAULTS = dict(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                frequency_penalty=0.0)


class ReferencePath:
    @staticmethod
    def warp(logits, params, penalties):
        return sampling.warp(logits, params, penalties)

    @staticmethod
    def verify(drafted, cu, q, p, uniform, expo):
        return rejection.verify_random(drafted, cu, q, p, uniform, expo, K)

    @staticmethod
    def warp_race(logits, params, penalties, expo):
        _, probs = sampling.warp(logits, params, penalties)
        return sampling.sample_race(probs, expo)

    @staticmethod
    def verify_greedy(drafted, cu, choice):
        return rejection.verify_greedy(drafted, cu, choice, K)


class KernelPath:
    workspace = Workspace(DEVICE)

    @classmethod
    def warp(cls, logits, params, penalties):
        return gpu_warp.warp(logits, params, penalties, None, cls.workspace)

    @classmethod
    def verify(cls, drafted, cu, q, p, uniform, expo):
        out = gpu_verify.verify_random(drafted, cu, q, p, uniform, expo, K, cls.workspace)
        assert int(cls.workspace.error) == 0
        return out

    @classmethod
    def warp_race(cls, logits, params, penalties, expo):
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=DEVICE)
        gpu_warp.warp(logits, params, penalties, None, cls.workspace, expo.contiguous(), out)
        return out

    @classmethod
    def verify_greedy(cls, drafted, cu, choice):
        out = gpu_verify.verify_greedy(drafted, cu, choice, K, cls.workspace)
        assert int(cls.workspace.error) == 0
        return out


PATHS = {"reference": ReferencePath, "kernels": KernelPath}


def params_for(rows: int, combo: dict) -> sampling.WarpParams:
    values = {**DEFAULTS, **combo}
    return sampling.WarpParams(**{
        name: torch.full((rows,), value, dtype=torch.int32 if name == "top_k" else torch.float32, device=DEVICE)
        for name, value in values.items()
    })


def fixed_logits(seed: int):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(K + 1, VOCAB, generator=gen) * 2
    draft = target[:K] + torch.randn(K, VOCAB, generator=gen)
    return target.to(DEVICE), draft.to(DEVICE)


def penalties_for(drafted: torch.Tensor, positions: int) -> sampling.PenaltyRows:
    """Rows [R * positions]: output counts before the round plus the drafts before each position."""
    rounds = drafted.shape[0]
    base = torch.zeros(VOCAB, dtype=torch.int32, device=DEVICE)
    base[:5] = torch.tensor([1, 2, 1, 3, 1], dtype=torch.int32)
    seen = torch.zeros(VOCAB, dtype=torch.bool, device=DEVICE)
    seen[:10] = True
    step = torch.zeros(rounds, positions, VOCAB, dtype=torch.int32, device=DEVICE)
    if drafted.shape[1]:
        step[:, 1:].scatter_(2, drafted[:, : positions - 1].unsqueeze(2), 1)
    intra = step.cumsum(dim=1, dtype=torch.int32).view(-1, VOCAB)  # row (r, i) counts drafts < i
    return sampling.PenaltyRows((base + intra).contiguous(), (seen | (intra > 0)).contiguous())


def last_position(penalties: sampling.PenaltyRows, rounds: int) -> sampling.PenaltyRows:
    """The rows of the newest position only: what the draft's next step is warped with."""
    def last(t):
        return t.view(rounds, -1, VOCAB)[:, -1].contiguous()

    return sampling.PenaltyRows(last(penalties.counts), last(penalties.seen))


def run_rounds(path, combo_name: str, rounds: int, seed: int, one_hot: bool = False, wrong_q: bool = False,
               uncut: bool = False):
    """(output [R, K+1], the reference's warped target rows [R, K+1, V]) for R rounds. uncut: the
    draft warps with the combo's temperature and penalties only (state.draft_spec)."""
    combo = COMBOS[combo_name]
    penalised = "repetition_penalty" in combo
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    target_logits, draft_logits = fixed_logits(seed)
    if "top_p" in combo:  # keep top_p off float32 ties with a mass sum (see core/sampling/warp.py)
        combo = {**combo, "top_p": _settled_top_p(target_logits, combo)}
    draft_params = params_for(rounds, {key: value for key, value in combo.items()
                                       if not (uncut and key in ("top_k", "top_p", "min_p"))})
    drafted = torch.zeros(rounds, 0, dtype=torch.int64, device=DEVICE)
    q_rows, wrong_rows = [], []
    for i in range(K):
        logits = draft_logits[i].expand(rounds, VOCAB).contiguous()
        rows = last_position(penalties_for(drafted, i + 1), rounds) if penalised else None
        argmax, q = path.warp(logits, draft_params, rows)
        if one_hot:
            token = argmax
        else:
            token = sampling.sample_race(q, sampling.exponentials(q.shape, gen, DEVICE))
            q_rows.append(q)
            if wrong_q:  # what the verifier is told: the draft at a lower temperature
                wrong_params = params_for(rounds, {**combo, "temperature": combo["temperature"] * 0.5})
                wrong_rows.append(path.warp(logits, wrong_params, rows)[1])
        drafted = torch.cat([drafted, token.unsqueeze(1)], dim=1)
    target_params = params_for(rounds * (K + 1), combo)
    logits = target_logits.repeat(rounds, 1)  # row r * (K + 1) + i
    penalties = penalties_for(drafted, K + 1) if penalised else None
    _, p = path.warp(logits, target_params, penalties)
    q = None if one_hot else torch.stack(wrong_rows if wrong_q else q_rows, dim=1).view(-1, VOCAB)
    cu = (torch.arange(1, rounds + 1, device=DEVICE) * K).to(torch.int32)
    uniform = sampling.uniforms((rounds * K,), gen, DEVICE)
    expo = sampling.exponentials((rounds, VOCAB), gen, DEVICE)
    out = path.verify(drafted.reshape(-1), cu, q, p, uniform, expo)
    expected = p if path is ReferencePath else sampling.warp(logits, target_params, penalties)[1]
    return out, expected.view(rounds, K + 1, VOCAB)


def run_gumbel_rounds(path, combo_name: str, rounds: int, seed: int, target_from_q: bool = False):
    """Gumbel coupling, as core/round/couplings.py runs it: round r covers positions r(K+1) .. r(K+1)+K of one
    seed's noise; the draft races q against row i, the target picks x_i = argmax p_i / E_i, and a
    draft is accepted iff it equals x_i. target_from_q: a broken target that races the draft's q."""
    combo = COMBOS[combo_name]
    penalised = "repetition_penalty" in combo
    target_logits, draft_logits = fixed_logits(seed)
    if "top_p" in combo:
        combo = {**combo, "top_p": _settled_top_p(target_logits, combo)}
    key = torch.tensor(noise.split_seed(seed), dtype=torch.int64, device=DEVICE)
    first = torch.zeros((), dtype=torch.int64, device=DEVICE)
    expo = noise.exponential(key, first, rounds * (K + 1), VOCAB).view(rounds, K + 1, VOCAB)
    draft_params = params_for(rounds, combo)
    drafted = torch.zeros(rounds, 0, dtype=torch.int64, device=DEVICE)
    for i in range(K):
        logits = draft_logits[i].expand(rounds, VOCAB).contiguous()
        rows = last_position(penalties_for(drafted, i + 1), rounds) if penalised else None
        token = path.warp_race(logits, draft_params, rows, expo[:, i].contiguous())
        drafted = torch.cat([drafted, token.unsqueeze(1)], dim=1)
    target_params = params_for(rounds * (K + 1), combo)
    logits = target_logits.repeat(rounds, 1)
    if target_from_q:
        logits = torch.cat([draft_logits, draft_logits[-1:]]).repeat(rounds, 1)
    penalties = penalties_for(drafted, K + 1) if penalised else None
    choice = path.warp_race(logits, target_params, penalties, expo.reshape(-1, VOCAB))
    cu = (torch.arange(1, rounds + 1, device=DEVICE) * K).to(torch.int32)
    out = path.verify_greedy(drafted.reshape(-1), cu, choice)
    expected = sampling.warp(target_logits.repeat(rounds, 1), target_params, penalties)[1]
    return out, expected.view(rounds, K + 1, VOCAB)


def _settled_top_p(target_logits, combo) -> float:
    """A top_p in the middle of the widest nearby gap between masses-above of the target rows."""
    params = params_for(K + 1, {**combo, "top_p": 1.0, "min_p": 0.0})
    _, probs = sampling.warp(target_logits, params)
    masses = []
    for row in probs.double():
        ordered = row.sort(descending=True).values
        masses += (ordered.cumsum(0) - ordered).tolist()
    masses = sorted(masses)
    gaps = [(b - a, (a + b) / 2) for a, b in zip(masses, masses[1:]) if abs((a + b) / 2 - combo["top_p"]) < 0.05]
    return max(gaps)[1]


def position_pvalues(out: torch.Tensor, expected: torch.Tensor) -> list[float]:
    emitted = rejection.num_emitted(out)  # [R]
    pvalues = []
    for i in range(K + 1):
        present = emitted > i
        observed = torch.bincount(out[present, i], minlength=VOCAB).double().cpu()
        pvalues.append(chi2_pvalue(observed, expected[present, i].double().sum(dim=0).cpu()))
    return pvalues


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    assert observed[expected == 0].sum() == 0, "a token with target probability 0 was emitted"
    big = expected >= 5
    small = ~big & (expected > 0)
    obs, exp = observed[big].tolist(), expected[big].tolist()
    if expected[small].sum() >= 5:
        obs.append(float(observed[small].sum()))
        exp.append(float(expected[small].sum()))
    elif small.any():  # too little to stand alone: join the smallest big bin
        j = min(range(len(exp)), key=exp.__getitem__)
        obs[j] += float(observed[small].sum())
        exp[j] += float(expected[small].sum())
    obs_t, exp_t = torch.tensor(obs), torch.tensor(exp)
    statistic = float(((obs_t - exp_t) ** 2 / exp_t).sum())
    return float(stats.chi2.sf(statistic, len(obs) - 1))


def assert_follows(out: torch.Tensor, expected: torch.Tensor, full_rounds: bool = True) -> None:
    """Every position's emitted tokens pass the χ² test (full_rounds: some round accepted all drafts,
    so every position was reached)."""
    if full_rounds:
        assert (rejection.num_emitted(out) == K + 1).any(), "no round accepted every draft"
    pvalues = position_pvalues(out, expected)
    assert min(pvalues) > ALPHA, pvalues


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("combo", list(COMBOS))
def test_emitted_tokens_follow_the_warped_target(combo, path):
    out, expected = run_rounds(PATHS[path], combo, ROUNDS[path], seed=len(combo))
    assert_follows(out, expected)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("combo", UNCUT)
def test_drafts_without_the_cut_are_lossless(combo, path):
    """q wider than p (ids the target's cut removes can be drafted, and are always rejected)."""
    out, expected = run_rounds(PATHS[path], combo, ROUNDS[path], seed=5, uncut=True)
    assert_follows(out, expected)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("combo", ONE_HOT)
def test_one_hot_drafts_are_lossless(combo, path):
    out, expected = run_rounds(PATHS[path], combo, ROUNDS[path], seed=3, one_hot=True)
    assert_follows(out, expected, full_rounds=False)


@pytest.mark.parametrize("path", list(PATHS))
def test_mis_specified_q_is_detected(path):
    """The same test must fail when the verifier is given a q other than the drafts' own."""
    out, expected = run_rounds(PATHS[path], "t1", ROUNDS[path], seed=4, wrong_q=True)
    assert min(position_pvalues(out, expected)) < ALPHA


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("combo", list(COMBOS))
def test_gumbel_coupling_emits_the_warped_target(combo, path):
    """Gumbel coupling: the emitted token at each position follows p̃, whatever the draft guessed."""
    out, expected = run_gumbel_rounds(PATHS[path], combo, GUMBEL_ROUNDS[path], seed=20 + len(combo))
    assert_follows(out, expected)


@pytest.mark.parametrize("path", list(PATHS))
def test_gumbel_coupling_with_a_wrong_target_row_is_detected(path):
    out, expected = run_gumbel_rounds(PATHS[path], "t1", GUMBEL_ROUNDS[path], seed=4, target_from_q=True)
    assert min(position_pvalues(out, expected)) < ALPHA
