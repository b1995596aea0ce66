"""gpu/rewire_head.py: an EAGLE-3 head's round calls on the step kernels (linear, norm, attention
with rotary and the cache write inside) against the same head on torch's ops.

The kernel path computes the same operations in another rounding order (the kernel rotates in
float32 with one rounding; its softmax is online), so the two agree to float32 rounding in float32
and to bfloat16 rounding in bfloat16; the cache rows they write agree likewise. On CPU the kernels
run in the Triton interpreter (tests/triton_cpu.py).
"""

from __future__ import annotations

import copy
import contextlib

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels
from tiny_models import build_head, tiny_head_config
from specgen.core.heads import AuxTap, EagleDrafter
from specgen.gpu.linear_table import packaged
from specgen.gpu.rewire_head import install_head

CAPACITY = 128  # the interpreted attention kernel runs a program per 64 cache positions
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 6e-2}


def _heads(dtype, **kernel_flags):
    """(plain head, kernel head, switch), equal weights, on DEVICE in dtype, capacity CAPACITY."""
    config = tiny_head_config(max_position_embeddings=CAPACITY)
    plain = build_head(config, seed=5).to(device=DEVICE, dtype=dtype)
    plain.reserve(CAPACITY)
    fast = copy.deepcopy(plain)
    switch = install_head(fast, kernels(**({"attention": True, "linear": True, "rope": True, "norm": True}
                                           | kernel_flags)))
    return plain, fast, switch


def _inputs(config, rows, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.target_vocab_size, (rows,), generator=gen)
    features = torch.randn(rows, 3 * config.target_hidden_size, generator=gen)
    return ids.to(DEVICE), features.to(device=DEVICE, dtype=dtype)


def _close(a, b, dtype, what):
    tol = TOLERANCE[dtype]
    error = (a.float() - b.float()).abs().max().item()
    assert error <= tol * max(1.0, b.float().abs().max().item()), f"{what}: max error {error}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("flags", [{}, {"norm": False}, {"attention": False, "rope": False}],
                         ids=["all", "torch-norm", "torch-attention"])
def test_round_calls_match_the_torch_head(dtype, flags):
    """A prompt's prefill (module forward on both), then as a round calls the head: an extend over
    5 rows at the target-derived positions, 3 one-row steps on the head's own states, then the next
    extend over rows that overwrite stale slots. Logits, hidden states and the cache agree."""
    plain, fast, switch = _heads(dtype, **flags)
    config = plain.config
    ids, features = _inputs(config, 20, 0, dtype)
    for head in (plain, fast):
        head(ids[:12], features[:12], torch.arange(12, device=DEVICE))  # prefill: not engaged
    calls = [(ids[12:17], features[12:17], 12), (ids[17:18], None, 17), (ids[18:19], None, 18),
             (ids[19:20], None, 19), (ids[14:19], features[14:19], 14)]  # the last re-extends from 14
    hidden = {}
    for i, (call_ids, call_features, at) in enumerate(calls):
        positions = torch.arange(at, at + call_ids.shape[0], device=DEVICE)
        out = {}
        for name, head in (("plain", plain), ("fast", fast)):
            with switch.engaged(False, None, norm=flags.get("norm", True)) if name == "fast" else contextlib.nullcontext():
                feats = call_features if call_features is not None else hidden[name][-1:]
                out[name] = head(call_ids, feats, positions)
        hidden = {name: out[name][1] for name in out}
        _close(out["fast"][0], out["plain"][0], dtype, f"call {i} logits")
        _close(out["fast"][1], out["plain"][1], dtype, f"call {i} hidden")
    live = calls[-1][2] + calls[-1][0].shape[0]
    _close(fast.k_cache[:, :, :live], plain.k_cache[:, :, :live], dtype, "keys")
    _close(fast.v_cache[:, :, :live], plain.v_cache[:, :, :live], dtype, "values")


def test_switch_off_is_the_module_itself():
    """Outside the engaged switch the rewired head is the plain head bit for bit (prefill, training)."""
    plain, fast, _ = _heads(torch.float32)
    ids, features = _inputs(plain.config, 9, 1, torch.float32)
    positions = torch.arange(9, device=DEVICE)
    a, b = plain(ids, features, positions), fast(ids, features, positions)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(plain.k_cache, fast.k_cache)


def test_one_row_calls_take_the_draft_picks():
    """After a round's extend a head steps one row at a time, as a draft model does: its one-row
    calls take the table's draft picks (Llama 3.1 8B's o projection: a matrix-vector one), the
    extend's k + 1 rows the configuration a target's call of that shape takes."""
    _, _, switch = _heads(torch.float32)
    package, shape = packaged(), (4096, 4096, False)
    draft = dict(package.drafts)[shape]
    assert not draft[0] and draft != package.pick(*shape, False)  # the test needs two picks that differ
    assert switch.table.pick(*shape, False, rows=1) == draft
    assert switch.table.pick(*shape, False, rows=5) == package.pick(*shape, False)


class _Backend:
    """A backend offering the kernels for the head (as gpu/backend.py's CudaBackend does); its
    `graph` runs the function as it is and counts the captures."""

    def __init__(self, offer: bool):
        self.offer, self.switch, self.captures = offer, None, 0

    def head_kernels(self, head):
        if not self.offer:
            return None
        self.switch = install_head(head, kernels(attention=True, linear=True, rope=True, norm=True))
        return lambda: self.switch.engaged(False, None, norm=True)

    def graph(self, fn, what):
        self.captures += 1
        return fn


def _drafters(config, vocab_map: bool, rows: int = 64):
    """(plain, kernel) EagleDrafters of equal heads over a tap of `rows` rows the test fills."""
    plain_head = build_head(config, seed=2).to(DEVICE)
    if not vocab_map:
        plain_head.identity_vocab()
    fast_head = copy.deepcopy(plain_head)
    tap = AuxTap.__new__(AuxTap)  # no hooks: the test writes its rows
    tap.out, tap.rows = torch.zeros(rows, 3 * config.target_hidden_size, device=DEVICE), rows
    return (EagleDrafter(plain_head, tap, config.target_vocab_size, CAPACITY),
            EagleDrafter(fast_head, tap, config.target_vocab_size, CAPACITY))


@pytest.mark.parametrize("vocab", ["whole", "reduced"])
def test_drafter_takes_the_backends_kernels(vocab):
    """EagleDrafter.accelerate: "kernels" with a backend that offers them (its calls then run
    engaged and agree with the plain drafter's), "torch" without. The whole vocabulary in the
    target's order skips the scatter into -inf columns and gives the same logits."""
    config = tiny_head_config(max_position_embeddings=CAPACITY,
                              **({"draft_vocab_size": 40} if vocab == "whole" else {}))
    plain, fast = _drafters(config, vocab == "reduced")
    assert plain.identity == (vocab == "whole")
    assert plain.accelerate(_Backend(False)) == "torch"
    backend = _Backend(True)
    assert fast.accelerate(backend) == "kernels"
    ids, features = _inputs(config, 4, 3, torch.float32)
    positions = torch.arange(4, device=DEVICE)
    (a, ha), (b, hb) = plain.extend(ids, features, positions), fast.extend(ids, features, positions)
    assert a.shape == b.shape == (4, 40) and a.dtype == torch.float32
    assert torch.equal(torch.isinf(a), torch.isinf(b)) and int(torch.isinf(a[0]).sum()) == 40 - config.draft_vocab_size
    finite = torch.isfinite(a)
    _close(b[finite], a[finite], torch.float32, "extend logits")
    (a, _), (b, _) = plain.step(ids[:1], ha[-1:], positions[-1:] + 1), fast.step(ids[:1], hb[-1:], positions[-1:] + 1)
    _close(b[torch.isfinite(a)], a[torch.isfinite(a)], torch.float32, "step logits")
    assert not backend.switch.active  # engaged only inside the calls


@pytest.mark.slow
def test_prefill_in_captured_chunks_fills_the_cache_the_plain_prefill_does():
    """With the kernels a prompt's rows go through the head in chunks of the tap's rows (the
    captured call; 16 here, 64 in a run), the last one padded: the keys and values of the prompt's
    rows equal the plain prefill's, the capture is made once (and again after the cache is
    re-allocated), and the next extend agrees."""
    config = tiny_head_config(max_position_embeddings=CAPACITY)
    plain, fast = _drafters(config, True, rows=16)
    backend = _Backend(True)
    fast.accelerate(backend)
    rows = 38  # two full chunks and a padded one
    ids, features = _inputs(config, rows + 3, 4, torch.float32)
    positions = torch.arange(rows, device=DEVICE)
    for drafter in (plain, fast):
        drafter.prefill(ids[:rows], features[:rows], positions)
    _close(fast.head.k_cache[:, :, :rows], plain.head.k_cache[:, :, :rows], torch.float32, "keys")
    _close(fast.head.v_cache[:, :, :rows], plain.head.v_cache[:, :, :rows], torch.float32, "values")
    assert backend.captures == 1
    fast.prefill(ids[:rows], features[:rows], positions)
    assert backend.captures == 1  # the same capture replays
    at = torch.arange(rows, rows + 3, device=DEVICE)
    (a, _), (b, _) = plain.extend(ids[rows:], features[rows:], at), fast.extend(ids[rows:], features[rows:], at)
    _close(b[torch.isfinite(a)], a[torch.isfinite(a)], torch.float32, "extend after prefill")
    fast.reserve(CAPACITY)  # a request that needs more room: a new cache, a new capture
    fast.prefill(ids[:3], features[:3], positions[:3])
    assert backend.captures == 2
