"""gpu/kernels/log_softmax.py against torch.log_softmax (the reference): the same values within
float32 rounding of the log-sum-exp (exp and log are not bitwise between torch, numpy and CUDA: the
kernel's docstring), -inf where the logits are, the same top-w children (core/round/tree.draw_children)
on rows without near-ties, over one chunk and many (the merge), vocabularies not a multiple of a
chunk, rows with long -inf tails and a chunk all -inf. On CPU (CI) the kernels run in the Triton
interpreter (tests/triton_cpu.py); on a GPU the compiled kernels, also dependent.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from specgen.core.round.tree import draw_children
from specgen.gpu.kernels import log_softmax as gpu_log_softmax
from specgen.gpu.workspace import Workspace

DEPENDENT = [False, True] if DEVICE.type == "cuda" else [False]


def _check(x: torch.Tensor, chunk: int | None, dependent: bool = False) -> torch.Tensor:
    got = gpu_log_softmax.log_softmax(x, Workspace(DEVICE), dependent=dependent, chunk=chunk)
    want = torch.log_softmax(x, dim=-1)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert torch.equal(torch.isinf(got), torch.isinf(want)), "the -inf ids differ"
    finite = torch.isfinite(want)
    # one rounding of the log-sum-exp (magnitude up to |x| + log V) and of the subtraction
    scale = x.abs().masked_fill(~torch.isfinite(x), 0).amax(-1, keepdim=True) + 16
    assert ((got - want).abs()[finite] <= (4 * torch.finfo(torch.float32).eps * scale.expand_as(x))[finite]).all()
    return got


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize(("vocab", "chunk"), [(7, None), (1000, None), (1000, 64), (32769, 4096), (32769, None)])
def test_log_softmax_matches_torch(vocab, chunk, dependent):
    gen = torch.Generator().manual_seed(vocab)
    x = (torch.randn(4, vocab, generator=gen) * 4).to(DEVICE)
    got = _check(x, chunk, dependent)
    for w in (1, 4):  # a greedy tree's children: the same top-w from either
        assert torch.equal(draw_children(got, None, w)[0], draw_children(torch.log_softmax(x, -1), None, w)[0])


def test_masked_ids_and_a_chunk_of_minus_inf_only():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 1000, generator=gen) * 2
    x[:, 900:] = float("-inf")  # a draft vocabulary's tail: whole chunks of -inf at chunk 64
    x[1, ::3] = float("-inf")
    _check(x.to(DEVICE), 64)
    _check(x.to(DEVICE), None)


def test_a_view_with_a_row_stride_and_a_row_all_minus_inf():
    """Rows of a wider buffer (contiguous columns, a longer row stride); a row of -inf only gives
    NaN, as torch's does."""
    gen = torch.Generator().manual_seed(4)
    wide = (torch.randn(3, 300, generator=gen) * 3).to(DEVICE)
    _check(wide[:, :257].contiguous(), 64)
    got = gpu_log_softmax.log_softmax(wide[:, :257], Workspace(DEVICE), chunk=64)
    assert torch.equal(got, gpu_log_softmax.log_softmax(wide[:, :257].contiguous(), Workspace(DEVICE), chunk=64))
    dead = torch.full((1, 100), float("-inf"), device=DEVICE)
    assert torch.isnan(gpu_log_softmax.log_softmax(dead, Workspace(DEVICE))).all()
    assert torch.isnan(torch.log_softmax(dead, -1)).all()
