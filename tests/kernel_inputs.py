"""Inputs and equality checks shared by tests/gpu/kernels/test_warp_kernel.py and tests/gpu/kernels/test_verify_kernel.py:
random logits, per-row warp options, penalties, and one round's verifier inputs (and the token
trees' draft log q: test_tree_build_kernel.py, test_tree_merge_kernel.py), built on CPU
generators and moved to DEVICE, so the kernel and the torch reference see the same values.

Import tests/triton_cpu.py first (it sets TRITON_INTERPRET before Triton is imported).
"""

from __future__ import annotations

import torch
from triton_cpu import DEVICE

from specgen.core.sampling import rejection

from specgen.core.sampling import warp as sampling
from specgen.gpu.kernels import verify as gpu_verify
from specgen.gpu.kernels import warp as gpu_warp
from specgen.gpu.workspace import Workspace

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


def assert_warp_equal(logits, params, penalties, bad_mask, gen, workspace: Workspace | None = None):
    """Kernel == reference: argmax, kept set, probabilities to rounding, and sampled ids exactly."""
    ref_argmax, ref_probs = sampling.warp(logits, params, penalties, bad_mask)
    workspace = workspace or Workspace(DEVICE)
    argmax, probs = gpu_warp.warp(logits, params, penalties, bad_mask, workspace)
    assert int(workspace.error) == 0
    assert torch.equal(argmax, ref_argmax)
    if ref_probs is None:
        assert probs is None
        return
    assert torch.equal(probs > 0, ref_probs > 0), "kept sets differ"
    torch.testing.assert_close(probs, ref_probs, rtol=2e-5, atol=1e-8)
    expo = sampling.exponentials(probs.shape, gen, "cpu").to(DEVICE)
    assert torch.equal(sampling.sample_race(probs, expo), sampling.sample_race(ref_probs, expo))


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
    workspace = Workspace(DEVICE)
    for q in (draft, None):  # probabilistic drafting, then one-hot q (n-gram / argmax drafting)
        ref = rejection.verify_random(drafted, cu, q, target, uniform, expo, k)
        out = gpu_verify.verify_random(drafted, cu, q, target, uniform, expo, k, workspace)
        assert torch.equal(out, ref), (out, ref)
    argmax = target.argmax(dim=-1)
    ref = rejection.verify_greedy(drafted, cu, argmax, k)
    assert torch.equal(gpu_verify.verify_greedy(drafted, cu, argmax, k, workspace), ref)
    assert int(workspace.error) == 0
    return ref


def both_random(drafted, cu, q, p, uniform, expo, k):
    workspace = Workspace(DEVICE)
    ref = rejection.verify_random(drafted, cu, q, p, uniform, expo, k)
    out = gpu_verify.verify_random(drafted, cu, q, p, uniform, expo, k, workspace)
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


def tree_logq(rows: int, vocab: int, gen: torch.Generator, tied: bool) -> torch.Tensor:
    """A draft's log q rows for tree builds (CPU): random, or on a grid of halves (cumulative
    scores tie exactly) with a few finite entries per row only (top-w then takes -inf scores,
    which tie too)."""
    if not tied:
        return torch.log_softmax(torch.randn(rows, vocab, generator=gen) * 2, -1)
    logq = -0.5 * torch.randint(0, 3, (rows, vocab), generator=gen).float()
    finite = torch.rand(rows, vocab, generator=gen) < 0.25
    finite[:, 0] = True
    return torch.where(finite, logq, float("-inf"))
