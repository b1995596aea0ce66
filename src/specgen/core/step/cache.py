"""The key/value cache an owned model step reads and writes: slots, not a growing list.

Every layer keeps [B, kv heads, capacity, head dim] keys and values; a step writes each row's key
and value at its slot (core/step/rows.py) and attends over the slots its row may see. `positions`
holds the rotary position of the key in each slot, so that a sliding window compares positions,
not slots: a tree's nodes sit in slots past the committed ones at positions given by their depth.
Rolling back is forgetting slots (a row simply no longer sees them), never moving memory.
"""

from __future__ import annotations

import torch


class SlotCache:
    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.positions = torch.zeros(batch, capacity, dtype=torch.long, device=device)  # [B, capacity]

    def place(self, rows) -> None:
        """Record the rows' positions at their slots."""
        seq = torch.arange(rows.batch, device=rows.ids.device)[:, None]  # [B, 1]
        self.positions[seq, rows.slots] = rows.positions

    @property
    def capacity(self) -> int:
        return self.positions.shape[1]

    def grown(self, capacity: int) -> "SlotCache":
        """A cache of `capacity` slots holding this one's (rows keep their slots)."""
        if capacity <= self.capacity:
            return self
        b, kv, old, d = self.keys[0].shape
        bigger = SlotCache(len(self.keys), b, kv, d, capacity, self.keys[0].dtype, self.keys[0].device)
        for mine, theirs in ((self.keys, bigger.keys), (self.values, bigger.values)):
            for a, b_ in zip(mine, theirs):
                b_[:, :, :old].copy_(a)
        bigger.positions[:, :old].copy_(self.positions)
        return bigger
