"""Triton kernels (gpu/warp.py, gpu/verify.py) against the torch reference: identical token ids.

On CPU (CI) the kernels run in the Triton interpreter (tests/triton_cpu.py); on a GPU the same tests
run the compiled kernels. Vocab sizes: 100 (one register tile), 8193 (just past a power of two:
three segments, the last one column wide) and 32000 everywhere; 151936 on CUDA only (minutes in
the interpreter). Row counts shrink as the vocabulary grows to keep CPU time small; k in
{1, 2, 5, 8, 32} and batch 1 / 7 (per-request lengths, empty proposals among them) are covered
where they matter, in verification.

Top-p rows get their top_p moved to the middle of the gap between two masses-above (settle_top_p):
the one kept-set ambiguity the two implementations may resolve differently is a mass within
float32 rounding of top_p (documented in core/sampling.py).
"""

from triton_cpu import DEVICE, INTERPRETED  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import subprocess
import sys

import pytest
import torch

from specgen.core import rejection, sampling, verifier
from specgen.core.errors import DecodeError
from specgen.gpu import verify as gpu_verify
from specgen.gpu import warp as gpu_warp

cuda_only = [pytest.mark.cuda, pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")]
PH = rejection.PLACEHOLDER

# warp options: per-row values, cycled over the rows of a call
OPTIONS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=[0.5, 1.0, 1.5]),
    "top_k": dict(temperature=1.0, top_k=[1, 7, 40]),
    "top_p": dict(temperature=1.0, top_p=[0.3, 0.8, 0.95]),
    "min_p": dict(temperature=1.0, min_p=[0.02, 0.1, 0.3]),
    "penalties": dict(temperature=0.8, repetition_penalty=[1.3, 0.8, 1.1], presence_penalty=[0.5, 0.0, -0.2],
                      frequency_penalty=[0.3, 0.1, 0.0]),
    "bad_mask": dict(temperature=1.0),
    "all": dict(temperature=[0.7, 1.3], top_k=[40, 300], top_p=[0.9, 0.6], min_p=[0.05, 0.01],
                repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2),
    "mixed": dict(temperature=[0.0, 0.9, 1.2, 0.6], top_k=[-1, 30, -1, 5], top_p=[1.0, 0.9, 0.5, 1.0],
                  min_p=[0.0, 0.0, 0.1, 0.05]),
}
DEFAULTS = dict(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                frequency_penalty=0.0)


def make_params(rows: int, **values) -> sampling.WarpParams:
    def column(name):
        value = values.get(name, DEFAULTS[name])
        value = value if isinstance(value, list) else [value]
        dtype = torch.int32 if name == "top_k" else torch.float32
        return torch.tensor([value[i % len(value)] for i in range(rows)], dtype=dtype, device=DEVICE)

    return sampling.WarpParams(**{name: column(name) for name in DEFAULTS})


def make_logits(rows: int, vocab: int, gen: torch.Generator, scale: float = 3.0, ties: bool = False):
    logits = torch.randn(rows, vocab, generator=gen) * scale
    if ties:  # many exact ties, also at top-k / top-p boundaries
        logits = torch.round(logits * 2) / 2
    return logits.to(DEVICE)


def make_penalties(rows: int, vocab: int, gen: torch.Generator) -> sampling.PenaltyRows:
    """Output counts before the round plus rows - 1 drafted ids counted intra-round (penalty_rows)."""
    counts = torch.randint(0, 4, (vocab,), generator=gen, dtype=torch.int32)
    counts = torch.where(torch.rand(vocab, generator=gen) < 0.05, counts, 0)
    seen = (counts > 0) | (torch.rand(vocab, generator=gen) < 0.05)
    drafted = torch.randint(0, vocab, (rows - 1,), generator=gen)
    drafted[-1:] = drafted[:1]  # a repeated draft counts twice
    return sampling.penalty_rows(counts.to(DEVICE), seen.to(DEVICE), drafted.to(DEVICE))


def settle_top_p(logits, params, penalties=None, bad_mask=None) -> sampling.WarpParams:
    """Move each row's top_p to the middle of a gap between two masses-above at least 1e-5 wide."""
    flat = sampling.apply_penalties(logits, params, penalties, bad_mask)
    top = flat.max(dim=-1, keepdim=True).values
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0).unsqueeze(1)
    e = torch.exp((flat - top) / temperature)
    if params.flags.top_k:
        e = torch.where(flat >= sampling._top_k_cut(flat, params.top_k), e, 0.0)
    probs = (e / e.sum(dim=-1, keepdim=True)).double()
    top_p = params.top_p.clone()
    for row in range(flat.shape[0]):
        if top_p[row] >= 1:
            continue
        values, order = flat[row].sort(descending=True)
        p = probs[row][order]
        first = torch.ones_like(values, dtype=torch.bool)
        first[1:] = values[1:] != values[:-1]
        masses = (p.cumsum(0) - p)[first & (values > float("-inf"))]  # mass above each tie group
        gaps = masses[1:] - masses[:-1]
        mids = (masses[1:] + masses[:-1]) / 2
        wide = gaps > 1e-5
        if wide.any():
            best = torch.where(wide, (mids - top_p[row].double()).abs(), float("inf")).argmin()
            top_p[row] = float(mids[best])
    return sampling.WarpParams(params.temperature, params.top_k, top_p, params.min_p, params.repetition_penalty,
                               params.presence_penalty, params.frequency_penalty)


def warp_case(option: str, rows: int, vocab: int, seed: int, ties: bool = False):
    gen = torch.Generator().manual_seed(seed)
    logits = make_logits(rows, vocab, gen, ties=ties)
    params = make_params(rows, **OPTIONS[option])
    penalties = make_penalties(rows, vocab, gen) if option in ("penalties", "all") else None
    bad_mask = None
    if option == "bad_mask":
        bad_mask = (torch.rand(vocab, generator=gen) < 0.3).to(DEVICE)
    elif option == "all":
        bad_mask = (torch.rand(rows, vocab, generator=gen) < 0.1).to(DEVICE)
    if params.flags.top_p:
        params = settle_top_p(logits, params, penalties, bad_mask)
    return logits, params, penalties, bad_mask, gen


def assert_warp_equal(logits, params, penalties, bad_mask, gen):
    """Kernel == reference: argmax, kept set, probabilities to rounding, and sampled ids exactly."""
    ref_argmax, ref_probs = sampling.warp(logits, params, penalties, bad_mask)
    error = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    argmax, probs = gpu_warp.warp(logits, params, penalties, bad_mask, error)
    assert int(error) == 0
    assert torch.equal(argmax, ref_argmax)
    if ref_probs is None:
        assert probs is None
        return
    assert torch.equal(probs > 0, ref_probs > 0), "kept sets differ"
    torch.testing.assert_close(probs, ref_probs, rtol=2e-5, atol=1e-8)
    expo = sampling.exponentials(probs.shape, gen, "cpu").to(DEVICE)
    assert torch.equal(sampling.sample_race(probs, expo), sampling.sample_race(ref_probs, expo))


# ---------------------------------------------------------------------------------------------
# warp
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("vocab, rows", [(100, 7), (8193, 3)])
def test_warp_matches_reference(option, vocab, rows):
    assert_warp_equal(*warp_case(option, rows, vocab, seed=vocab + len(option)))


@pytest.mark.parametrize("option", ["all", "mixed"])
def test_warp_matches_reference_32000(option):
    assert_warp_equal(*warp_case(option, 3, 32000, seed=7))


@pytest.mark.parametrize("vocab", [100, 8193])
def test_warp_ties_at_cuts(vocab):
    """Logits on a 0.5 grid: top-k / top-p boundaries fall inside tie groups, which stay whole."""
    for option in ("top_k", "top_p", "all"):
        assert_warp_equal(*warp_case(option, 3, vocab, seed=11, ties=True))


@pytest.mark.parametrize(
    "values, scale",
    [
        (dict(temperature=1.0, top_k=[5000, 6000]), 3.0),  # k > 4096 candidates: bracket-only finish
        (dict(temperature=1.0, top_p=[0.5, 0.9]), 0.3),  # flat rows: > 4096 ids above the bracket
        (dict(temperature=1.0, top_k=[6000], top_p=[0.7], min_p=[0.001]), 0.5),  # every stage by passes
    ],
)
def test_warp_long_rows_beyond_candidate_capacity(values, scale):
    gen = torch.Generator().manual_seed(5)
    logits = make_logits(2, 8193, gen, scale=scale)
    params = make_params(2, **values)
    if params.flags.top_p:
        params = settle_top_p(logits, params)
    assert_warp_equal(logits, params, None, None, gen)


@pytest.mark.parametrize("values", [dict(top_k=[3000]), dict(top_p=[0.4]), dict(top_k=[5000], top_p=[0.7])])
def test_warp_cut_search_over_several_passes(values):
    """A dense cluster between far outliers defeats value-spaced pivots for a pass or more; a tie
    group larger than the candidate capacity ends the search on the tie value itself."""
    gen = torch.Generator().manual_seed(9)
    cluster = torch.randn(2, 8193, generator=gen) * 1e-3
    cluster[:, :2] = torch.tensor([-30.0, 10.0])  # outliers stretch the value range
    ties = torch.randn(2, 8193, generator=gen) * 3
    ties[:, 1000:7000] = 0.0  # 6000 equal logits straddle every cut
    logits = torch.cat([cluster, ties]).to(DEVICE)
    params = make_params(4, temperature=1.0, **values)
    if params.flags.top_p:
        params = settle_top_p(logits, params)
    assert_warp_equal(logits, params, None, None, gen)


@pytest.mark.parametrize("vocab", [8193, 32000])
@pytest.mark.parametrize(
    "values, scale, ties",
    [
        (dict(temperature=0.8, top_p=[0.95, 0.5, 0.99]), 3.0, False),
        (dict(temperature=0.8, top_p=[0.95, 0.9, 0.7]), 0.5, False),  # flat rows: hundreds of ids in the bracket
        (dict(temperature=1.0, top_k=[1, 50, 256]), 3.0, False),
        (dict(temperature=0.7, top_k=[40, 200, 5], top_p=[0.9, 0.6, 0.99]), 2.0, False),
        (dict(temperature=1.0, top_k=[7, 40, 100], top_p=[0.8, 1.0, 0.5]), 3.0, True),  # cuts inside tie groups
        (dict(temperature=1.0, top_p=[0.3, 0.8, 0.9]), 3.0, True),
    ],
)
def test_warp_parallel_cut_search(vocab, values, scale, ties):
    """Long top-k / top-p rows: the parallel search finishes every row (gpu_warp.fast_rows) and
    matches the reference as the one-program search does."""
    gen = torch.Generator().manual_seed(vocab + len(values))
    logits = make_logits(3, vocab, gen, scale=scale, ties=ties)
    params = make_params(3, **values)
    if params.flags.top_p:
        params = settle_top_p(logits, params)
    assert_warp_equal(logits, params, None, None, gen)
    assert gpu_warp.fast_rows(3, DEVICE) == [True] * 3


def test_warp_parallel_cut_search_hands_rows_over():
    """Rows the parallel search does not take (min-p, k above FAST_TOP_K, greedy, no cut) or cannot
    narrow to FAST_CAP candidates (a tie group of 6000 at the cut) go through the one-program search
    in the same launch, and every row still matches the reference."""
    gen = torch.Generator().manual_seed(4)
    logits = make_logits(6, 8193, gen)
    logits[5] = logits[5] * 0.01 - 1.0
    logits[5, 1000:7000] = 0.0  # 6000 equal logits between 50 larger ones and the rest: the top-p
    logits[5, :50] = 2.0  # cut of row 5 lands inside the tie group
    params = make_params(6, temperature=[0.8, 1.0, 0.0, 1.0, 0.9, 1.0],
                         top_k=[-1, gpu_warp.FAST_TOP_K + 1, -1, -1, 30, -1],
                         top_p=[0.9, 1.0, 1.0, 1.0, 0.8, 0.5], min_p=[0.05, 0.0, 0.0, 0.0, 0.0, 0.0])
    params = settle_top_p(logits, params)
    assert_warp_equal(logits, params, None, None, gen)
    assert gpu_warp.fast_rows(6, DEVICE) == [False, False, False, False, True, False]


def test_warp_parallel_cut_search_equals_one_program_search(monkeypatch):
    """Both searches give the same kept sets and the same sampled ids on the same draws."""
    gen = torch.Generator().manual_seed(8)
    logits = make_logits(4, 32000, gen, scale=2.0)
    params = settle_top_p(logits, make_params(4, temperature=[0.8, 1.0, 0.6, 1.2], top_k=[-1, 100, -1, 20],
                                              top_p=[0.95, 0.9, 0.8, 1.0]))
    error = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    _, fast = gpu_warp.warp(logits, params, None, None, error)
    assert gpu_warp.fast_rows(4, DEVICE) == [True] * 4
    monkeypatch.setattr(gpu_warp, "FAST_CUT", False)
    _, slow = gpu_warp.warp(logits, params, None, None, error)
    assert int(error) == 0
    assert torch.equal(fast > 0, slow > 0)
    torch.testing.assert_close(fast, slow, rtol=1e-6, atol=1e-9)
    expo = sampling.exponentials(fast.shape, gen, "cpu").to(DEVICE)
    assert torch.equal(sampling.sample_race(fast, expo), sampling.sample_race(slow, expo))


@pytest.mark.parametrize("vocab", [100, 8193, 70000])
def test_warp_with_race_matches_sample_race(vocab):
    """warp(..., expo, race_out): the probs kernel's race gives sampling.sample_race's ids for the same
    draws (zero-probability ids, a greedy row and an exact tie of p / E, where the first id wins,
    included), the same probabilities as warp alone, and again on a second call (the arrival
    counters reset themselves)."""
    gen = torch.Generator().manual_seed(vocab)
    rows = 4
    logits = make_logits(rows, vocab, gen)
    logits[3, [5, vocab // 2, vocab - 1]] = 50.0  # three equal top logits ...
    params = make_params(rows, temperature=[1.0, 0.7, 0.0, 1.0], top_p=[0.9, 0.5, 1.0, 0.999999])
    expo = sampling.exponentials((rows, vocab), gen, "cpu").to(DEVICE)
    expo[3, [5, vocab // 2, vocab - 1]] = 1.0  # ... and equal draws: an exact tie of p / E
    error = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    _, alone = gpu_warp.warp(logits, params, None, None, error)
    for _ in range(2):
        out = torch.full((rows,), -1, dtype=torch.int64, device=DEVICE)
        argmax, probs = gpu_warp.warp(logits, params, None, None, error, expo, out)
        assert torch.equal(probs, alone)
        assert out.tolist() == sampling.sample_race(probs, expo).tolist()
    assert int(out[2]) == int(argmax[2])  # the greedy row races to its argmax
    assert int(out[3]) == 5
    assert int(error) == 0


def test_warp_and_race_dispatch_matches_the_reference():
    """verifier.warp_and_race (the captured pick): same ids and probabilities as sampling's warp and race."""
    gen = torch.Generator().manual_seed(3)
    logits = make_logits(1, 8193, gen)
    params = make_params(1, temperature=0.8, top_p=0.95)
    expo = sampling.exponentials((1, 8193), gen, "cpu").to(DEVICE)
    out = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    probs = verifier.warp_and_race(logits, params, expo, out)
    _, ref = sampling.warp(logits, params)
    assert torch.equal(probs > 0, ref > 0)
    assert out.tolist() == sampling.sample_race(ref, expo).tolist()


def test_warp_bfloat16_logits():
    gen = torch.Generator().manual_seed(2)
    logits = make_logits(3, 100, gen).to(torch.bfloat16)
    assert_warp_equal(logits, make_params(3, **OPTIONS["all"]), None, None, gen)


@pytest.mark.parametrize("option", ["all", "mixed", "temperature"])
@pytest.mark.cuda
@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")
def test_warp_matches_reference_151936(option):
    assert_warp_equal(*warp_case(option, 5, 151936, seed=3))


# ---------------------------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------------------------


def lengths(batch: int, k: int) -> list[int]:
    """Per-request draft lengths: batch 1 drafts k; batch 7 mixes k, shorter and empty proposals."""
    if batch == 1:
        return [k]
    return [k, 0, min(1, k), k, max(k - 1, 0), k // 2, k][:batch]


def round_inputs(vocab: int, k: int, batch: int, seed: int):
    """One round's verifier inputs: target p [T+B, V], draft q [T, V] with drafts drawn from q.

    Request b's q is p plus noise of its own size, so requests range from all-accepted to rejected
    at position 0.
    """
    gen = torch.Generator().manual_seed(seed)
    num = torch.tensor(lengths(batch, k))
    cu = num.cumsum(0).to(torch.int32)
    total = int(num.sum())
    target_logits = make_logits(total + batch, vocab, gen)
    params = make_params(total + batch, temperature=1.0, top_k=[-1, 50, -1], min_p=[0.0, 0.0, 0.01])
    _, target = sampling.warp(target_logits, params)
    rows = [s + b + i for b, (s, n) in enumerate(zip((cu - num).tolist(), num.tolist())) for i in range(n)]
    request = [b for b, n in enumerate(num.tolist()) for _ in range(n)]
    noise = torch.tensor([0.0, 0.3, 1.0, 3.0])[torch.tensor(request, dtype=torch.long) % 4].unsqueeze(1).to(DEVICE)
    draft_logits = target_logits[rows] + noise * make_logits(total, vocab, gen, scale=1.0)
    _, draft = sampling.warp(draft_logits, make_params(total, temperature=1.0))
    drafted = sampling.sample_race(draft, sampling.exponentials(draft.shape, gen, "cpu").to(DEVICE))
    uniform = sampling.uniforms((total,), gen, "cpu").to(DEVICE)
    expo = sampling.exponentials((batch, vocab), gen, "cpu").to(DEVICE)
    return drafted, cu.to(DEVICE), draft, target, uniform, expo


def assert_verify_equal(drafted, cu, draft, target, uniform, expo, k):
    error = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    for q in (draft, None):  # probabilistic drafting, then one-hot q (n-gram / argmax drafting)
        ref = rejection.verify_random(drafted, cu, q, target, uniform, expo, k)
        out = gpu_verify.verify_random(drafted, cu, q, target, uniform, expo, k, error)
        assert torch.equal(out, ref), (out, ref)
    argmax = target.argmax(dim=-1)
    ref = rejection.verify_greedy(drafted, cu, argmax, k)
    assert torch.equal(gpu_verify.verify_greedy(drafted, cu, argmax, k, error), ref)
    assert int(error) == 0
    return ref


@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("k", [1, 2, 5, 8, 32])
def test_verify_matches_reference(k, batch):
    assert_verify_equal(*round_inputs(100, k, batch, seed=10 * k + batch), k)


@pytest.mark.parametrize("k, batch", [(1, 7), (5, 1), (32, 1), (2, 7)])
def test_verify_matches_reference_segmented(k, batch):
    assert_verify_equal(*round_inputs(8193, k, batch, seed=k), k)


def test_verify_matches_reference_32000():
    assert_verify_equal(*round_inputs(32000, 8, 7, seed=4), 8)


@pytest.mark.parametrize("vocab", [128256, 151936])
@pytest.mark.cuda
@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")
def test_verify_matches_reference_large_vocab(vocab):
    for k, batch in ((1, 7), (4, 1), (8, 7), (32, 1)):
        assert_verify_equal(*round_inputs(vocab, k, batch, seed=k), k)


@pytest.mark.parametrize("vocab", [100, 8193])
@pytest.mark.parametrize("option", ["all", "mixed", "penalties", "greedy"])
def test_round_through_kernels(vocab, option):
    """A whole round, warp -> race drafts -> warp -> verify, through each path: identical output."""
    k = 3
    gen = torch.Generator().manual_seed(vocab + 1)
    target_logits = make_logits(k + 1, vocab, gen)
    draft_logits = target_logits[:k] + make_logits(k, vocab, gen, scale=0.5)
    params = make_params(k + 1, **OPTIONS[option])
    if params.flags.top_p:
        params = settle_top_p(target_logits, params)
    drafted = target_logits[:k].argmax(dim=-1)
    penalties = sampling.penalty_rows(*_base_counts(vocab, gen), drafted) if option in ("all", "penalties") else None
    draft_expo = sampling.exponentials((k, vocab), gen, "cpu").to(DEVICE)
    uniform = sampling.uniforms((k,), gen, "cpu").to(DEVICE)
    expo = sampling.exponentials((1, vocab), gen, "cpu").to(DEVICE)
    cu = torch.tensor([k], dtype=torch.int32, device=DEVICE)
    outputs = []
    for warp, error in ((sampling.warp, None), (gpu_warp.warp, torch.zeros(1, dtype=torch.int32, device=DEVICE))):
        extra = () if error is None else (error,)
        _, q = warp(draft_logits, params.slice(0, k), _rows(penalties, 0, k), None, *extra)
        drafts = drafted if q is None else sampling.sample_race(q, draft_expo)
        argmax, p = warp(target_logits, params, penalties, None, *extra)
        if p is None:
            outputs.append(rejection.verify_greedy(drafts, cu, argmax, k))
        else:
            outputs.append(rejection.verify_random(drafts, cu, q, p, uniform, expo, k))
    assert torch.equal(outputs[0], outputs[1])


def _base_counts(vocab, gen):
    counts = torch.where(torch.rand(vocab, generator=gen) < 0.1, 2, 0).to(torch.int32)
    return counts.to(DEVICE), (counts > 0).to(DEVICE)


def _rows(penalties, start, stop):
    if penalties is None:
        return None
    return sampling.PenaltyRows(penalties.counts[start:stop].contiguous(), penalties.seen[start:stop].contiguous())


# ---------------------------------------------------------------------------------------------
# edge cases
# ---------------------------------------------------------------------------------------------


def both_random(drafted, cu, q, p, uniform, expo, k):
    error = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    ref = rejection.verify_random(drafted, cu, q, p, uniform, expo, k)
    out = gpu_verify.verify_random(drafted, cu, q, p, uniform, expo, k, error)
    assert torch.equal(out, ref)
    return out


def simple_round(vocab=100, k=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    _, p = sampling.warp(make_logits(k + 1, vocab, gen), make_params(k + 1))
    _, q = sampling.warp(make_logits(k, vocab, gen), make_params(k))
    drafted = sampling.sample_race(q, sampling.exponentials(q.shape, gen, "cpu").to(DEVICE))
    uniform = sampling.uniforms((k,), gen, "cpu").to(DEVICE)
    expo = sampling.exponentials((1, vocab), gen, "cpu").to(DEVICE)
    return drafted, torch.tensor([k], dtype=torch.int32, device=DEVICE), q, p, uniform, expo


@pytest.mark.parametrize("vocab", [100, 8193])
def test_all_rejected_at_position_zero(vocab):
    drafted, cu, q, p, uniform, expo = simple_round(vocab)
    p[0, drafted[0]] = 0.0  # p(x) = 0: rejected whatever u is
    uniform[0] = torch.finfo(torch.float32).tiny
    for draft_probs in (q, None):
        out = both_random(drafted, cu, draft_probs, p, uniform, expo, 4)
        assert out[0, 1:].tolist() == [PH] * 4
        assert int(out[0, 0]) != int(drafted[0]) and float(p[0, out[0, 0]]) > 0


@pytest.mark.parametrize("vocab", [100, 8193])
def test_all_accepted_gives_bonus(vocab):
    drafted, cu, q, p, uniform, expo = simple_round(vocab)
    q = p[:4].clone()  # q == p: always accepted, then the bonus from p at position 4
    out = both_random(drafted, cu, q, p, uniform, expo, 4)
    assert out[0, :4].tolist() == drafted.tolist()
    assert int(out[0, 4]) == int((p[4] / expo[0]).argmax())


def test_p_zero_on_drafted_token_mid_round():
    drafted, cu, q, p, uniform, expo = simple_round()
    q = p[:4].clone()
    p[2, drafted[2]] = 0.0
    uniform.fill_(torch.finfo(torch.float32).tiny)
    for draft_probs in (q, None):
        out = both_random(drafted, cu, draft_probs, p, uniform, expo, 4)
        assert out[0, :2].tolist() == drafted[:2].tolist()
        assert int(out[0, 2]) != int(drafted[2]) and out[0, 3:].tolist() == [PH] * 2


def test_zero_residual_falls_back_to_p():
    """q >= p everywhere (only possible through rounding): the recovered token is drawn from p."""
    drafted, cu, q, p, uniform, expo = simple_round()
    q = p[:4] * (1 + 2**-20)
    uniform.fill_(1.0)
    out = both_random(drafted, cu, q, p, uniform, expo, 4)
    assert int(out[0, 0]) == int((p[0] / expo[0]).argmax())


@pytest.mark.parametrize("vocab", [100, 8193])
def test_empty_proposals(vocab):
    gen = torch.Generator().manual_seed(1)
    _, p = sampling.warp(make_logits(3, vocab, gen), make_params(3))
    expo = sampling.exponentials((3, vocab), gen, "cpu").to(DEVICE)
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    nothing = torch.zeros(0, dtype=torch.float32, device=DEVICE)
    cu = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    for k in (0, 2):  # max_spec_len 0, and placeholders after the bonus
        out = both_random(empty, cu, None, p, nothing, expo, k)
        assert out[:, 0].tolist() == (p / expo).argmax(dim=-1).tolist()
        assert (out[:, 1:] == PH).all()
        argmax = p.argmax(dim=-1)
        error = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        assert torch.equal(gpu_verify.verify_greedy(empty, cu, argmax, k, error),
                           rejection.verify_greedy(empty, cu, argmax, k))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("vocab", [100, 8193])
def test_nan_or_inf_logits_raise_decode_error(bad, vocab):
    """The reference raises in warp; the kernel's flag comes back in the verify output, and
    verifier.emitted (the round's one host read) raises the same DecodeError."""
    gen = torch.Generator().manual_seed(0)
    logits = make_logits(3, vocab, gen)
    logits[1, 5] = bad
    params = make_params(3)
    with pytest.raises(DecodeError, match="NaN or \\+inf"):
        sampling.warp(logits, params)
    error = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    argmax, probs = gpu_warp.warp(logits, params, None, None, error)
    assert int(error) == gpu_warp.ERROR_BAD_LOGITS
    drafted = argmax[:2]
    cu = torch.tensor([2], dtype=torch.int32, device=DEVICE)
    uniform = torch.ones(2, device=DEVICE)
    expo = torch.ones(1, vocab, device=DEVICE)
    outputs = [gpu_verify.verify_random(drafted, cu, None, probs, uniform, expo, 2, error),
               gpu_verify.verify_greedy(drafted, cu, argmax, 2, error)]
    for out in outputs:
        assert int(out[0, 0]) == gpu_verify.ERROR_BAD_LOGITS
        verifier._error_flag(out.device).fill_(1)  # as the dispatcher's own flag would be
        with pytest.raises(DecodeError, match="NaN or \\+inf"):
            verifier.emitted(out)
        assert int(verifier._error_flag(out.device)) == 0  # cleared for the next request


def test_every_id_masked_raises_decode_error():
    gen = torch.Generator().manual_seed(0)
    logits = make_logits(2, 100, gen)
    bad_mask = torch.ones(100, dtype=torch.bool, device=DEVICE)
    with pytest.raises(DecodeError, match="masked"):
        sampling.warp(logits, make_params(2), None, bad_mask)
    error = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    argmax, _ = gpu_warp.warp(logits, make_params(2, temperature=0.0), None, bad_mask, error)
    out = gpu_verify.verify_greedy(argmax[:1], torch.tensor([1], dtype=torch.int32, device=DEVICE), argmax, 1, error)
    assert int(out[0, 0]) == gpu_verify.ERROR_ALL_MASKED
    with pytest.raises(DecodeError, match="masked"):
        verifier.emitted(out)


def test_minus_inf_logits_are_fine():
    gen = torch.Generator().manual_seed(0)
    logits = make_logits(3, 100, gen)
    logits[:, ::3] = float("-inf")
    assert_warp_equal(logits, make_params(3, **OPTIONS["all"]), None, None, gen)


def test_launch_boundary_asserts_shapes():
    error = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    logits = torch.zeros(3, 100, device=DEVICE)
    with pytest.raises(AssertionError):
        gpu_warp.warp(logits, make_params(2), None, None, error)  # params for 2 rows, logits for 3
    with pytest.raises(AssertionError):
        gpu_warp.warp(logits.t(), make_params(100), None, None, error)  # not contiguous
    drafted, cu, q, p, uniform, expo = simple_round()
    with pytest.raises(AssertionError):
        gpu_verify.verify_random(drafted, cu, q, p[:4], uniform, expo, 4, error)  # T + B target rows
    with pytest.raises(AssertionError):
        gpu_verify.verify_random(drafted, cu.long(), q, p, uniform, expo, 4, error)  # int32 offsets


@pytest.mark.cuda
@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")
def test_kernels_compile_once_per_vocab_bucket():
    """k, batch and row counts are runtime values: new ones never compile a kernel again."""
    def compiled(kernel):
        caches = getattr(kernel, "device_caches", None)
        if caches is not None:
            return sum(len(entry[0]) for entry in caches.values())
        return sum(len(cache) for cache in kernel.cache.values())

    kernels = [gpu_verify._verify_random_kernel, gpu_verify._verify_greedy_kernel, gpu_warp._warp_stats_kernel,
               gpu_warp._warp_probs_kernel, gpu_warp._warp_cut_kernel]
    assert_verify_equal(*round_inputs(32000, 2, 7, seed=0), 2)
    assert_warp_equal(*warp_case("all", 3, 32000, seed=0))
    before = [compiled(kernel) for kernel in kernels]
    for k, batch in ((1, 1), (5, 7), (8, 3), (32, 1)):
        assert_verify_equal(*round_inputs(32000, k, batch, seed=k), k)
        assert_warp_equal(*warp_case("all", batch + 1, 32000, seed=k))
    assert [compiled(kernel) for kernel in kernels] == before


def test_dispatcher_uses_reference_off_cuda_and_core_imports_without_triton():
    gen = torch.Generator().manual_seed(0)
    logits = make_logits(3, 100, gen).cpu()
    params = sampling.WarpParams(*(getattr(make_params(3, **OPTIONS["all"]), f).cpu()
                                   for f in sampling.WarpParams.__dataclass_fields__))
    assert not verifier.use_triton(torch.device("cpu"))
    ref = sampling.warp(logits, params)
    got = verifier.warp(logits, params)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    code = "import sys, specgen.core.verifier, specgen.core.decode; assert 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
