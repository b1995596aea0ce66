"""Builders for the round's tests: a stub runner whose logits are a table, a backend whose ops
record what the warp was given, and a round's shared buffers without a model."""

from __future__ import annotations

import contextlib

import torch

from specgen.core.backend import TorchBackend
from specgen.core.round.ops import TorchRoundOps
from specgen.core.round.round import Shared


class StubRunner:
    """A Runner whose logits are a fixed random table looked up by the id fed: rounds run in
    microseconds and every buffer can be inspected."""

    def __init__(self, width: int, seed: int, favourite: int | None = None):
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.randn(width, width, generator=gen) * 3  # [V, V]
        if favourite is not None:
            self.table[:, favourite] += 20.0  # a draft that keeps proposing one id: repeats
        self.device, self.capacity, self.generation = torch.device("cpu"), 4096, 1
        self.position = torch.zeros((), dtype=torch.long)

    def reset(self) -> None:
        self.position.zero_()

    def reserve(self, positions: int) -> None:
        pass

    def step_context(self, tokens: int):
        return contextlib.nullcontext()

    def forward(self, ids, want_logits=True):
        self.position.add_(ids.shape[0])
        return self.table[ids] if want_logits else None

    def step(self, ids, logits_out):
        logits_out.copy_(self.table[ids])
        self.position.add_(ids.shape[0])
        return logits_out


class RecordingOps(TorchRoundOps):
    """The references, keeping what every warp() and warp_and_race() was given (penalty rows and
    bad masks)."""

    def __init__(self):
        self.calls: list[tuple] = []

    def _record(self, logits, penalties, bad_mask) -> None:
        copy = None if penalties is None else (penalties.counts.clone(), penalties.seen.clone())
        self.calls.append((logits.shape[0], copy, None if bad_mask is None else bad_mask.clone()))

    def warp(self, logits, params, penalties=None, bad_mask=None):
        self._record(logits, penalties, bad_mask)
        return super().warp(logits, params, penalties, bad_mask)

    def warp_and_race(self, logits, params, expo, out, penalties=None, bad_mask=None, probs_out=None):
        self._record(logits, penalties, bad_mask)
        return super().warp_and_race(logits, params, expo, out, penalties, bad_mask, probs_out)


class RecordingBackend(TorchBackend):
    """The torch backend on RecordingOps: `calls` are its ops' records."""

    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.ops = RecordingOps()

    @property
    def calls(self) -> list[tuple]:
        return self.ops.calls


def shared(k: int, width: int, seed: int = 1) -> Shared:
    """A round's shared buffers over a stub target, on the torch backend."""
    return Shared(k, width, RecordingBackend(), StubRunner(width, seed))


def head_chains_along_paths(rnd) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """A head-drafted tree round's check (core/round/head_tree.py: an EAGLE-3 head or an MTP layer),
    after a run: one more draft; the root's children must be the top-w of the head's log q after its
    extend (asserted here). Returns, for each stepped node (level, frontier index), the head
    stepped as a chain over the node's path's tokens, each on the one before's output at positions
    P, P + 1, ...: (level, f, the chain's last logits [1, V], its last hidden state [1, H]), which
    the node's own row must equal."""
    drafter, tree = rnd.drafter, rnd.tree
    k, w = rnd.k, tree.w
    with torch.inference_mode():  # as the round's programs run it
        drafter.draft()
        logits, root = drafter.chain.extend_over(drafter.out, drafter.features)  # rewrites the same rows
    assert tree.level_ids[0, 0].tolist() == logits[0].topk(w).indices.tolist()
    head, start = drafter.head, int(rnd.target.position)
    chains = []
    for level in range(1, k):
        for f in range(w):
            hidden, chain_logits = root, None
            for j, offset in enumerate(tree.tail[level - 1, f, :level].tolist()):
                token = tree.level_ids[offset // w, 0, offset % w].view(1)
                with torch.inference_mode():
                    chain_logits, hidden = head.step(token, hidden, torch.tensor([start + j]))
            chains.append((level, f, chain_logits, hidden))
    return chains
