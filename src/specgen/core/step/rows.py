"""The query rows of one model step, as data.

A step computes B sequences' n query rows each. Every row carries its token, the rotary position
it sits at and the cache slot its key and value go to. What a row sees is one compact layout that
the reference (core/step/ops.py, through `seen`) and the attention kernel (gpu/kernels/attention.py) both
read, so the two cannot disagree:

- per sequence b, a committed prefix: `start[b]`; every row of b sees slots 0 .. start[b] - 1,
  slot j holding the key at position j (a committed cache is compacted: the accepted path only);
- per row, its tail: the slots it sees after the prefix, in path order. Entry j holds the key at
  position start[b] + j, so a row sees `depth` keys past the prefix, sits at position
  start[b] + depth - 1, and its own slot is its tail's last entry.

A chain (`tail` None) is the tail laid in place: row i's tail is slots start .. start + i. A token
tree's node at depth d (0: a child of the prefix's last token) sees the slots of its ancestors from
depth 0 down to itself. A batch is B sequences, each its own cache row and its own `start`. Because
a key's position is its index in this walk (prefix, then tail), the kernel walks every row's keys in
logical order, with a chain row's block and split boundaries; sliding windows compare positions.

Shapes use one alphabet: B sequences, n rows each, T tail entries (at most n for the builders'
trees: a tail past the step's own rows may name slots written by earlier steps), S cache slots a
step looks at (the live part of a cache of `capacity` slots).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rows:
    ids: torch.Tensor  # [B, n] int64: each row's token
    positions: torch.Tensor  # [B, n] int64: each row's rotary position (start + depth - 1)
    slots: torch.Tensor  # [B, n] int64: the slot of its sequence's cache where its key and value go
    start: torch.Tensor  # [B] int64: each sequence's committed prefix, seen by all its rows
    # [B, n, T] int64: each row's visible slots past the prefix, in path order (entries past
    # `depth` are padding, never read); None for a chain: row i's are slots start .. start + i
    tail: torch.Tensor | None = None
    depth: torch.Tensor | None = None  # [B, n] int64: tail entries each row sees (None for a chain)
    # S, the slots a reference step looks at, where known on the host; None: the whole cache
    span: int | None = None
    # chain rows whose `positions` buffer the step's inputs op fills from `start`, in the launch
    # that also gathers their embeddings (gpu/kernels/step_io.py); nothing reads it before
    pending: bool = False

    @property
    def batch(self) -> int:
        return self.ids.shape[0]

    @property
    def count(self) -> int:
        return self.ids.shape[1]

    def seen(self, capacity: int) -> torch.Tensor:
        """[B, n, S] bool: the slots each row sees, S = `span` or the cache's `capacity`."""
        return seen(self.start, self.count, self.span or capacity, self.tail, self.depth)

    def paths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(tail [B, n, T], depth [B, n]) for any layout: a chain's laid out explicitly."""
        if self.tail is not None:
            return self.tail, self.depth
        n = self.count
        steps = torch.arange(n, device=self.ids.device)
        tail = (self.start[:, None, None] + steps).expand(self.batch, n, n).contiguous()
        return tail, (steps + 1).expand(self.batch, n).contiguous()


def seen(start: torch.Tensor, count: int, span: int, tail: torch.Tensor | None = None,
         depth: torch.Tensor | None = None) -> torch.Tensor:
    """[B, n, span] bool: slots < start[b], and each row's tail (a chain's: start .. start + i)."""
    slots = torch.arange(span, device=start.device)
    if tail is None:
        last = start[:, None] + torch.arange(count, device=start.device)  # [B, n]
        return slots <= last[:, :, None]
    b, n, t = tail.shape
    wanted = torch.arange(t, device=tail.device) < depth[:, :, None]  # [B, n, T]
    marked = torch.zeros(b, n, span + 1, dtype=torch.bool, device=tail.device)
    marked.scatter_(2, torch.where(wanted, tail, span), True)  # padding lands in the spare column
    return marked[..., :span] | (slots < start[:, None, None])


def _starts(start, b: int, device) -> tuple[torch.Tensor, int | None]:
    """start as [B] int64 on the device, and its largest value when given on the host."""
    if isinstance(start, torch.Tensor):
        return start.reshape(-1).expand(b) if start.numel() == 1 else start, None
    values = [int(start)] * b if isinstance(start, int) else [int(s) for s in start]
    return torch.tensor(values, dtype=torch.long, device=device), max(values)


def chain(ids: torch.Tensor, start: int) -> Rows:
    """ids [B, n] appended after `start` cached tokens of every sequence: row i sits at position
    and slot start + i and sees slots 0 .. start + i. `start` is a host int here: S = start + n."""
    return batch(ids, [int(start)] * ids.shape[0])


def batch(ids: torch.Tensor, start, buffer: torch.Tensor | None = None) -> Rows:
    """ids [B, n]: sequence b's n rows continue its own cache row after its own start[b] tokens
    (host ints, or a [B] int64 device tensor the step reads without a sync). With `buffer` (int64,
    at least B * n long) the positions are left for the step's inputs op to write there."""
    b, n = ids.shape
    starts, top = _starts(start, b, ids.device)
    span = None if top is None else top + n
    if buffer is not None:
        at = buffer[:b * n].view(b, n)
        return Rows(ids, at, at, starts, span=span, pending=True)
    at = starts[:, None] + torch.arange(n, device=ids.device)  # [B, n]
    return Rows(ids, at, at, starts, span=span)


def chain_at(ids: torch.Tensor, position: torch.Tensor, steps: torch.Tensor,
             buffer: torch.Tensor | None = None) -> Rows:
    """ids [1, n] after the `position` ([] int64, on the device) cached tokens of one sequence, built
    on the device without reading the position (steps: arange of at least n, on the device). With
    `buffer` (int64, at least n long) the positions are left for the step's inputs op to write there."""
    n = ids.shape[1]
    start = position.view(1)  # the runner's own tensor: a captured step reads its value at replay
    if buffer is not None:
        return batch(ids, start, buffer)
    at = (position + steps[:n])[None]  # [1, n]
    return Rows(ids, at, at, start)


def tree(ids: torch.Tensor, parents: torch.Tensor, start, levels: int | None = None) -> Rows:
    """ids [B, n]: each sequence's token tree after its start[b] cached tokens (host ints or a [B]
    device tensor). parents [n] or [B, n] int64: each node's parent among the nodes, -1 for a child
    of the prefix's last token, parents before their children (parents[i] < i). Node i goes to slot
    start + i and sits at position start + its depth; it sees the prefix and its ancestors' slots
    from depth 0 down to its own. levels: the tree's depth where known (at most n; the tail has
    that many entries). Built on the device in levels - 1 gathers, without a sync."""
    b, n = ids.shape
    levels = levels or n
    starts, top = _starts(start, b, ids.device)
    parents = parents.to(ids.device).expand(b, n)
    nodes = torch.arange(n, device=ids.device).expand(b, n)
    up = [nodes]  # up[k][b, i]: node i's ancestor k levels up (-1 past the root)
    for _ in range(levels - 1):
        above = up[-1]
        up.append(torch.where(above >= 0, parents.gather(1, above.clamp(min=0)), -1))
    lineage = torch.stack(up, dim=2)  # [B, n, levels]: self, parent, grandparent, ...
    depth = (lineage >= 0).sum(2)  # [B, n]
    ahead = (depth[:, :, None] - 1 - torch.arange(levels, device=ids.device)).clamp(min=0)  # path order
    path = lineage.gather(2, ahead).clamp(min=0)
    slots = starts[:, None] + nodes
    tail = starts[:, None, None] + path  # entries past depth: padding
    return Rows(ids, starts[:, None] + depth - 1, slots, starts, tail, depth,
                span=None if top is None else top + n)


def independent(rows: list[Rows]) -> Rows:
    """Several single-sequence row sets (B = 1 each, n rows each) as one step's B sequences: each
    keeps its own cache row and its own start; tails are padded to the longest."""
    spans = [r.span for r in rows]
    span = None if None in spans else max(spans)
    parts = dict(ids=torch.cat([r.ids for r in rows]), positions=torch.cat([r.positions for r in rows]),
                 slots=torch.cat([r.slots for r in rows]), start=torch.cat([r.start for r in rows]))
    if all(r.tail is None for r in rows):
        return Rows(**parts, span=span)
    paths = [r.paths() for r in rows]
    width = max(t.shape[-1] for t, _ in paths)
    tail = torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t, _ in paths])
    return Rows(**parts, tail=tail, depth=torch.cat([d for _, d in paths]), span=span)
