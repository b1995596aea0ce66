"""The CUDA backend: Triton kernels, CUDA-graph runners, and the round captured as one CUDA graph.

At batch 1 a round's launches (tens of microseconds each from Python) cost more than the GPU work
they start, so the whole round (k draft steps, the target's step, warp, verify, staging and the
cache rollback: core/round/round.py's body) is captured once per mode and replayed: one replay and one
host read per round. The body is the same function the torch backend runs eagerly.

specgen's own models (core/step/) run on GraphRunners; models of other architectures, which
transformers' modules compute, on core/runner.py's EagerRunner (no capture: their rounds run
eagerly too). If a round cannot be captured (a model whose step breaks capture), it runs eagerly
with the same kernels, after one warning; if the runners cannot be captured with the step kernels,
they are captured without them (SDPA, cuBLAS), and if not even that works, they run eagerly.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref

import torch

from specgen.core.backend import EagerBatch, EagerProgram, RoundClock
from specgen.core.errors import SpecgenError, UsageError
from specgen.core.round import Mode, Round
from specgen.core.round.ops import RoundOps, TorchRoundOps
from specgen.core.runner import PREFILL_CHUNK
from specgen.gpu import stages
from specgen.gpu.kernels import verify as gpu_verify
from specgen.gpu.capture import capture
from specgen.gpu.policy import ResolvedKernels, resolve
from specgen.gpu.round_ops import TritonRoundOps
from specgen.gpu.runner import GraphRunner
from specgen.gpu.workspace import Workspace, device_of

WARMUP_ROUNDS = 2  # eager runs before capture: Triton JIT, cuBLAS handles, allocations


class CudaBackend:
    name = "cuda"
    captures = True  # graph() captures (falling back to fn, with a warning, where capture fails)

    def __init__(self, device: torch.device, profile, progress=None):
        self.device = device = device_of(device)  # "cuda": the current GPU, named
        # The current device, for the launches that take it rather than their tensors' (Triton's
        # kernels, a graph's capture stream, the round's timing events): the rounds run here. It
        # stays set after the backend is built: a process runs one pair's rounds.
        torch.cuda.set_device(device)
        self.speculation = profile.speculation
        self.kernel_spec = profile.kernels
        self.progress = progress
        self.workspace = Workspace(device)
        self.kernels: dict[str, ResolvedKernels] = {}  # by runner name, as resolved
        # the round's ops: Triton's until the target's kernel policy chooses (runner("target"))
        self.ops: RoundOps = TritonRoundOps(self.workspace)
        self.notes: list[str] = []  # fallbacks taken, for describe()
        self.spread: dict[str, GraphRunner] = {}  # runners of models over several devices (gpu/stages.py)
        self.programs = weakref.WeakSet()  # the live GraphPrograms: describe() reports their captures

    # -- runners ----------------------------------------------------------------------------------

    def runner(self, model, width: int, capacity: int, name: str, shapes: tuple[int, ...] = (), tap=None):
        from specgen.core.step.model import OwnedModel

        kernels = resolve(self.kernel_spec, self.device, model)
        if name == "draft":  # it steps one row at a time: its projections' fastest at one row
            kernels = dataclasses.replace(kernels, linear_table=kernels.linear_table.for_drafts())
        if name == "target":  # the round's ops, as the target's policy says (dependent: each launch waits)
            self.ops = TritonRoundOps(self.workspace, kernels.dependent_launch) if kernels.warp else TorchRoundOps()
        if not isinstance(model, OwnedModel):  # transformers' modules: eager, no step kernel (the loader said why)
            from specgen.core.runner import EagerRunner

            self.kernels[name] = ResolvedKernels(attention=False, linear=False, rope=False, split_k=False,
                                                 warp=kernels.warp)
            return EagerRunner(model, width, capacity, tap=tap)
        spread = stages.spread(model, self.device)
        if spread and tap is not None:
            raise UsageError(f"a head drafts from the {name}'s hidden states, which this run spreads over several "
                             "devices; heads need the whole target on one GPU",
                             hint="drop the target's device_map, or use --proposer draft")
        common = dict(workspace=self.workspace, shapes=(PREFILL_CHUNK, *shapes), progress=self.progress, name=name,
                      tap=tap)
        try:
            runner = GraphRunner(model, width, capacity, kernels=kernels, **common)
        except SpecgenError:  # the user's settings: theirs to change
            raise
        except Exception as exc:  # noqa: BLE001 (the step kernels are an optimisation: fall back, below)
            plain = ResolvedKernels(attention=False, linear=False, rope=False, split_k=False, warp=kernels.warp)
            runner = self._fallback(model, width, capacity, plain, common, exc, name)
            kernels = plain
        self.kernels[name] = kernels
        if runner.stages is not None:
            self.spread[name] = runner
        return runner

    def _fallback(self, model, width, capacity, plain, common, failure: Exception, name: str):
        try:
            runner = GraphRunner(model, width, capacity, kernels=plain, **common)
            self._warn(f"{name}: the step kernels failed ({_first_line(failure)}); steps use SDPA and cuBLAS")
            return runner
        except SpecgenError:
            raise
        except Exception as exc:  # noqa: BLE001
            self._warn(f"{name}: could not capture CUDA graphs ({_first_line(exc)}); steps run eagerly")
            return GraphRunner(model, width, capacity, kernels=plain, **(common | dict(use_graphs=False)))

    def _warn(self, message: str) -> None:
        self.notes.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    # -- kernels ----------------------------------------------------------------------------------

    def check(self, first_id: int) -> None:
        """The kernels cannot raise: they leave a sentinel in the output row, read with the round."""
        gpu_verify.check_output(first_id, self.workspace)

    def head_ops(self, head, batch: bool = False):
        """An EAGLE-3 head's kernel table: the target's kernel policy (when its head fusion is on,
        with its linear kernel) with the draft picks of the linear table (a head steps one row at a
        time, as a draft model does); None: the torch reference. batch: a batch's table
        (core/round/batch_head.py), taking its B x (k + 1) rows in one call as Runner.batch_ops does. No split-K: a small head's
        products do not gain from it; at Llama 3.1 8B's width it would save 3% of a head call
        (`git show 1b54921:docs/benchmarks.md`, "An EAGLE-3 head on Llama 3.1 8B (H200)"), about 1%
        of a round, not yet worth a split-K table for every head's shapes."""
        kernels = self.kernels.get("target")
        if kernels is None or not kernels.head:
            return None
        from specgen.gpu.ops import TritonOps  # noqa: PLC0415 (only with a head)

        head.layers[0].self_attn.fuse()
        from specgen.gpu.kernels.linear import BATCH_ROWS  # noqa: PLC0415

        return TritonOps(dataclasses.replace(kernels, split_k=False), table=kernels.linear_table.for_drafts(),
                         **({"rows": BATCH_ROWS} if batch else {}))

    # -- capture ----------------------------------------------------------------------------------

    def graph(self, fn, what: str):
        """fn captured as a CUDA graph (gpu/capture.py); returns the replay, or fn itself after one
        warning naming `what` when capture fails. fn's warm-ups run for real: its callers point them
        at scratch state."""
        try:
            graph, _ = capture(fn, self.device, WARMUP_ROUNDS)
        except Exception as exc:  # noqa: BLE001 (an optimisation: run it eagerly instead)
            torch.cuda.synchronize(self.device)
            self._warn(f"could not capture {what} ({_first_line(exc)}); it runs eagerly")
            return fn
        return graph.replay

    def program(self, rnd: Round, mode: Mode):
        runners = rnd.runners
        if not self.ops.capturable or not all(r.use_graphs for r in runners):
            return EagerProgram(lambda mark: rnd.body(mode, mark))  # the references sync: no capture
        program = GraphProgram(rnd, mode, self)
        self.programs.add(program)
        return program

    def batch_program(self, rnd):
        """A BatchRound's body captured (BatchGraphs), or run as it is where the round's ops are the
        references (they sync)."""
        if not self.ops.capturable:
            return EagerBatch(rnd)
        return BatchGraphs(rnd, self)

    def describe(self) -> dict:
        return {"backend": self.name, "device": torch.cuda.get_device_name(self.device),
                "cuda_graphs": True,
                "kernels": {name: k.as_dict() for name, k in self.kernels.items()}, "fallbacks": self.notes,
                "placement": {name: {"units": r.stages.describe(), "steps": r.crossings(), "rounds": self._rounds(r)}
                              for name, r in self.spread.items()} or None}

    def _rounds(self, runner: GraphRunner) -> dict[str, str]:
        """What each captured round that steps `runner` replays (SegmentedGraph.summary), by k and mode."""
        rounds = {}
        for program in list(self.programs):
            graph = program.graphs.get(0, (None,))[0]
            if isinstance(graph, stages.SegmentedGraph) and any(r is runner for r in program.rnd.runners):
                rounds[f"k={program.rnd.shape.k} {program.mode.value}"] = graph.summary()
        return dict(sorted(rounds.items()))


class GraphProgram:
    """rnd.body(mode) captured as CUDA graphs, one per slot (re-captured when a runner re-allocates
    its cache). Why slots: the decode loop queues a round before reading the one before it
    (core/decode.py), and a capture's timing events are recorded anew by each replay, so two rounds
    in flight need two captures to keep their phases apart."""

    asynchronous = True  # launch() only queues the round: the host can go on while it runs

    def __init__(self, rnd: Round, mode: Mode, backend: CudaBackend):
        self.rnd, self.mode, self.backend = rnd, mode, backend
        self.graphs: dict[int, tuple] = {}  # slot -> (graph, events)
        self.generation = ()
        self.eager = None  # set when capture failed: the body runs eagerly
        self._capture(0)

    def prepare(self, slots: int) -> None:
        """Capture the slots up to `slots` now (at start-up, not inside a timed run), again where a
        runner re-allocated its cache since they were captured (else launch() would, inside a run)."""
        if self.eager is None and self.generation != self._generations():
            self.graphs.clear()
        for slot in range(slots):
            if self.eager is None and slot not in self.graphs:
                self._capture(slot)

    def launch(self, clock: RoundClock, slot: int = 0) -> None:
        if self.eager is not None:
            return self.eager.launch(clock)
        if self.generation != self._generations():
            self.graphs.clear()
            self.generation = self._generations()
        if slot not in self.graphs:
            self._capture(slot)
            return self.launch(clock, slot)
        graph, events = self.graphs[slot]
        clock.begin(events)
        if not events:
            clock.mark()
        graph.replay()

    def _spread(self) -> list:
        """The Stages of the round's runners whose models lie on several devices (gpu/stages.py)."""
        return [r.stages for r in self.rnd.runners if any(r is s for s in self.backend.spread.values())]

    def _generations(self) -> tuple:
        return tuple(r.generation for r in self.rnd.runners)

    def _capture(self, slot: int) -> None:
        """Warm up at scratch positions, restore the state, capture with timing events inside
        (without them where this CUDA/torch cannot); if neither captures, warn once and run eagerly."""
        rnd, device = self.rnd, self.rnd.device
        saved = [t.clone() for t in self._state()]
        error = None
        for timed in (True, False):
            try:
                events = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(4)] if timed else []
                marks = iter(events)
                mark = (lambda: next(marks).record()) if timed else _none
                graph, _ = capture(lambda: rnd.body(self.mode, mark), device, WARMUP_ROUNDS, warm_up=self._warm_up,
                                   settle=lambda: self._restore(saved), segmented=self._spread())
            except Exception as exc:  # noqa: BLE001 (whatever capture raises: without events, then eager)
                error = exc
                torch.cuda.synchronize(device)
                self._restore(saved)
                continue
            self._restore(saved)
            self.graphs[slot] = (graph, events)
            self.generation = self._generations()
            return
        self.graphs.clear()
        self.eager = EagerProgram(lambda mark: rnd.body(self.mode, mark))
        self.asynchronous = False
        self.backend._warn(f"could not capture the round ({_first_line(error)}); rounds run eagerly")

    def _state(self) -> list[torch.Tensor]:
        rnd = self.rnd
        return [r.position for r in rnd.runners] + rnd.state()

    def _warm_up(self) -> None:
        """One warm-up round at scratch positions: never a live one."""
        rnd = self.rnd
        for r in rnd.runners:
            r.position.fill_(r.capacity - rnd.reach)
        rnd.body(self.mode, _none)

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for tensor, value in zip(self._state(), saved):
            tensor.copy_(value)


class BatchGraphs:
    """A BatchRound's body (core/round/batch_round.py) captured as CUDA graphs: one per shape_key()
    (its caches' generation and its rows' warp flags, which choose the body's launches), captured
    when first needed and dropped when the caches are re-allocated. Warm-ups run at the scratch
    end of the caches and the round's state is restored before capture, as GraphProgram does. A
    body that cannot be captured runs eagerly from then on, after one warning (its kernels are
    queued all the same: the loop may keep two rounds in flight either way)."""

    asynchronous = True

    def __init__(self, rnd, backend: CudaBackend):
        self.rnd, self.backend = rnd, backend
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.generation = rnd.generation
        self.eager: EagerBatch | None = None

    def launch(self) -> None:
        if self.eager is not None:
            return self.eager.launch()
        rnd = self.rnd
        rnd.flush()  # the rows' starts first: a capture's warm-ups below restore the state they set
        if rnd.generation != self.generation:  # the graphs point at the old caches
            self.graphs.clear()
            self.generation = rnd.generation
        key = rnd.shape_key()
        if key not in self.graphs and not self._capture(key):
            return self.eager.launch()
        self.graphs[key].replay()

    def _capture(self, key: tuple) -> bool:
        rnd, device = self.rnd, self.rnd.device
        saved = [t.clone() for t in rnd.state()]

        def warm_up():
            rnd.scratch()
            rnd.body()

        def restore():
            for tensor, value in zip(rnd.state(), saved):
                tensor.copy_(value)

        try:
            graph, _ = capture(rnd.body, device, WARMUP_ROUNDS, warm_up=warm_up, settle=restore)
        except Exception as exc:  # noqa: BLE001 (an optimisation: run it eagerly instead)
            torch.cuda.synchronize(device)
            restore()
            self.graphs.clear()
            self.eager = EagerBatch(rnd)
            self.backend._warn(f"could not capture the batch round ({_first_line(exc)}); rounds run eagerly")
            return False
        restore()
        self.graphs[key] = graph
        return True


def _none() -> None:
    pass


def _first_line(exc: Exception | None) -> str:
    if exc is None:
        return "unknown"
    return f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0]
