"""Counter-based noise for Gumbel coupling: one Exp(1) draw per (seed, position, token id).

Under `sampling.coupling = "gumbel"` every token is drawn by the exponential race
x_t = argmax_v p̃_t(v) / E(seed, t, v), the same as argmax_v log p̃_t(v) + G_t(v) with Gumbel
noise G = -log E. E depends only on the seed, the token's position t in the sequence (prompt
included) and the id v, never on how rounds split the sequence, so the draft (or any proposer) can
guess with the same noise, verification accepts a guess iff it equals x_t, and every emitted token
is the one target-only decoding with that seed emits (docs/sampling.md has the derivation).

The draws come from Philox4x32-10 (Salmon et al., 2011: the generator behind curand and Triton's
tl.rand): key = the 64-bit seed, counter = (v, t mod 2**32, t >> 32, 0); the first output word w
gives u = (w >> 8 + 1) / 2**24 in (0, 1], exactly representable in float32, and E = -log u.
This module is the torch reference (any device, no Triton); gpu/kernels/noise.py computes the same
uniforms in one kernel. Both take the log with torch, so E is the same bits on either backend.
"""

from __future__ import annotations

import torch

from specgen.core.sampling.warp import MIN_EXPONENTIAL

MASK32 = 0xFFFFFFFF
# Philox4x32's multipliers and Weyl key increments (Random123).
MULTIPLIER_0, MULTIPLIER_1 = 0xD2511F53, 0xCD9E8D57
KEY_STEP_0, KEY_STEP_1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10


def split_seed(seed: int) -> tuple[int, int]:
    """A seed in [0, 2**64) as Philox's two 32-bit key words (low, high)."""
    return seed & MASK32, (seed >> 32) & MASK32


def _mulhilo(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of multiplier * x for x in [0, 2**32), in int64. The product can
    pass 2**63 and wrap; the low word is unaffected and the arithmetic shift of the wrapped value,
    masked to 32 bits, is still the true high word."""
    product = x * multiplier
    return (product >> 32) & MASK32, product & MASK32


def philox(key: tuple, counter: list) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10's four output words for int64 tensors holding 32-bit values (broadcast)."""
    k0, k1 = key
    c0, c1, c2, c3 = counter
    for i in range(ROUNDS):
        if i:
            k0 = (k0 + KEY_STEP_0) & MASK32
            k1 = (k1 + KEY_STEP_1) & MASK32
        hi0, lo0 = _mulhilo(MULTIPLIER_0, c0)
        hi1, lo1 = _mulhilo(MULTIPLIER_1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def uniform(key: torch.Tensor, first: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """u [rows, width] float32 in (0, 1] for positions first .. first + rows - 1 and ids 0 .. width - 1.
    key: int64 [2] (the seed's low and high words); first: int64 scalar tensor. Device tensors, no
    host read: a captured round computes its positions on the device."""
    device = key.device
    ids = torch.arange(width, dtype=torch.int64, device=device).unsqueeze(0)  # [1, V]
    position = first.to(torch.int64) + torch.arange(rows, dtype=torch.int64, device=device).unsqueeze(1)  # [R, 1]
    zero = torch.zeros((), dtype=torch.int64, device=device)
    word = philox((key[0], key[1]), [ids, position & MASK32, position >> 32, zero])[0]
    return ((word >> 8) + 1).to(torch.float32) * (2.0 ** -24)


def exponential_(u: torch.Tensor) -> torch.Tensor:
    """E = -log u in place, clamped so that p / E never divides by zero (u = 1 gives E = 0)."""
    return u.log_().neg_().clamp_min_(MIN_EXPONENTIAL)


def exponential(key: torch.Tensor, first: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    return exponential_(uniform(key, first, rows, width))


def uniform_rows(key: torch.Tensor, first: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """uniform for B sequences at once: u [B, rows, width], sequence b's from its key [B, 2] and
    its first position first [B]; each sequence's rows are uniform(key[b], first[b], rows, width)
    bit for bit (integer arithmetic, broadcast)."""
    device = key.device
    ids = torch.arange(width, dtype=torch.int64, device=device)[None, None]  # [1, 1, V]
    position = first.to(torch.int64)[:, None, None] + torch.arange(rows, dtype=torch.int64, device=device)[None, :, None]
    zero = torch.zeros((), dtype=torch.int64, device=device)
    words = (key[:, 0, None, None], key[:, 1, None, None])
    word = philox(words, [ids, position & MASK32, position >> 32, zero])[0]
    return ((word >> 8) + 1).to(torch.float32) * (2.0 ** -24)
