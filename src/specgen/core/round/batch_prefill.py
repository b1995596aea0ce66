"""The prompts of a batch's rows prefilled together: every row that took a prompt since the last round.

Alone, a runner prefills a prompt chunk by chunk (core/runner.py's PREFILL_CHUNK tokens a step; on
CUDA its captured largest step, replayed), one full model step per chunk and prompt. A batch that
did the same per row paid B x chunks model steps at its first fill, one after another (~40% of the
device time of a B = 32 run of the bench pair, k = 2), and a refill's steps each held every row.

Here a row's start only records its ids (`add`), and the round's flush (`run`, before any round
reads the row: core/round/batch_round.py's flush) steps each model's pending prompts in groups of
at most GROUP rows: chunk c of every prompt of the group in one step over [G, CHUNK] rows, each row
at positions c x CHUNK .. of its own row of a scratch cache of G rows (ids past a prompt's end are
padding: they sit after its real ones, so no real row sees them, and their keys lie past what is
copied), then each row's first n slots copied into its row of the round's cache (the round's
`adopt`, one copy a device). Where the backend captures (`Backend.captures`: CUDA), a
group of P prompts steps a power of two G >= P rows of CHUNK ids (the rows past P step padding
into scratch rows nobody copies), so a model has at most log2(GROUP) + 1 step shapes, all captured
at the caches' first prefill (`Backend.graph`); elsewhere (the torch backend, which runs a step
as it is) a group steps its P rows, as wide as its longest prefix up to CHUNK. Steps are made
anew when the round's caches are (their generation: the round's batch kernel tables, which the
steps use, are replaced with them). The step runs with keep = 1:
no lm head over every row (an 8B's over 512 rows would cost ~0.7 ms).

A row's bits are its alone prefill's: the same chunks at the same positions, through the round's
batch kernel table (Runner.batch_ops), whose calls give each row the bits of the runner's own
steps whatever the row count (row-invariant linears, attention walking each row's keys in logical
order); a row reads only its own scratch row. A GROUP x CHUNK step is one call's most rows
(BATCH_ROWS): more would take the reference.

Prompts longer than LONGEST (MAX_CHUNKS chunks, 512 tokens) keep the runner's alone prefill: its
forward steps them eagerly in one step (gpu/runner.py), whose bits a chunked group would not
reproduce; they are compute-bound already, so a group gains little; and the scratch stays bounded
(GROUP x LONGEST slots a model, an 8B's 512 MiB: inside the share of free memory batch_cost leaves).

An EAGLE-3 head's rows (core/round/batch_head.py) keep their own prefill: the head reads the
target's tapped hidden states chunk by chunk as the chain round feeds them.
"""

from __future__ import annotations

from typing import Callable

import torch

from specgen.core.runner import MAX_CHUNKS, PREFILL_CHUNK as CHUNK
from specgen.core.step import rows as rowsets
from specgen.core.step.ops import BATCH_ROWS

GROUP = BATCH_ROWS // CHUNK  # rows of one group step: GROUP x CHUNK rows, one linear call's most
LONGEST = MAX_CHUNKS * CHUNK  # longer prompts keep the runner's alone prefill (the module's docstring)


class BatchPrefill:
    """The pending prompts of a BatchRound's rows (model `which`, row b: ids), and the buffers that
    step them: a chunk's ids [rows, width] and their starts [rows] in one device buffer (one staged
    copy a chunk), the rows' positions (the step's inputs op writes them), a scratch cache of GROUP
    rows per model. `steps`: group chunk steps run (what tests count)."""

    def __init__(self, rnd):
        self.rnd = rnd
        self.pending: dict[tuple[int, int], list[int]] = {}
        # shapes fixed where the backend captures the steps (a graph per shape); elsewhere a group
        # steps its own rows and no wider than its longest prefix (a reference step over 64-token
        # chunks of 8 rows for 10-token prompts did some 25 x the work, which a CPU pays)
        self.fixed = rnd.backend.captures
        with torch.inference_mode(False):  # written inside and outside inference mode
            self.packed = torch.zeros(GROUP * (CHUNK + 1), dtype=torch.long, device=rnd.device)
            self.positions = torch.zeros(GROUP * CHUNK, dtype=torch.long, device=rnd.device)
        self.scratch: list = []  # per model: a cache of GROUP rows
        # (model, rows, width) -> its chunk step: ids [rows, width] and starts [rows], packed
        self.programs: dict[tuple[int, int, int], Callable[[], None]] = {}
        self.generation = None  # the round's caches' the scratch and programs were made for
        self.steps = 0

    def add(self, which: int, b: int, ids: list[int]) -> None:
        """Row b's prefix for model `which`, prefilled at the next run (a later add of the same row
        and model replaces it, as a start record's set does; an empty one prefills nothing)."""
        self.pending[(which, b)] = list(ids)

    def run(self) -> None:
        """Every pending prefix into its row of the round's current caches (grown since the add
        or not), with the current batch kernel tables; nothing when none is pending."""
        if not self.pending:
            return
        if self.generation != self.rnd.generation:
            self._renew()
        pending, self.pending = self.pending, {}
        with torch.inference_mode():
            for which in range(len(self.rnd.runners)):
                rows = [(b, ids) for (model, b), ids in pending.items() if model == which and ids]
                grouped = [(b, ids) for b, ids in rows if self._fits(len(ids))]
                for b, ids in rows:
                    if not self._fits(len(ids)):
                        self._alone(which, b, ids)
                for at in range(0, len(grouped), GROUP):
                    self._group(which, grouped[at: at + GROUP])

    def _fits(self, n: int) -> bool:
        """Whether an n-token prefix takes a group: at most LONGEST tokens, its chunks in the
        scratch (which the round's capacity, past every prompt with SLACK, bounds too)."""
        return n <= LONGEST and -(-n // CHUNK) * CHUNK <= self.scratch[0].capacity

    def _renew(self) -> None:
        """Scratch caches of GROUP rows and min(LONGEST, the round's capacity) slots, and no
        program yet: the round's caches and kernel tables are new."""
        rnd = self.rnd
        self.programs.clear()  # their steps hold the old scratch: its memory back before the new takes its own
        self.scratch = []
        with torch.inference_mode(False):
            self.scratch = [model.new_cache(GROUP, min(LONGEST, rnd.capacity)) for model in rnd.models]
        self.generation = rnd.generation
        # every shape's program at once, at the first prefill of these caches: made at a group's
        # first need, a capture (some 10 ms on CUDA) landed inside the run that first drew that group
        # size, once per model and size (H200, bench pair: 1.3 ms a prompt over 64 prompts at k = 4)
        if self.fixed:
            with torch.inference_mode():
                for which in range(len(rnd.models)):
                    size = 1
                    while size <= GROUP:
                        self._program(which, size, CHUNK)
                        size *= 2

    def _group(self, which: int, rows: list[tuple[int, list[int]]]) -> None:
        """Up to GROUP prefixes of model `which`: their chunks staged in one copy, a step per chunk,
        then each row's slots into the round's cache."""
        longest = max(len(ids) for _, ids in rows)
        if self.fixed:  # padded up to a power of two and whole chunks: few shapes
            size, width = 1 << (len(rows) - 1).bit_length(), CHUNK
        else:
            size, width = len(rows), min(CHUNK, longest)
        chunks = -(-longest // width)
        flat = torch.zeros(size, chunks * width, dtype=torch.long)  # each row's prefix, then padding
        for r, (_, prefix) in enumerate(rows):
            flat[r, :len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        cells = size * (width + 1)
        host = torch.empty(chunks, cells, dtype=torch.long)  # per chunk: ids [size, width], starts [size]
        host[:, :size * width].view(chunks, size, width).copy_(flat.view(size, chunks, width).transpose(0, 1))
        host[:, size * width:] = torch.arange(chunks)[:, None] * width  # every row's chunk c starts at c x width
        staged = self.rnd.staging.put(host)  # pinned: queued behind the round in flight, not waiting for it
        for c in range(chunks):
            self.packed[:cells].copy_(staged[c])
            self._program(which, size, width)()  # made at its first chunk: a capture's warm-ups step that chunk
            self.steps += 1
        for r, (b, prefix) in enumerate(rows):
            self.rnd.adopt(which, b, len(prefix), self.scratch[which], r)

    def _program(self, which: int, size: int, width: int) -> Callable[[], None]:
        """Model `which`'s chunk step over `size` rows of `width` ids (the packed buffer's first
        size x width cells, then their starts) and the first `size` rows of its scratch."""
        key = (which, size, width)
        if key not in self.programs:
            rnd = self.rnd
            model, cache, ops = rnd.models[which], self.scratch[which].first(size), rnd.step_ops[which]
            ids = self.packed[:size * width].view(size, width)
            rows = rowsets.batch(ids, self.packed[size * width: size * (width + 1)], self.positions)

            def step() -> None:
                model.step(rows, cache, ops, keep=1)  # its logits: nobody's

            # a capture's warm-ups step the buffers' chunk for real, into the scratch: what the replay
            # writes there again
            what = f"a {size}-row prefill of the {('target', 'draft model')[which]}"
            self.programs[key] = rnd.backend.graph(step, what)
        return self.programs[key]

    def _alone(self, which: int, b: int, ids: list[int]) -> None:
        """A long prefix through its model's runner as alone (the same steps, the same bits), then
        copied into row b."""
        rnd = self.rnd
        runner = rnd.runners[which]
        runner.reset()
        # the ids from pinned staging, the copy queued: a pageable copy would wait for the round in
        # flight (and the runner's own copy of them would be another)
        runner.forward(rnd.staging.put(torch.tensor(ids, dtype=torch.long)), want_logits=False)
        rnd.adopt(which, b, len(ids))
