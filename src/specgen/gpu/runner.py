"""A runner over a static slot cache whose fixed-shape steps replay as CUDA graphs.

Same protocol as core/runner.py's EagerRunner: reset(), forward(ids) -> logits, truncate(n).

The model is specgen's own (core/step/): a step is `OwnedModel.step` over this runner's rows and
SlotCache, computed through gpu/ops.py's kernel table. The runner owns ONE position tensor on the
device: a step's rows sit at position + 0 .. n - 1 (written by the step's inputs op, inside the
graph), the runner advances it after the step, and a rollback is position.fill_(n): no copy, no
free, no host sync. Slots past the position are stale, and no row sees them.

Every static buffer (input ids, the rows' positions, logits out, the position) is allocated before
capture and held by the runner; each graph keeps its own raw output alive, so nothing it writes
can be freed. Logits returned by forward() are the graph's output buffer: valid until the next
forward of the same shape. Models of other architectures run on core/runner.py's EagerRunner
(gpu/backend.py chooses).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from specgen.core.runner import MAX_CHUNKS
from specgen.gpu import stages
from specgen.gpu.capture import capture
from specgen.gpu.policy import ResolvedKernels
from specgen.gpu.workspace import Workspace

WARMUP_STEPS = 3  # eager runs before capture: Triton's JIT, cuBLAS handles, lazy allocations
SLACK = 64  # positions past the longest request: where warm-ups and padded steps may write
MAX_GRAPH_TOKENS = 64  # longest captured step


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | stages.SegmentedGraph
    logits: torch.Tensor  # [n, width] float32: written by every replay
    raw: torch.Tensor  # the model's own output inside the graph's pool, kept alive with it


def _fit(logits: torch.Tensor, width: int) -> torch.Tensor:
    """[n, cols] -> [n, width] float32: cut extra (padding) columns, or pad with -inf."""
    cols = logits.shape[-1]
    if cols == width:
        return logits.float()
    if cols > width:
        return logits[:, :width].float()
    pad = logits.new_full((logits.shape[0], width - cols), float("-inf"), dtype=torch.float32)
    return torch.cat([logits.float(), pad], dim=-1)


class GraphRunner:
    """forward(ids) feeds tokens after the cached ones; graphs replay the shapes in `shapes`.

    model: an OwnedModel; capacity: positions the cache holds (grown by reserve(), which
    re-captures); kernels: the run's kernel policy (gpu/policy.py resolve), which gpu/ops.py's
    table applies; workspace: the device's kernel scratch (split-K counters); use_graphs=False runs
    every step eagerly over the same cache (the fallback when capture fails); progress(done, total,
    what): start-up callback.
    """

    def __init__(self, model, width: int, capacity: int, *, kernels: ResolvedKernels, workspace: Workspace,
                 shapes=(), use_graphs: bool = True, progress=None, name: str = "model", tap=None):
        self.model = model
        self.tap = tap  # core/drafters/heads.py's AuxTap: armed in every forward and capture of this runner
        self.width = width  # logits columns handed out, as in EagerRunner
        # home: where its inputs, logits and position live (the round's device); the weights may
        # lie on other GPUs too (gpu/stages.py carries each step there and back)
        self.device = workspace.device
        self.stages = None
        if self.device.type == "cuda" and stages.spread(model, self.device):
            self.stages = stages.Stages(model, self.device)
        self.kernels = kernels
        self.workspace = workspace
        self.name = name
        self.progress = progress
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.shapes = sorted(set(shapes))
        self.graphs: dict[int, _Graph] = {}
        self.ops = self._ops(kernels, workspace)
        with torch.inference_mode():
            self.positions = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.long, device=self.device)  # a step's rows
        self.length = 0
        self.capacity = 0
        self.generation = 0
        self.setup_seconds = 0.0
        self._allocate(capacity)

    # -- protocol -------------------------------------------------------------------------------

    def reset(self) -> None:
        self.position.fill_(0)
        self.length = 0

    def truncate(self, length: int) -> None:
        if length < self.length:
            self.position.fill_(length)
            self.length = length

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, want_logits: bool = True) -> torch.Tensor | None:
        """ids: [n] int64 -> logits [n, width] float32 (None when want_logits is False).

        A step replays the smallest captured shape that holds it, padded: the padding tokens sit
        after the real ones, so no real row sees them, and the position is set back to the real
        length, so their K/V lies beyond it like a rejected draft's. Longer feeds (prefill) of up
        to MAX_CHUNKS chunks replay the largest shape chunk by chunk; longer ones run eagerly.
        """
        n = ids.shape[0]
        if n == 0:
            return None
        shape = self._shape_for(n)
        if shape is None:
            return self._eager(ids.to(self.device), want_logits)
        if n > shape:
            rows = []  # each replay overwrites the graph's logits: copy them out in between
            for at in range(0, n, shape):
                logits = self._replay(ids[at:at + shape], shape)
                if want_logits:
                    rows.append(logits.clone())
            return torch.cat(rows) if want_logits else None
        logits = self._replay(ids, shape)
        return logits if want_logits else None

    def add_shapes(self, shapes) -> None:
        """Capture steps of more shapes (a decoder with another k): outside any round."""
        missing = sorted(set(shapes) - set(self.shapes))
        if missing:
            self.shapes = sorted(set(self.shapes) | set(missing))
            self._capture_all(missing)

    def reserve(self, positions: int) -> None:
        """Make room for a request that may reach `positions`: re-allocate and re-capture if needed."""
        if positions + SLACK > self.capacity:
            self._allocate(_round_up(positions + SLACK, 512))

    @contextlib.contextmanager
    def step_context(self, tokens: int):
        """What every warm-up and capture of a `tokens`-token step runs in, this runner's own and a
        round's: the head's tap armed."""
        with self.tap.armed() if self.tap is not None else contextlib.nullcontext():
            yield

    def step(self, ids: torch.Tensor, logits_out: torch.Tensor) -> torch.Tensor:
        """The captured step: forward at the shared position, logits into the owned buffer, advance."""
        from specgen.gpu.kernels import step_io

        n = ids.shape[0]
        with self._stepping():
            logits = self._owned_step(ids)
        if self.kernels.step_io:
            step_io.finish(logits, logits_out, self.position, n, dependent=self.kernels.dependent_launch)
        else:
            cols = min(logits.shape[-1], self.width)
            logits_out[:, :cols].copy_(logits[:, :cols])
            self.position.add_(n)
        return logits

    def step_rows(self, rows, logits_out: torch.Tensor) -> None:
        """A step over given rows (a token tree's, core/step/rows.py), logits into logits_out [n,
        width]; the position stays (the round's commit moves it). Inside a round's capture; a
        model over several GPUs never gets here (core/engine.py's tree_refusal). The head's tap armed:
        a head drafting trees reads the accepted path's states (core/round/head_tree.py)."""
        with self.tap.armed() if self.tap is not None else contextlib.nullcontext():
            logits = self.model.step(rows, self.cache, self.ops)[0]
        cols = min(logits.shape[-1], self.width)
        logits_out[:, :cols].copy_(logits[:, :cols])

    def compact(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move the K/V in slots src [m] to slots dst [m] (a tree's accepted path), on the device."""
        self.ops.compact(self.cache, src[None], dst[None])

    def batch_ops(self, capacity: int):
        """The kernel table a batch round (core/round/batch_round.py) steps this runner's model with,
        over caches of `capacity` slots of its own: this runner's kernels and linear configurations,
        taking a batch's B x (k + 1) rows in one call, so that each row gets the bits of this
        runner's own steps, and a rotary table of that capacity."""
        from specgen.gpu.kernels.linear import BATCH_ROWS
        from specgen.gpu.ops import TritonOps

        ops = TritonOps(self.kernels, self.ops.counters, self.ops.linear_table, rows=BATCH_ROWS)
        ops.tabulate(self.model.inv_freq, self.model.dtype, capacity)
        return ops

    def crossings(self) -> dict[str, str]:
        """Per captured step of a model over several devices, what its replay runs (describe())."""
        return {f"{n}-token step": g.graph.summary() for n, g in sorted(self.graphs.items())
                if isinstance(g.graph, stages.SegmentedGraph)}

    # -- internals ------------------------------------------------------------------------------

    def _ops(self, kernels: ResolvedKernels, workspace: Workspace):
        from specgen.gpu.kernels import linear
        from specgen.gpu.ops import TritonOps

        counters = {}
        if kernels.split_k:  # split-K's arrival counters: one set a device, taken before any capture holds them
            devices = self.stages.devices if self.stages is not None else [self.device]
            counters = {d: linear.split_k_counters(workspace if d == self.device else Workspace(d)) for d in devices}
        if kernels.linear:
            for layer in self.model.model.layers:
                layer.self_attn.fuse()
        return TritonOps(kernels, counters)

    def _owned_step(self, ids: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """The model's logits [n or keep, V] (on the home device) for ids [n] after the position
        (not advanced)."""
        from specgen.core.step.rows import chain_at

        buffer = self.positions if ids.shape[0] <= MAX_GRAPH_TOKENS else None
        rows = chain_at(ids.unsqueeze(0), self.position, self.steps, buffer)
        carry = self.stages.bring if self.stages is not None else None
        logits = self.model.step(rows, self.cache, self.ops, keep, carry)[0]
        return carry(self.device, logits) if carry is not None else logits

    def _stepping(self):
        """A step's span: with Stages, it starts and ends on the home device."""
        return self.stages.step() if self.stages is not None else contextlib.nullcontext()

    def _shape_for(self, n: int) -> int | None:
        """The captured shape an n-token feed replays (chunked when n is larger), or None: eager."""
        if not self.graphs:
            return None
        fits = [shape for shape in self.graphs if shape >= n]
        if fits:
            return min(fits)
        largest = max(self.graphs)
        return largest if n <= largest * MAX_CHUNKS else None

    def _replay(self, ids: torch.Tensor, shape: int) -> torch.Tensor:
        """Run the `shape`-token graph on ids ([n <= shape]) padded with stale ids: logits [n, width]."""
        n = ids.shape[0]
        graph = self.graphs[shape]
        self.ids[:n].copy_(ids, non_blocking=True)
        graph.graph.replay()  # advances the position by `shape`
        self.length += n
        if n < shape:
            self.position.fill_(self.length)
        return graph.logits[:n]

    def _allocate(self, capacity: int) -> None:
        start = time.perf_counter()
        self.graphs = {}  # old graphs point at the old cache
        self.generation += 1  # graphs captured elsewhere check this
        self.capacity = capacity
        self.position = torch.zeros((), dtype=torch.long, device=self.device)
        self.steps = torch.arange(capacity, device=self.device)
        self.ids = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.long, device=self.device)
        self.cache = self.model.new_cache(1, capacity)
        self.ops.tabulate(self.model.inv_freq, self.model.dtype, capacity)
        self._eager(self.ids[:1], want_logits=False)  # Triton's first launches, before any capture
        self.reset()
        self.setup_seconds += time.perf_counter() - start
        self._capture_all(self.shapes)

    def _capture_all(self, shapes) -> None:
        shapes = [n for n in shapes if n <= MAX_GRAPH_TOKENS] if self.use_graphs else []
        start = time.perf_counter()
        for i, n in enumerate(shapes):
            if self.progress is not None:
                self.progress(i, len(shapes), f"{self.name}: {n}-token step")
            self.graphs[n] = self._capture(n)
        if shapes and self.progress is not None:
            self.progress(len(shapes), len(shapes), f"{self.name}: ready")
        self.setup_seconds += time.perf_counter() - start

    @torch.inference_mode()
    def _eager(self, ids: torch.Tensor, want_logits: bool) -> torch.Tensor | None:
        with self.step_context(ids.shape[0]), self._stepping():
            logits = self._owned_step(ids, keep=0 if want_logits else 1)
        self.position.add_(ids.shape[0])
        self.length += ids.shape[0]
        return _fit(logits, self.width) if want_logits else None

    @torch.inference_mode()
    def _capture(self, n: int) -> _Graph:
        """Warm up and capture the n-token step, writing into the scratch end of the cache."""
        ids = self.ids[:n]
        ids.zero_()
        logits = torch.full((n, self.width), float("-inf"), dtype=torch.float32, device=self.device)
        scratch = self.capacity - n  # never a live position (reserve keeps SLACK free)

        def step():
            with self.step_context(n):
                return self.step(ids, logits)

        def warm_up():
            self.position.fill_(scratch)
            step()

        graph, raw = capture(step, self.device, WARMUP_STEPS, warm_up=warm_up,
                             settle=lambda: self.position.fill_(scratch),
                             segmented=[self.stages] if self.stages is not None else ())
        self.position.fill_(self.length)
        return _Graph(graph, logits, raw)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
