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
    """devices: one device for every layer, or one per layer (a model over several GPUs: each
    layer's keys and values lie with its weights, and each of those devices has its own copy of
    the slots' positions, which `place` writes where the rows it is given are)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, devices: torch.device | list[torch.device]):
        shape = (batch, kv_heads, capacity, head_dim)
        self.devices = list(devices) if isinstance(devices, (list, tuple)) else [devices] * layers
        # one allocation a device, [2, its layers, *shape]: keys then values, each layer's table a view,
        # so that a kernel reaches every layer's slots by one stride (the Triton table's compact
        # moves a tree's path in all of them in one launch)
        self.planes: dict[torch.device, torch.Tensor] = {}
        self.keys, self.values = [None] * layers, [None] * layers
        for device in dict.fromkeys(self.devices):
            mine = [layer for layer, d in enumerate(self.devices) if d == device]
            planes = self.planes[device] = torch.zeros(2, len(mine), *shape, dtype=dtype, device=device)
            for i, layer in enumerate(mine):
                self.keys[layer], self.values[layer] = planes[0, i], planes[1, i]
        # [B, capacity] on each device the layers use
        self.copies = {d: torch.zeros(batch, capacity, dtype=torch.long, device=d) for d in dict.fromkeys(self.devices)}

    def first(self, rows: int) -> "SlotCache":
        """A view of its first `rows` rows (the same memory): a step over fewer sequences than it
        holds (core/round/batch_prefill.py's groups)."""
        view = object.__new__(SlotCache)
        view.devices = self.devices
        view.planes = {d: planes[:, :, :rows] for d, planes in self.planes.items()}
        view.keys, view.values = [None] * len(self.keys), [None] * len(self.keys)
        for device, planes in view.planes.items():
            mine = [layer for layer, d in enumerate(self.devices) if d == device]
            for i, layer in enumerate(mine):
                view.keys[layer], view.values[layer] = planes[0, i], planes[1, i]
        view.copies = {d: copy[:rows] for d, copy in self.copies.items()}
        return view

    @property
    def positions(self) -> torch.Tensor:
        """[B, capacity]: the position of the key in each slot (the first layer's device's copy)."""
        return self.copies[self.devices[0]]

    def positions_on(self, device: torch.device) -> torch.Tensor:
        return self.copies[device]

    def place(self, rows) -> None:
        """Record the rows' positions at their slots (in the copy on the rows' device)."""
        seq = torch.arange(rows.batch, device=rows.ids.device)[:, None]  # [B, 1]
        self.copies[rows.ids.device][seq, rows.slots] = rows.positions

    @property
    def capacity(self) -> int:
        return self.positions.shape[1]

    def grown(self, capacity: int) -> "SlotCache":
        """A cache of `capacity` slots holding this one's (rows keep their slots)."""
        if capacity <= self.capacity:
            return self
        b, kv, old, d = self.keys[0].shape
        bigger = SlotCache(len(self.keys), b, kv, d, capacity, self.keys[0].dtype, self.devices)
        for mine, theirs in ((self.keys, bigger.keys), (self.values, bigger.values)):
            for a, b_ in zip(mine, theirs):
                b_[:, :, :old].copy_(a)
        for device, copy in self.copies.items():
            bigger.copies[device][:, :old].copy_(copy)
        return bigger
