"""Counting a round's launches on the CPU: what a captured round on a GPU would launch, per phase.

A captured round pays per kernel (a few µs of launch gap and a graph node each), so its cost in
small ops is their number. `LaunchCounter` counts, while it is active, every aten op that reaches
the dispatcher (each a kernel on CUDA, bar the views and allocations, which launch none) and every
Triton kernel launch (through the interpreter here, or the JIT on a GPU: one launch each; the
torch ops a launch runs inside the interpreter are its own, not counted). `CountingBackend` runs
the real round on the GPU's tables (gpu/round_ops.py's Triton table, the step table's compaction
kernel), uncaptured, with a mark() that moves the counter to the next phase: draft, target,
sample, as core/backend.py's RoundClock names them.

Counts are not timings: an op's cost is not its count, but a phase's count is the number of
nodes its graph holds, which no refactor should silently grow.
"""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

from gpu_helpers import KernelRunners, kernels
from specgen.core.backend import EagerProgram

PHASES = ("draft", "target", "sample")
# ops that launch nothing on a GPU: allocations (their fill, where they have one, is counted)
FREE = {"empty.memory_format", "empty_strided.default", "empty_like.default"}
# ops that wait for the device (a captured round must have none)
SYNCS = {"_local_scalar_dense.default", "item.default", "nonzero.default", "equal.default"}


def _name(func) -> str:
    return f"{func._schema.name.split('::')[-1]}.{func._overloadname}"


class LaunchCounter(TorchDispatchMode):
    """ops[phase]: Counter of aten op names; triton[phase]: Counter of kernel names; syncs[phase]:
    ops that wait for the device. Before the first mark() and after the last nothing is counted."""

    def __init__(self):
        super().__init__()
        self.phase = -1
        self.ops = {p: Counter() for p in PHASES}
        self.triton = {p: Counter() for p in PHASES}
        self.syncs = {p: Counter() for p in PHASES}
        self._inside = 0  # > 0 inside a Triton launch: its interpreter's torch calls are not the round's
        self._patched = []

    def mark(self) -> None:
        self.phase += 1

    @property
    def _current(self) -> str | None:
        return PHASES[self.phase] if 0 <= self.phase < len(PHASES) else None

    def launches(self, phase: str) -> int:
        return sum(self.ops[phase].values()) + sum(self.triton[phase].values())

    def table(self) -> dict[str, tuple[int, int]]:
        """{phase: (aten ops, Triton launches)}."""
        return {p: (sum(self.ops[p].values()), sum(self.triton[p].values())) for p in PHASES}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        phase = self._current
        if phase is not None and not self._inside:
            name = _name(func)
            if name in SYNCS:
                self.syncs[phase][name] += 1
            if not func.is_view and name not in FREE:
                self.ops[phase][name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._patch()
        return super().__enter__()

    def __exit__(self, *exc):
        for cls, run in self._patched:
            cls.run = run
        self._patched = []
        return super().__exit__(*exc)

    def _patch(self) -> None:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        counter = self
        for cls in (InterpretedFunction, JITFunction):
            run = cls.run

            def counted(fn, *args, _run=run, **kwargs):
                phase = counter._current
                if phase is not None and not counter._inside and not kwargs.get("warmup", False):
                    counter.triton[phase][getattr(fn, "__name__", "?")] += 1
                counter._inside += 1
                try:
                    return _run(fn, *args, **kwargs)
                finally:
                    counter._inside -= 1

            self._patched.append((cls, run))
            cls.run = counted


class CountingBackend(KernelRunners):
    """KernelRunners (GraphRunners on the step's kernel table, uncaptured) with the round's Triton
    table, whose programs count each round's launches into `counter` while `counting` is on."""

    def __init__(self, step_kernels=None, capacity: int = 192):
        from specgen.gpu.round_ops import TritonRoundOps
        from specgen.gpu.workspace import Workspace

        super().__init__(step_kernels or kernels(), capacity)
        self.ops = TritonRoundOps(Workspace(self.device))
        self.counter: LaunchCounter | None = None  # set: the next round (of `mode`) is counted into it
        self.mode = None

    def program(self, rnd, mode):
        def body(mark):
            counter = self.counter
            if counter is None or self.mode not in (None, mode):
                return rnd.body(mode, mark)
            self.counter = None  # one round only
            with counter:
                rnd.body(mode, lambda: (mark(), counter.mark()))

        return EagerProgram(body)


def count_round(decoder, prompt: list[int], after: int = 1, mode=None) -> LaunchCounter:
    """The launches of the first round (of `mode`, None: any) after `after` rounds of decoding
    `prompt` (a CountingBackend's decoder): every phase, counted once."""
    backend = decoder.round.backend
    backend.mode = mode
    counter = LaunchCounter()
    rounds = 0
    for event in decoder.run(prompt):
        rounds += 1
        if rounds == after:
            backend.counter = counter
        if counter.phase >= len(PHASES):
            break
    assert counter.phase >= len(PHASES), "the request ended before the counted round"
    return counter
