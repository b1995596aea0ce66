"""gpu/kernels/compact.py against core/step/ops.py's TorchOps.compact (the reference): after the
same moves every layer's keys and values and the positions are equal (torch.equal), with src and
dst overlapping as a tree's path does, in float32 and bf16, for one sequence and several. On CPU
(CI) the kernel runs in the Triton interpreter (tests/triton_cpu.py); on a GPU, compiled.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from specgen.core.step.cache import SlotCache
from specgen.core.step.ops import TorchOps
from specgen.gpu.ops import TritonOps
from gpu_helpers import kernels


def filled(layers: int, batch: int, heads: int, dim: int, slots: int, dtype, seed: int) -> SlotCache:
    cache = SlotCache(layers, batch, heads, dim, slots, dtype, DEVICE)
    gen = torch.Generator().manual_seed(seed)
    for planes in cache.planes.values():
        planes.copy_(torch.randn(planes.shape, generator=gen).to(dtype))
    cache.positions.copy_(torch.randint(0, 1000, (batch, slots), generator=gen))
    return cache


def state(cache: SlotCache) -> list[torch.Tensor]:
    return [*cache.keys, *cache.values, cache.positions]


def test_the_cache_layers_are_views_of_one_allocation():
    cache = SlotCache(3, 2, 2, 8, 10, torch.float32, DEVICE)
    planes = cache.planes[DEVICE]
    assert planes.shape == (2, 3, 2, 2, 10, 8)
    cache.keys[1][1, 0, 4].fill_(5.0)
    cache.values[2][0, 1, 9].fill_(7.0)
    assert planes[0, 1, 1, 0, 4].eq(5.0).all() and planes[1, 2, 0, 1, 9].eq(7.0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("src", "dst"), [
    ([[6, 7, 4]], [[5, 6, 7]]),  # sources overwritten by earlier rows' moves
    ([[9, 11, 12, 14]], [[8, 9, 10, 11]]),  # a path of four down onto itself
    ([[3, 3]], [[3, 4]]),  # a rejected node stays (src == dst)
    ([[10, 13], [7, 8]], [[8, 9], [8, 9]]),  # two sequences, each its own moves
])
def test_compact_kernel_equals_the_reference(dtype, src, dst):
    batch = max(2, len(src))
    want, got = (filled(3, batch, 2, 24, 16, dtype, seed=len(src[0])) for _ in range(2))
    src, dst = (torch.tensor(t, device=DEVICE) for t in (src, dst))
    TorchOps().compact(want, src, dst)
    TritonOps(kernels()).compact(got, src, dst)
    for a, b in zip(state(want), state(got)):
        assert torch.equal(a, b)
    assert not torch.equal(state(got)[0], state(filled(3, batch, 2, 24, 16, dtype, seed=len(src[0])))[0])
