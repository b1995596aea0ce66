"""core/sampling/noise.py and gpu/kernels/noise.py: Gumbel coupling's counter-based noise.

Philox4x32-10 is checked against the known-answer vectors of its authors' Random123 library, the
Triton kernel against the torch reference bit for bit (in the interpreter on CPU), and the noise
for being a function of (seed, position, token id) alone and Exp(1)-distributed.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch
from scipy import stats

from specgen.core.sampling import noise
from specgen.core.sampling.warp import MIN_EXPONENTIAL
from specgen.gpu.kernels import noise as gpu_noise

# (counter, key, output) from Random123's kat_vectors for philox4x32_10.
KNOWN_ANSWERS = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


def key_of(seed: int) -> torch.Tensor:
    return torch.tensor(noise.split_seed(seed), dtype=torch.int64, device=DEVICE)


def position(value: int) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int64, device=DEVICE)


@pytest.mark.parametrize(("counter", "key", "want"), KNOWN_ANSWERS)
def test_philox_matches_the_known_answers(counter, key, want):
    words = noise.philox(tuple(torch.tensor(k) for k in key), [torch.tensor(c) for c in counter])
    assert [int(w) for w in words] == want


@pytest.mark.parametrize("seed", [0, 7, 2**32 + 3, 2**64 - 1])
@pytest.mark.parametrize(("first", "rows", "width"), [(0, 5, 50), (123, 3, 1500), (2**32 - 2, 4, 2049)])
def test_kernel_equals_the_reference(seed, first, rows, width):
    want = noise.uniform(key_of(seed), position(first), rows, width)
    got = gpu_noise.uniform_(torch.empty(rows, width, device=DEVICE), key_of(seed), position(first))
    assert torch.equal(got, want)


def test_rows_kernel_equals_each_sequence_alone():
    """A batch's noise (core/round/batch_round.py): sequence b's rows are uniform(key b, first b)."""
    seeds, firsts = [3, 2**40 + 5, 0], [0, 17, 2**32 - 2]
    key = torch.stack([key_of(s) for s in seeds])
    first = torch.tensor(firsts, dtype=torch.int64, device=DEVICE)
    want = torch.stack([noise.uniform(key_of(s), position(f), 4, 300) for s, f in zip(seeds, firsts)])
    assert torch.equal(noise.uniform_rows(key, first, 4, 300), want)
    assert torch.equal(gpu_noise.uniform_rows_(torch.empty(3, 4, 300, device=DEVICE), key, first), want)


def test_uniforms_are_multiples_of_2_to_the_minus_24_in_the_half_open_unit_interval():
    u = noise.uniform(key_of(1), position(0), 8, 4096).double()
    assert float(u.min()) > 0 and float(u.max()) <= 1
    scaled = u * 2**24
    assert torch.equal(scaled, scaled.round())


def test_noise_is_a_function_of_seed_position_and_token_alone():
    """Rows are positions: the same position gives the same row whatever row it is in (a round
    boundary moved); a narrower vocabulary is a prefix; another seed or position differs."""
    key = key_of(11)
    wide = noise.uniform(key, position(40), 6, 300)
    assert torch.equal(noise.uniform(key, position(43), 3, 300), wide[3:])
    assert torch.equal(noise.uniform(key, position(40), 6, 120), wide[:, :120])
    assert not torch.equal(noise.uniform(key_of(12), position(40), 6, 300), wide)
    assert (noise.uniform(key, position(41), 1, 300)[0] != wide[0]).float().mean() > 0.99
    # the high position word counts: positions 2**32 apart are different rows
    assert not torch.equal(noise.uniform(key, position(40 + 2**32), 1, 300), wide[:1])


def test_exponentials_are_exp1():
    """Kolmogorov-Smirnov against Exp(1) over 200k draws, and no correlation between neighbours in
    the id or the position direction (alpha 1e-6 each)."""
    e = noise.exponential(key_of(5), position(1000), 40, 5000).double().cpu()
    assert stats.kstest(e.flatten().numpy(), "expon").pvalue > 1e-6
    for a, b in ((e[:, 1:], e[:, :-1]), (e[1:], e[:-1])):
        r = stats.pearsonr(a.flatten().numpy(), b.flatten().numpy())
        assert r.pvalue > 1e-6, r


def test_u_equal_to_one_gives_a_positive_exponential():
    """u = 1 gives -log u = 0; p / 0 would be inf (or NaN where p = 0): clamped to the smallest normal."""
    e = noise.exponential_(torch.tensor([1.0, 0.5]))
    assert float(e[0]) == MIN_EXPONENTIAL and float(e[1]) == pytest.approx(0.6931472)
