"""core/round/couplings.py: each coupling's draws, race rows and verification, against the torch
references (core/sampling/warp.py, core/sampling/rejection.py, core/sampling/noise.py) on the same random inputs."""

from __future__ import annotations

import torch

from round_helpers import shared
from specgen.core.sampling import noise
from specgen.core.sampling import rejection
from specgen.core.sampling import warp as sampling
from specgen.core.round.couplings import GumbelCoupling, RejectionCoupling
from specgen.core.sampling.warp import WarpParams
from specgen.core.settings import SamplingSpec


def filled(k: int, width: int, drafts: list[int], seed: int = 0):
    rnd = shared(k, width)
    rnd.target_logits.copy_(torch.randn(k + 1, width, generator=torch.Generator().manual_seed(seed)) * 2)
    rnd.drafts.copy_(torch.tensor(drafts))
    rnd.num_drafts.fill_(len(drafts) - 1)  # the last draft does not count
    return rnd


def test_rejection_draws_in_order_and_races_only_sampled_drafts():
    rnd = shared(3, 16)
    coupling = RejectionCoupling(rnd, sampled=True, draft_races=True)
    coupling.draw(torch.Generator().manual_seed(5))
    gen = torch.Generator().manual_seed(5)
    assert torch.equal(coupling.noise, sampling.exponentials((4, 16), gen, "cpu"))
    assert torch.equal(coupling.uniform, sampling.uniforms((3,), gen, "cpu"))
    noise_row, probs_out = coupling.race(1)
    assert noise_row.data_ptr() == coupling.noise[1].data_ptr() and probs_out.data_ptr() == coupling.q[1].data_ptr()
    argmax_drafts = RejectionCoupling(rnd, sampled=True, draft_races=False)
    assert argmax_drafts.race(0) is None and argmax_drafts.noise.shape[0] == 1 and argmax_drafts.q is None
    greedy = RejectionCoupling(rnd, sampled=False, draft_races=False)
    state = gen.get_state()
    greedy.draw(gen)
    assert greedy.noise is None and torch.equal(gen.get_state(), state)


def test_rejection_verify_equals_the_reference():
    k, width = 3, 16
    for spec in (SamplingSpec(), SamplingSpec(temperature=0.9)):
        rnd = filled(k, width, [4, 9, 2])
        coupling = RejectionCoupling(rnd, sampled=not spec.greedy, draft_races=not spec.greedy)
        coupling.draw(torch.Generator().manual_seed(1))
        if coupling.q is not None:
            coupling.q.copy_(torch.softmax(torch.randn(k, width), dim=-1))
        params = WarpParams.from_spec(spec, k + 1)
        for one_hot in (False, True):
            probs, q = coupling.verify((params, None, None), one_hot)
            argmax, want_probs = sampling.warp(rnd.target_logits, params)
            if spec.greedy:
                want = rejection.verify_greedy(rnd.drafts, rnd.num_drafts, argmax, k)
            else:
                want = rejection.verify_random(rnd.drafts, rnd.num_drafts, None if one_hot else coupling.q,
                                               want_probs, coupling.uniform, coupling.noise[-1:], k)
                assert torch.equal(probs, want_probs)
            assert torch.equal(rnd.out, want), (spec, one_hot)
            assert (q is None) == (one_hot or coupling.q is None)


def test_gumbel_noise_and_verification_follow_positions():
    """Row i's noise is the reference's at position origin + generated + i; x is the race of p
    against it, and a draft counts iff it equals x."""
    k, width, spec = 3, 16, SamplingSpec(temperature=0.8)
    rnd = filled(k, width, [4, 9, 2])
    coupling = GumbelCoupling(rnd, draft_races=True)
    coupling.start(seed=11, origin=7)
    rnd.generated.fill_(5)
    coupling.begin()
    key = torch.tensor(noise.split_seed(11))
    assert torch.equal(coupling.noise, noise.exponential(key, torch.tensor(12), k + 1, width))
    assert coupling.race(2)[0].data_ptr() == coupling.noise[2].data_ptr() and coupling.race(2)[1] is None
    assert GumbelCoupling(rnd, draft_races=False).race(0) is None
    params = WarpParams.from_spec(spec, k + 1)
    probs, q = coupling.verify((params, None, None), one_hot=False)
    _, want_probs = sampling.warp(rnd.target_logits, params)
    choice = sampling.sample_race(want_probs, coupling.noise)
    assert q is None and torch.equal(probs, want_probs) and torch.equal(coupling.choice, choice)
    assert torch.equal(rnd.out, rejection.verify_greedy(rnd.drafts, rnd.num_drafts, choice, k))
    draws = torch.Generator().manual_seed(3)
    state = draws.get_state()
    coupling.draw(draws)
    assert torch.equal(draws.get_state(), state)  # the host draws nothing
