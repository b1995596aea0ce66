"""A batch row's start values in one record: what a refill writes on the device besides its caches.

When a row of a BatchRound takes a prompt (or stops), a dozen of its per-row buffers take new
values: its last id, budget, limit, positions, seed key, warp parameters, a drafter's pending ids.
Written one by one, each is a launch of its own, queued between rounds while every row waits: on
an H200 a refill cost about 1.3 ms of host time, of which the warp parameters took 0.19 ms per
row and a dozen fills most of the rest (docs/benchmarks.md, "Batches (H200)").

Here each part registers its buffers once (`field`: a name, the device view [B, width, ...] its
values go to), and a start or stop only records the values on the host (`set`). Before the next
round, `flush` writes every recorded value at once: one record for all B rows ([B, width] per
dtype, and a mask [B, fields] of which row set which field), staged in one copy, then one
`torch.where` per field over every row, so the ops a flush queues do not grow with the rows that
started. The apply reads nothing from the host and its shapes never change, so a backend may
capture it (gpu/backend.py: one CUDA graph per round, replayed; the torch backend runs it as it
is). A field a row did not set keeps its value: the where takes the buffer's own.

Floats travel as float32: a value that is an int32's bits (top-k inside a warp's packed row) is
recorded as the float with those bits, which float32 carries unchanged (`int_bits`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from specgen.core.round.staging import host_tensor

# sections of the record, widest first: every section starts aligned for its dtype
DTYPES = (torch.int64, torch.float32, torch.int32, torch.bool)


def int_bits(value: int) -> float:
    """The float32 whose bits are the int32 `value` (as a Python float: exact, denormals included)."""
    return struct.unpack("<f", struct.pack("<i", value))[0]


@dataclass
class _Field:
    index: int  # its column of the mask
    dest: torch.Tensor  # [B, width, ...]
    dtype: torch.dtype  # its section's
    width: int
    column: int = 0  # its first column in its section


class RowStarts:
    """The start values of a batch's rows, recorded on the host and written by `flush` (see the
    module's docstring). after: functions run after the fields' writes, by name (a value derived
    from written ones on the device, such as log(min-p)); backend: captures the apply."""

    def __init__(self, batch: int, device: torch.device, staging, backend=None):
        self.batch, self.device, self.staging, self.backend = batch, torch.device(device), staging, backend
        self.fields: dict[str, _Field] = {}
        self.after: dict[str, object] = {}  # name -> fn
        self.pending: dict[int, dict[str, tuple]] = {}
        self._apply = None  # built at the first flush: every field is registered by then
        self.record: torch.Tensor | None = None

    def field(self, name: str, dest: torch.Tensor, width: int = 1) -> None:
        """Register dest ([B] or [B, width, ...]: trailing dims past the width take each value
        broadcast) under name; a name registered again (a subclass's own buffer) takes the new dest."""
        if self._apply is not None:
            raise RuntimeError(f"field {name!r} registered after the first flush")
        dtype = dest.dtype if dest.dtype in DTYPES else None
        if dtype is None:
            raise TypeError(f"a start field of {dest.dtype} (not one of {DTYPES})")
        view = dest if dest.dim() > 1 else dest[:, None]
        if view.shape[0] != self.batch or view.shape[1] != width:
            raise ValueError(f"field {name!r}: {tuple(dest.shape)} is not [{self.batch}, {width}, ...]")
        index = self.fields[name].index if name in self.fields else len(self.fields)
        self.fields[name] = _Field(index, view, dtype, width)

    def set(self, b: int, name: str, *values) -> None:
        """Row b's values of field name, written at the next flush (a later set of the same row and
        field replaces them)."""
        field = self.fields[name]
        if len(values) != field.width:
            raise ValueError(f"field {name!r} takes {field.width} values, not {len(values)}")
        self.pending.setdefault(b, {})[name] = values

    def flush(self) -> None:
        """Every recorded value onto the device: one staged copy and the apply (no sync)."""
        if not self.pending:
            return
        if self._apply is None:
            self._build()
        widths = self.widths
        sections = {dtype: [0] * (self.batch * width) for dtype, width in widths.items()}
        mask = [False] * (self.batch * len(self.fields))
        for b, values in self.pending.items():
            for name, row in values.items():
                field = self.fields[name]
                at = b * widths[field.dtype] + field.column
                sections[field.dtype][at: at + field.width] = row
                mask[b * len(self.fields) + field.index] = True
        self.pending.clear()
        parts = [host_tensor(sections[dtype], dtype).view(torch.uint8) for dtype in widths]
        parts.append(host_tensor(mask, torch.bool).view(torch.uint8))
        with torch.inference_mode(False):
            self.record.copy_(self.staging.put(torch.cat(parts)))
        self._apply()

    def _build(self) -> None:
        """The record's layout and its views, then the apply (captured where the backend can)."""
        widths: dict[torch.dtype, int] = {}
        for dtype in DTYPES:
            for field in self.fields.values():
                if field.dtype == dtype:
                    field.column = widths.get(dtype, 0)
                    widths[dtype] = field.column + field.width
        self.widths = widths
        sizes = [self.batch * width * torch.empty((), dtype=dtype).element_size() for dtype, width in widths.items()]
        total = sum(sizes) + self.batch * len(self.fields)
        with torch.inference_mode(False):
            self.record = torch.zeros(total, dtype=torch.uint8, device=self.device)
        views, at = {}, 0
        for (dtype, width), size in zip(widths.items(), sizes):
            views[dtype] = self.record[at: at + size].view(dtype).view(self.batch, width)
            at += size
        self.mask = self.record[at:].view(torch.bool).view(self.batch, len(self.fields))
        # each field's values and mask column, shaped as its buffer (trailing dims broadcast)
        self.writes = []
        for field in self.fields.values():
            trailing = (1,) * (field.dest.dim() - 2)
            values = views[field.dtype][:, field.column: field.column + field.width].view(
                self.batch, field.width, *trailing)
            chosen = self.mask[:, field.index].view(self.batch, 1, *trailing)
            self.writes.append((chosen, values, field.dest))
        # the mask is all False now: a capture's warm-ups leave every buffer as it is
        self._apply = self.backend.graph(self.apply, "a batch row's start") if self.backend is not None \
            else self.apply

    def apply(self) -> None:
        """The recorded values into their buffers, row by row where the mask says so."""
        for chosen, values, dest in self.writes:
            torch.where(chosen, values, dest, out=dest)
        for fn in self.after.values():
            fn()
