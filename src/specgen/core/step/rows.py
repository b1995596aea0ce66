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
    visible: torch.Tensor  # [B, n, S] bool: the slots (of its own sequence's cache) each row attends to

    @property
    def batch(self) -> int:
        return self.ids.shape[0]

    @property
    def count(self) -> int:
        return self.ids.shape[1]

    @property
    def span(self) -> int:
        """S: the slots a step reads (slots at or past S are neither read nor written)."""
        return self.visible.shape[-1]


def chain(ids: torch.Tensor, start: int | torch.Tensor) -> Rows:
    """ids [B, n] appended after `start` cached tokens of every sequence: row i sits at position
    and slot start + i and sees slots 0 .. start + i. `start` must be a host int here: S = start + n."""
    b, n = ids.shape
    start = int(start)
    at = torch.arange(start, start + n, device=ids.device).expand(b, n)
    slots = torch.arange(start + n, device=ids.device)
    visible = (slots[None, :] <= at[0][:, None]).expand(b, n, start + n)
    return Rows(ids, at, at, visible)


def independent(rows: list[Rows]) -> Rows:
    """Several single-sequence row sets (B = 1 each) as one step's B sequences: each keeps its own
    cache row. Their spans are padded to the longest with invisible slots."""
    span = max(r.span for r in rows)
    visible = [torch.nn.functional.pad(r.visible, (0, span - r.span)) for r in rows]
    return Rows(torch.cat([r.ids for r in rows]), torch.cat([r.positions for r in rows]),
                torch.cat([r.slots for r in rows]), torch.cat(visible))
