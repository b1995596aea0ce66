"""gpu/kernels/topw.py against core/round/tree.draw_children (the reference): the same tokens and
the same log q values (torch.equal) for w = 1 .. 8 over vocabularies of 7, 1000 and 32769 ids (not
a multiple of any chunk), with rows that tie (log q on a coarse grid, long -inf tails, rows with
fewer than w finite ids, a row all -inf), with and without Exp(1) noise ([R, V] or one shared
[1, V] row), over one chunk and over many (the merge). On CPU (CI) the kernels run in the Triton
interpreter (tests/triton_cpu.py); on a GPU the compiled kernels, also dependent and captured.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from specgen.core.round.tree import draw_children
from specgen.core.sampling.warp import exponentials
from specgen.gpu.kernels import topw as gpu_topw
from specgen.gpu.workspace import Workspace

DEPENDENT = [False, True] if DEVICE.type == "cuda" else [False]


def _logq(rows: int, vocab: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """random: distinct log q; tied: a grid of three values on a few ids, -inf on the rest, with a
    row of fewer finite ids than any w (one), and a row all -inf."""
    if kind == "random":
        return torch.log_softmax(torch.randn(rows, vocab, generator=gen) * 3, -1).to(DEVICE)
    logq = -0.5 * torch.randint(0, 3, (rows, vocab), generator=gen).float()
    finite = torch.rand(rows, vocab, generator=gen) < 0.3
    finite[0] = False
    finite[0, vocab // 2] = True  # one finite id, late in the row
    finite[-1] = False  # all -inf: ties to ids 0 .. w - 1
    return torch.where(finite, logq, float("-inf")).to(DEVICE)


def _noise(rows: int, vocab: int, shape: str, gen: torch.Generator) -> torch.Tensor | None:
    if shape == "none":
        return None
    return exponentials((rows if shape == "rows" else 1, vocab), gen, "cpu").to(DEVICE)


def _check(logq, noise, w, chunk=None, dependent=False):
    want = draw_children(logq, noise, w)
    got = gpu_topw.top_w(logq, noise, w, Workspace(DEVICE), dependent=dependent, chunk=chunk)
    for name, a, b in zip(("tokens", "log q"), got, want):
        assert torch.equal(a, b), f"{name}: kernel {a.tolist()} reference {b.tolist()}"
    return want


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("noise", ["none", "rows", "shared"])
@pytest.mark.parametrize("kind", ["random", "tied"])
@pytest.mark.parametrize("w", range(1, 9))
def test_top_w_matches_reference_small_vocabularies(w, kind, noise, dependent):
    gen = torch.Generator().manual_seed(100 * w + len(kind) + len(noise))
    for vocab, chunk in ((7, None), (7, 4), (1000, None), (1000, 256)):  # (7, 4): a chunk short of w ids
        if w > vocab:
            continue
        rows = 4
        logq = _logq(rows, vocab, kind, gen)
        tokens, values = _check(logq, _noise(rows, vocab, noise, gen), w, chunk, dependent)
        if kind == "tied":
            assert tokens[-1].tolist() == list(range(w))  # a row all -inf: the lowest ids
            assert values[0, 0] > float("-inf") and (values[0, 1:] == float("-inf")).all()  # the one finite first


@pytest.mark.parametrize("noise", ["none", "rows", "shared"])
@pytest.mark.parametrize("kind", ["random", "tied"])
@pytest.mark.parametrize("w", [1, 2, 5, 8])
def test_top_w_matches_reference_over_a_large_vocabulary(w, kind, noise):
    """32769 ids: one chunk (the interpreter's default), and 33 of 1024 (the last one id wide)."""
    gen = torch.Generator().manual_seed(w + len(kind) + len(noise))
    vocab, rows = 32769, 3
    logq = _logq(rows, vocab, kind, gen)
    noise_rows = _noise(rows, vocab, noise, gen)
    _check(logq, noise_rows, w)
    _check(logq, noise_rows, w, chunk=1024)


def test_ties_straddling_chunks_go_to_the_lower_ids():
    """Every id equal but a few: the w best are the larger ones, then the lowest ids, across chunks."""
    vocab, w = 1000, 8
    logq = torch.full((2, vocab), -3.0, device=DEVICE)
    logq[0, [999, 500, 70]] = -1.0
    logq[1, 300:] = float("-inf")
    tokens, _ = _check(logq, None, w, chunk=64)
    assert tokens[0].tolist() == [70, 500, 999, 0, 1, 2, 3, 4]
    assert tokens[1].tolist() == list(range(w))


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs")
def test_top_w_replays_in_a_cuda_graph():
    """Captured once (workspace buffers allocated during the warm-up), replayed over new inputs."""
    gen = torch.Generator().manual_seed(7)
    vocab, rows, w = 32000, 4, 2
    logq = _logq(rows, vocab, "random", gen)
    noise = _noise(rows, vocab, "rows", gen)
    workspace = Workspace(DEVICE)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        gpu_topw.top_w(logq, noise, w, workspace, dependent=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            tokens, values = gpu_topw.top_w(logq, noise, w, workspace, dependent=True)
    for kind in ("random", "tied"):
        logq.copy_(_logq(rows, vocab, kind, gen))
        noise.copy_(_noise(rows, vocab, "rows", gen))
        graph.replay()
        torch.cuda.synchronize()
        want = draw_children(logq, noise, w)
        assert torch.equal(tokens, want[0]) and torch.equal(values, want[1])
