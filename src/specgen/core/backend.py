"""Backends: what the one round (core/round/) runs on.

A backend supplies the round's ops (core/round/ops.py: one table, chosen once), its model runners
and its capture. The torch backend runs everywhere: the references (TorchRoundOps), eager runners
over a static cache, and "capture" that runs the body as it is. gpu/backend.py's CUDA backend
supplies Triton's table (or the references, as the target's kernel policy says), CUDA-graph
runners and capture as a CUDA graph of the same body.
core/engine.py's `make_backend` picks one: the one place core reaches gpu/, only for a CUDA device.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import torch

from specgen.core.round.ops import RoundOps, TorchRoundOps
from specgen.core.runner import EagerRunner, Runner


class Program(Protocol):
    """One round of a given mode, ready to queue: launch() runs it or replays its capture.
    asynchronous: launch() only queues the round (a captured graph), so the loop gains from
    queueing the next one before reading this one; slot: which of the rounds in flight (0 or 1)
    this is, each with timing events of its own; prepare(slots): have that many ready now."""

    asynchronous: bool

    def launch(self, clock: "RoundClock", slot: int = 0) -> None: ...

    def prepare(self, slots: int) -> None: ...


class Backend(Protocol):
    """The machinery a round runs on: its ops (one table, chosen by the backend), the runners that
    hold the caches, and how a round or a piece of one is run again (run, or captured and replayed)."""

    name: str
    device: torch.device
    ops: RoundOps
    captures: bool  # graph() captures, so work that fixes its shapes replays one graph per shape

    def runner(self, model, width: int, capacity: int, name: str, shapes: tuple[int, ...], tap=None) -> Runner: ...

    def program(self, rnd, mode) -> Program: ...

    def batch_program(self, rnd) -> "BatchProgram":
        """A BatchRound's body ready to run (core/round/batch_round.py): as it is, or captured."""
        ...

    def head_ops(self, head, batch: bool = False):
        """The kernel table (core/step/ops.py's protocol) an EAGLE-3 head's calls compute through
        on this backend (batch: a batch round's, taking its B x (k + 1) rows in one call); None:
        the head keeps the torch reference."""
        ...

    def graph(self, fn: Callable[[], None], what: str) -> Callable[[], None]:
        """fn, which reads and writes only tensors that outlive it, made cheap to run again: the
        CUDA backend captures it once and returns the replay; the torch backend returns fn."""
        ...

    def check(self, first_id: int) -> None: ...

    def describe(self) -> dict: ...


class RoundClock:
    """Device phases of a round (draft, verify, sample): CUDA events read after the round's sync,
    or wall time on the CPU. A captured round carries its own events (`inner`)."""

    PHASES = ("draft", "verify", "sample")

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if self.cuda else []
        self.done = torch.cuda.Event(enable_timing=True) if self.cuda else None
        self.inner: list = []
        self.marks: list[float] = []

    def begin(self, inner: list | None = None) -> None:
        self.inner = inner or []
        self.marks = []

    def mark(self) -> None:
        if self.cuda:
            self.events[len(self.marks)].record()
        self.marks.append(time.perf_counter())

    def finish(self) -> None:
        if self.cuda:
            self.done.record()

    def wait(self) -> None:
        """The round's one device-to-host synchronisation."""
        if self.cuda:
            self.done.synchronize()

    def spans(self) -> dict[str, float]:
        if self.inner:
            spans = [self.inner[i].elapsed_time(self.inner[i + 1]) / 1e3 for i in range(3)]
        elif len(self.marks) < 4:  # a captured round without events: one span for the whole replay
            spans = [0.0, self.events[0].elapsed_time(self.done) / 1e3 if self.cuda else 0.0, 0.0]
        elif self.cuda:
            spans = [self.events[i].elapsed_time(self.events[i + 1]) / 1e3 for i in range(3)]
        else:
            spans = [self.marks[i + 1] - self.marks[i] for i in range(3)]
        return dict(zip(self.PHASES, spans))


class EagerProgram:
    """The body run as it is, every launch (on the host's clock: one slot serves every round)."""

    asynchronous = False

    def __init__(self, body: Callable[[Callable[[], None]], None]):
        self.body = body

    def prepare(self, slots: int) -> None:
        pass

    def launch(self, clock: RoundClock, slot: int = 0) -> None:
        clock.begin()
        with torch.inference_mode():
            self.body(clock.mark)


class BatchProgram(Protocol):
    """One round of a BatchRound: launch() runs it or replays its capture (queued: the host's read
    of the staged ids is the round's sync). asynchronous: launch() only queues the round, so the
    batch loop gains from queueing the next one before reading this one (core/batch_decode.py)."""

    asynchronous: bool

    def launch(self) -> None: ...


class EagerBatch:
    """A BatchRound's body run as it is, every launch."""

    asynchronous = False

    def __init__(self, rnd):
        self.rnd = rnd

    def launch(self) -> None:
        self.rnd.flush()
        with torch.inference_mode():
            self.rnd.body()


class TorchBackend:
    """The torch references and eager runners: CPU, or any device without the CUDA backend."""

    name = "torch"
    captures = False  # graph() returns fn: a step of any shape costs only its own work

    def __init__(self, device: torch.device):
        self.device = device
        self.ops = TorchRoundOps()

    def runner(self, model, width: int, capacity: int, name: str, shapes: tuple[int, ...] = (), tap=None) -> Runner:
        return EagerRunner(model, width, capacity, tap)

    def program(self, rnd, mode) -> Program:
        return EagerProgram(lambda mark: rnd.body(mode, mark))

    def batch_program(self, rnd) -> BatchProgram:
        return EagerBatch(rnd)

    def head_ops(self, head, batch: bool = False):
        return None

    def graph(self, fn, what):
        return fn

    def check(self, first_id: int) -> None:
        """The references raise inside warp: nothing is left to report after the round."""

    def describe(self) -> dict:
        # the CUDA backend's keys too, so that a report reads the same on both
        return {"backend": self.name, "device": str(self.device), "cuda_graphs": False, "kernels": {},
                "fallbacks": [], "placement": None}  # accelerate places spread models
