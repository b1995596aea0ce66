"""gpu/kernels/warp.py against core/sampling/warp.warp (the torch reference): identical argmaxes, kept sets and
sampled ids, probabilities to rounding.

On CPU (CI) the kernels run in the Triton interpreter (tests/triton_cpu.py); on a GPU the same tests
run the compiled kernels. Vocab sizes: 100 (one register tile), 8193 (just past a power of two:
three segments, the last one column wide) and 32000 everywhere; 151936 on CUDA only (minutes in
the interpreter). Row counts shrink as the vocabulary grows to keep CPU time small.

Top-p rows get their top_p moved to the middle of the gap between two masses-above (settle_top_p):
the one kept-set ambiguity the two implementations may resolve differently is a mass within
float32 rounding of top_p (documented in core/sampling/warp.py).
"""

from triton_cpu import DEVICE, INTERPRETED  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from kernel_inputs import (OPTIONS, assert_warp_equal, make_logits, make_params, settle_top_p, warp_case)
from specgen.core.sampling import warp as sampling
from specgen.gpu.kernels import argmax as gpu_argmax
from specgen.gpu.kernels import cuts as gpu_cuts
from specgen.gpu.kernels import warp as gpu_warp
from specgen.gpu.workspace import Workspace


def parallel_rows(workspace: Workspace, rows: int) -> list[bool]:
    """Which rows of the workspace's last segmented warp had their cut finished by the parallel
    search (status 1 in its per-row state); the rest went through the one-program search."""
    state = workspace.get("warp_fast_state")
    if state is None:
        return [False] * rows
    return [v == 1 for v in state[: rows * gpu_cuts.FAST_STATE].view(rows, gpu_cuts.FAST_STATE)[:, 0].tolist()]


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("vocab, rows", [(100, 7), (8193, 3)])
def test_warp_matches_reference(option, vocab, rows):
    assert_warp_equal(*warp_case(option, rows, vocab, seed=vocab + len(option)))


@pytest.mark.parametrize("option", ["all", "mixed"])
def test_warp_matches_reference_32000(option):
    assert_warp_equal(*warp_case(option, 3, 32000, seed=7))


@pytest.mark.parametrize("vocab", [100, pytest.param(8193, marks=pytest.mark.slow)])
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
    """Long top-k / top-p rows: the parallel search finishes every row (parallel_rows) and
    matches the reference as the one-program search does."""
    gen = torch.Generator().manual_seed(vocab + len(values))
    logits = make_logits(3, vocab, gen, scale=scale, ties=ties)
    params = make_params(3, **values)
    if params.flags.top_p:
        params = settle_top_p(logits, params)
    workspace = Workspace(DEVICE)
    assert_warp_equal(logits, params, None, None, gen, workspace)
    assert parallel_rows(workspace, 3) == [True] * 3


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
                         top_k=[-1, gpu_cuts.FAST_TOP_K + 1, -1, -1, 30, -1],
                         top_p=[0.9, 1.0, 1.0, 1.0, 0.8, 0.5], min_p=[0.05, 0.0, 0.0, 0.0, 0.0, 0.0])
    params = settle_top_p(logits, params)
    workspace = Workspace(DEVICE)
    assert_warp_equal(logits, params, None, None, gen, workspace)
    assert parallel_rows(workspace, 6) == [False, False, False, False, True, False]


@pytest.mark.parametrize("per_program", [2, 3])
def test_warp_parallel_cut_search_bits_do_not_follow_chunks_a_program(per_program):
    """A pass program taking several chunks in turn (the last program with turns past the row's end)
    writes each chunk's sums as a program of one chunk does: the same probabilities, bit for bit."""
    gen = torch.Generator().manual_seed(6)
    logits = make_logits(3, 32000, gen, scale=2.0)
    params = settle_top_p(logits, make_params(3, temperature=[0.8, 1.0, 0.7], top_k=[-1, 100, 40],
                                              top_p=[0.95, 0.9, 1.0]))
    workspace = Workspace(DEVICE)
    _, one = gpu_warp.warp(logits, params, None, None, workspace, per_program=1)
    assert parallel_rows(workspace, 3) == [True] * 3
    _, several = gpu_warp.warp(logits, params, None, None, workspace, per_program=per_program)
    assert parallel_rows(workspace, 3) == [True] * 3
    assert torch.equal(one, several) and int(workspace.error) == 0


@pytest.mark.slow
def test_warp_parallel_cut_search_equals_one_program_search():
    """Both searches give the same kept sets and the same sampled ids on the same draws."""
    gen = torch.Generator().manual_seed(8)
    logits = make_logits(4, 32000, gen, scale=2.0)
    params = settle_top_p(logits, make_params(4, temperature=[0.8, 1.0, 0.6, 1.2], top_k=[-1, 100, -1, 20],
                                              top_p=[0.95, 0.9, 0.8, 1.0]))
    workspace = Workspace(DEVICE)
    _, fast = gpu_warp.warp(logits, params, None, None, workspace)
    assert parallel_rows(workspace, 4) == [True] * 4
    single = Workspace(DEVICE)
    _, slow = gpu_warp.warp(logits, params, None, None, single, parallel_cut=False)
    assert parallel_rows(single, 4) == [False] * 4
    assert int(workspace.error) == 0
    assert torch.equal(fast > 0, slow > 0)
    torch.testing.assert_close(fast, slow, rtol=1e-6, atol=1e-9)
    expo = sampling.exponentials(fast.shape, gen, "cpu").to(DEVICE)
    assert torch.equal(sampling.sample_race(fast, expo), sampling.sample_race(slow, expo))


@pytest.mark.parametrize("vocab", [100, *(pytest.param(v, marks=pytest.mark.slow) for v in (8193, 70000))])
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
    workspace = Workspace(DEVICE)
    _, alone = gpu_warp.warp(logits, params, None, None, workspace)
    for _ in range(2):
        out = torch.full((rows,), -1, dtype=torch.int64, device=DEVICE)
        argmax, probs = gpu_warp.warp(logits, params, None, None, workspace, expo, out)
        assert torch.equal(probs, alone)
        assert out.tolist() == sampling.sample_race(probs, expo).tolist()
    assert int(out[2]) == int(argmax[2])  # the greedy row races to its argmax
    assert int(out[3]) == 5
    assert int(workspace.error) == 0


def test_warp_writes_its_probs_where_asked():
    """probs_out (a draft step's row of the round's q): the probs land there, equal to a warp
    without it, and it is what warp returns; an all-greedy call leaves it alone."""
    gen = torch.Generator().manual_seed(4)
    logits = make_logits(2, 8193, gen)
    params = make_params(2, temperature=[0.8, 1.0], top_p=[0.95, 1.0])
    expo = sampling.exponentials((2, 8193), gen, "cpu").to(DEVICE)
    workspace = Workspace(DEVICE)
    _, alone = gpu_warp.warp(logits, params, None, None, workspace)
    q = torch.full((3, 8193), -1.0, device=DEVICE)
    out = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    _, probs = gpu_warp.warp(logits, params, None, None, workspace, expo, out, probs_out=q[1:])
    assert probs.data_ptr() == q[1:].data_ptr()
    assert torch.equal(q[1:], alone) and bool((q[0] == -1).all())
    greedy = make_params(2, temperature=0.0)
    assert gpu_warp.warp(logits, greedy, None, None, workspace, probs_out=q[1:])[1] is None
    assert torch.equal(q[1:], alone)


def test_warp_and_race_matches_the_reference():
    """warp with the race (the captured pick): same ids and probabilities as sampling's warp and race."""
    gen = torch.Generator().manual_seed(3)
    logits = make_logits(1, 8193, gen)
    params = make_params(1, temperature=0.8, top_p=0.95)
    expo = sampling.exponentials((1, 8193), gen, "cpu").to(DEVICE)
    out = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    _, probs = gpu_warp.warp(logits, params, None, None, Workspace(DEVICE), expo, out)
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


def test_launch_boundary_asserts_shapes():
    workspace = Workspace(DEVICE)
    logits = torch.zeros(3, 100, device=DEVICE)
    with pytest.raises(AssertionError):
        gpu_warp.warp(logits, make_params(2), None, None, workspace)  # params for 2 rows, logits for 3
    with pytest.raises(AssertionError):
        gpu_warp.warp(logits.t(), make_params(100), None, None, workspace)  # not contiguous
    with pytest.raises(AssertionError):
        gpu_warp.warp(logits, make_params(3), None, None, workspace, torch.ones(3, 100, device=DEVICE))  # no out


def test_minus_inf_logits_are_fine():
    gen = torch.Generator().manual_seed(0)
    logits = make_logits(3, 100, gen)
    logits[:, ::3] = float("-inf")
    assert_warp_equal(logits, make_params(3, **OPTIONS["all"]), None, None, gen)


@pytest.mark.parametrize("vocab,segment", [(1, None), (100, None), (4096, None), (128256, None), (100, 16),
                                           (4096, 512), (128256, 16384)])  # the module's segments, and several a row
def test_argmax_equals_torch(vocab, segment, monkeypatch):
    """argmax() against torch.argmax, exactly: random rows, rows whose maximum repeats (the first
    index wins, across segments too), a row of -inf, a row with -inf before its maximum."""
    if segment is not None:
        monkeypatch.setitem(gpu_argmax.ARGMAX_SEGMENT, INTERPRETED, segment)
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=gen)
    top = logits.max() + 1.0
    at = torch.randint(0, vocab, (3,), generator=gen).sort().values
    logits[1, at] = top  # ties: the smallest of those indices
    logits[2, -1] = top  # the last column
    logits[3] = float("-inf")
    logits[4, : vocab // 2] = float("-inf")
    logits[5] = torch.round(logits[5])  # many ties at the top
    logits = logits.to(DEVICE)
    out = torch.full((6,), -1, dtype=torch.int64, device=DEVICE)
    gpu_argmax.argmax(logits, out, Workspace(DEVICE))
    assert torch.equal(out, torch.argmax(logits, dim=-1))
    if vocab > 1:
        assert out[1].item() == at[0].item() and out[2].item() == vocab - 1
