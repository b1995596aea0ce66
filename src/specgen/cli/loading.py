"""Loading the engine: the start-up seconds that follow the checks of options, profile and prompts."""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from specgen.cli import render


def load_engine(settings, allow_pickle: bool, status: bool, proposers: tuple[str, ...] | None = None):
    """Import torch and transformers and load the pair; status: the start-up status line on a
    terminal's stderr (shown from the first import on, not only once torch is in); proposers: the
    kinds the engine serves (bench's list; default the settings' own)."""
    check_before_loading(settings)
    with render.startup_status(enabled=status) as progress, collector_paused():
        from specgen.core.engine import Engine

        return Engine(settings, allow_pickle=allow_pickle, progress=progress, proposers=proposers)


def check_before_loading(settings) -> None:
    """What the settings need on disk besides the models, checked before a minute of loading: the
    compile cache folder, which compile writes at the end of start-up (core/compile_cache.py)."""
    if settings.speculation.compile:
        from specgen.core.compile_cache import check_writable

        check_writable(settings.speculation.compile_cache)


@dataclass(frozen=True)
class Startup:
    """Seconds before the first prompt, measured once per process.

    load: importing torch and transformers, reading the pair and placing it on the device;
    setup: the runners' caches, CUDA-graph capture and compile, and the first decoder's round
    (built and, on a GPU, captured)."""

    load_seconds: float
    setup_seconds: float

    def as_dict(self) -> dict:
        return {"load_seconds": self.load_seconds, "setup_seconds": self.setup_seconds}

    def text(self) -> str:
        return f"load {self.load_seconds:.2f} s, setup {self.setup_seconds:.2f} s"


@runtime_checkable
class TimedSetup(Protocol):
    """A runner that counts the seconds it spent preparing (gpu/runner.py's GraphRunner: cache
    allocation, capture, compile); the eager runner prepares nothing."""

    setup_seconds: float


def start_engine(settings, allow_pickle: bool, status: bool):
    """load_engine, then the settings' decoder: (engine, decoder, Startup). The runners' own setup
    seconds are taken out of the engine's construction, so load and setup do not overlap."""
    check_before_loading(settings)
    begin = time.perf_counter()
    with render.startup_status(enabled=status) as progress:
        with collector_paused():
            from specgen.core.engine import Engine

            engine = Engine(settings, allow_pickle=allow_pickle, progress=progress)
        built = time.perf_counter()
        decoder = engine.decoder()
        ready = time.perf_counter()
    runners = sum(r.setup_seconds for r in (engine.target_runner, engine.draft_runner) if isinstance(r, TimedSetup))
    return engine, decoder, Startup(load_seconds=built - begin - runners, setup_seconds=runners + ready - built)


@contextlib.contextmanager
def collector_paused():
    """Importing torch and transformers and loading the models create millions of objects that all
    live until the process ends; Python's cycle collector would walk them again and again meanwhile
    (docs/benchmarks.md, "Start-up of the demo (2-core CPU)"). Paused for that, then resumed as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
