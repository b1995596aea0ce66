"""gpu/kernels/verify.py against core/sampling/rejection.py (the torch reference): identical output rows, and a
whole round (warp -> race drafts -> warp -> verify) through the kernels and through the reference.

On CPU (CI) the kernels run in the Triton interpreter (tests/triton_cpu.py); on a GPU the same
tests run the compiled kernels. k in {1, 2, 5, 8, 32} and batch 1 / 7 (per-request lengths, empty
proposals among them); vocab 100, 8193 (segmented) and 32000; 128256 and 151936 on CUDA only.
"""

from triton_cpu import DEVICE, INTERPRETED  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from kernel_inputs import (OPTIONS, assert_verify_equal, assert_warp_equal, both_random, make_logits, make_params,
                           round_inputs, settle_top_p, simple_round, warp_case)
from specgen.core.sampling import rejection
from specgen.core.sampling import warp as sampling
from specgen.core.errors import DecodeError
from specgen.gpu.kernels import verify as gpu_verify
from specgen.gpu.kernels import warp as gpu_warp
from specgen.gpu.workspace import Workspace

PH = rejection.PLACEHOLDER


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
    for warp, workspace in ((sampling.warp, None), (gpu_warp.warp, Workspace(DEVICE))):
        extra = () if workspace is None else (workspace,)
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
        workspace = Workspace(DEVICE)
        assert torch.equal(gpu_verify.verify_greedy(empty, cu, argmax, k, workspace),
                           rejection.verify_greedy(empty, cu, argmax, k))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("vocab", [100, 8193])
def test_nan_or_inf_logits_raise_decode_error(bad, vocab):
    """The reference raises in warp; the kernel's flag (workspace.error) comes back in the verify
    output, gpu_verify.check_output (the round's one host read) raises the same DecodeError, and after
    workspace.clear_error() the next round's output is clean."""
    gen = torch.Generator().manual_seed(0)
    logits = make_logits(3, vocab, gen)
    logits[1, 5] = bad
    params = make_params(3)
    with pytest.raises(DecodeError, match="NaN or \\+inf"):
        sampling.warp(logits, params)
    workspace = Workspace(DEVICE)
    argmax, probs = gpu_warp.warp(logits, params, None, None, workspace)
    assert int(workspace.error) == gpu_warp.ERROR_BAD_LOGITS
    drafted = argmax[:2]
    cu = torch.tensor([2], dtype=torch.int32, device=DEVICE)
    uniform = torch.ones(2, device=DEVICE)
    expo = torch.ones(1, vocab, device=DEVICE)
    outputs = [gpu_verify.verify_random(drafted, cu, None, probs, uniform, expo, 2, workspace),
               gpu_verify.verify_greedy(drafted, cu, argmax, 2, workspace)]
    for out in outputs:
        assert int(out[0, 0]) == gpu_verify.ERROR_BAD_LOGITS
        with pytest.raises(DecodeError, match="NaN or \\+inf"):
            gpu_verify.check_output(int(out[0, 0]), workspace)
    workspace.clear_error()
    assert int(workspace.error) == 0  # cleared for the next request
    assert int(gpu_verify.verify_greedy(drafted, cu, argmax, 2, workspace)[0, 0]) == int(argmax[0])


def test_every_id_masked_raises_decode_error():
    gen = torch.Generator().manual_seed(0)
    logits = make_logits(2, 100, gen)
    bad_mask = torch.ones(100, dtype=torch.bool, device=DEVICE)
    with pytest.raises(DecodeError, match="masked"):
        sampling.warp(logits, make_params(2), None, bad_mask)
    workspace = Workspace(DEVICE)
    argmax, _ = gpu_warp.warp(logits, make_params(2, temperature=0.0), None, bad_mask, workspace)
    out = gpu_verify.verify_greedy(argmax[:1], torch.tensor([1], dtype=torch.int32, device=DEVICE), argmax, 1, workspace)
    assert int(out[0, 0]) == gpu_verify.ERROR_ALL_MASKED
    with pytest.raises(DecodeError, match="masked"):
        gpu_verify.check_output(int(out[0, 0]), workspace)


def test_launch_boundary_asserts_shapes():
    workspace = Workspace(DEVICE)
    drafted, cu, q, p, uniform, expo = simple_round()
    with pytest.raises(AssertionError):
        gpu_verify.verify_random(drafted, cu, q, p[:4], uniform, expo, 4, workspace)  # T + B target rows
    with pytest.raises(AssertionError):
        gpu_verify.verify_random(drafted, cu.long(), q, p, uniform, expo, 4, workspace)  # int32 offsets


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
