"""The query rows of one model step, as data.

A step computes B sequences' n query rows each. Every row carries its token, the rotary position
it sits at, the cache slot its key and value go to, and the cache slots it may attend to. A chain
(each row sees the slots before it and itself), a token tree (each node sees its ancestors) and a
batch (each sequence its own cache row, its own length) are the same step with other tensors, so
the model code has one path for all of them.

Shapes use one alphabet: B sequences, n rows each, S cache slots a step looks at (the live part of
a cache of `capacity` slots).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rows:
    ids: torch.Tensor  # [B, n] int64: each row's token
    positions: torch.Tensor  # [B, n] int64: each row's rotary position
    slots: torch.Tensor  # [B, n] int64: the slot of its sequence's cache where its key and value go
    # [B, n, S] bool: the slots (of its own sequence's cache) each row attends to; None for a chain
    # from `start`, whose rows see every slot up to their own (over the whole cache: S = capacity)
    visible: torch.Tensor | None
    # [] int64, where the rows are one chain whose first row sits at this slot and position (what
    # gpu/attention.py's kernel reads instead of a mask); None for any other layout
    start: torch.Tensor | None = None
    # chain rows whose `positions` (= `slots`) buffer the step's inputs op fills from `start`, in the
    # launch that also gathers their embeddings (gpu/step_io.py); nothing reads it before
    pending: bool = False

    @property
    def batch(self) -> int:
        return self.ids.shape[0]

    @property
    def count(self) -> int:
        return self.ids.shape[1]

    def seen(self, capacity: int) -> torch.Tensor:
        """[B, n, S] bool: `visible`, or a chain's mask over the cache's `capacity` slots."""
        if self.visible is not None:
            return self.visible
        slots = torch.arange(capacity, device=self.slots.device)
        return slots[None, None, :] <= self.slots[:, :, None]


def chain(ids: torch.Tensor, start: int | torch.Tensor) -> Rows:
    """ids [B, n] appended after `start` cached tokens of every sequence: row i sits at position
    and slot start + i and sees slots 0 .. start + i. `start` must be a host int here: S = start + n."""
    b, n = ids.shape
    start = int(start)
    at = torch.arange(start, start + n, device=ids.device).expand(b, n)
    slots = torch.arange(start + n, device=ids.device)
    visible = (slots[None, :] <= at[0][:, None]).expand(b, n, start + n)
    return Rows(ids, at, at, visible)


def chain_at(ids: torch.Tensor, position: torch.Tensor, steps: torch.Tensor,
             buffer: torch.Tensor | None = None) -> Rows:
    """ids [1, n] after the `position` ([] int64, on the device) cached tokens of one sequence, built
    on the device without reading the position (steps: arange of at least n, on the device). With
    `buffer` (int64, at least n long) the positions are left for the step's inputs op to write there."""
    n = ids.shape[1]
    if buffer is not None:
        return Rows(ids, buffer[None, :n], buffer[None, :n], None, start=position, pending=True)
    at = (position + steps[:n])[None]  # [1, n]
    return Rows(ids, at, at, None, start=position)


def independent(rows: list[Rows]) -> Rows:
    """Several single-sequence row sets (B = 1 each) as one step's B sequences: each keeps its own
    cache row. Their masks are padded to the longest with invisible slots."""
    span = max(r.visible.shape[-1] for r in rows)
    visible = [torch.nn.functional.pad(r.visible, (0, span - r.visible.shape[-1])) for r in rows]
    return Rows(torch.cat([r.ids for r in rows]), torch.cat([r.positions for r in rows]),
                torch.cat([r.slots for r in rows]), torch.cat(visible))
