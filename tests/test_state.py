"""SamplingState.last_row (one draft step) must equal row n of rows() (the whole round)."""

from __future__ import annotations

import torch

from specgen.core.settings import SamplingSpec
from specgen.core.state import SamplingState


def test_last_row_equals_row_n_of_the_round():
    spec = SamplingSpec(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.5,
                        frequency_penalty=0.2, min_tokens=6, max_tokens=40)
    state = SamplingState(spec, width=60, vocab_size=50, stop_ids={3, 7}, max_rows=9, device=torch.device("cpu"))
    state.start([1, 2, 9, 9])
    state.commit([4, 4, 11])  # generated = 3: positions 0..2 of the round are below min_tokens
    gen = torch.Generator().manual_seed(0)
    for n in range(9):
        drafted = torch.randint(0, 50, (n,), generator=gen)
        drafted[: n // 2] = 4  # repeats, so counts above 1 are exercised
        full, one = state.rows(drafted), state.last_row(drafted)
        assert torch.equal(one.penalties.counts[0], full.penalties.counts[n])
        assert torch.equal(one.penalties.seen[0], full.penalties.seen[n])
        full_bad = full.bad_mask[n] if full.bad_mask.ndim == 2 else full.bad_mask
        one_bad = one.bad_mask[0] if one.bad_mask.ndim == 2 else one.bad_mask
        assert torch.equal(one_bad, full_bad)
        assert bool(one_bad[3]) == (n < 3) and bool(one_bad[55])  # min_tokens stop mask, padding
        assert torch.equal(one.params.temperature, full.params.temperature[n:n + 1])


def test_in_place_draws_equal_the_allocating_ones():
    """The fused round draws into static buffers; a seed must give the core loop's numbers."""
    from specgen.core import sampling

    a, b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    expected_u = 1.0 - torch.rand((5,), generator=a)  # the definition: 1 - U[0, 1)
    expected_e = sampling.exponentials((2, 33), a, "cpu")
    buffer = torch.full((4, 33), -1.0)
    assert torch.equal(sampling.uniforms_(torch.empty(5), b), expected_u)
    sampling.exponentials_(buffer[1:3], b)
    assert torch.equal(buffer[1:3], expected_e) and bool((buffer[1:3] > 0).all())
    assert bool((buffer[0] == -1).all()) and bool((buffer[3] == -1).all())
