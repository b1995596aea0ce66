"""Loading the engine: the start-up seconds that follow the checks of options, profile and prompts."""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from specgen.cli import render


def load_engine(settings, allow_pickle: bool, status: bool, proposers: tuple[str, ...] | None = None):
    """Import torch and transformers and load the pair; status: the start-up status line on a
    terminal's stderr (shown from the first import on, not only once torch is in); proposers: the
    kinds the engine serves (bench's list; default the settings' own)."""
    check_before_loading(settings, proposers)
    with render.startup_status(enabled=status) as progress, collector_paused():
        from specgen.core.engine import Engine

        return Engine(settings, allow_pickle=allow_pickle, progress=progress, proposers=proposers)


def check_before_loading(settings, proposers: tuple[str, ...] | None = None) -> None:
    """What the run needs on disk, checked before torch is imported and a minute of loading: the
    checkpoints the proposers need (a folder, or a hub id in the local cache) and the head's
    folder. proposers: as load_engine's."""
    from specgen.core.models.checkpoints import check_head_folder, check_present
    from specgen.core.profile import origin

    kinds = proposers or (settings.proposer.kind,)
    drafters = {settings.proposer.drafter(kind) for kind in kinds}
    check_head_option(settings, kinds, drafters)
    download = settings.runtime.download
    check_present(settings.target, download, origin(settings, "target.path"))
    if "draft" in drafters and settings.draft is not None:
        check_present(settings.draft, download, origin(settings, "draft.path"))
    if "eagle" in drafters:
        check_head_folder(Path(settings.proposer.head))


def check_head_option(settings, kinds: tuple[str, ...], drafters: set[str]) -> None:
    """--head names the EAGLE-3 head that --proposer eagle drafts with: given to a run in which no
    proposer drafts with a head, it would be ignored, so it is refused."""
    if "proposer.head" not in settings.options or "eagle" in drafters:
        return
    from specgen.core.errors import UsageError

    which = f"proposers are {', '.join(kinds)}" if len(kinds) > 1 else f"proposer is {kinds[0]}"
    raise UsageError(f"--head gives the EAGLE-3 head that --proposer eagle drafts with, and this run's {which}",
                     hint="add --proposer eagle, or drop --head")


@dataclass(frozen=True)
class Startup:
    """Seconds before the first prompt, measured once per process.

    load: importing torch and transformers, reading the pair and placing it on the device;
    setup: the runners' caches, CUDA-graph capture, and the first decoder's round
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
    allocation, capture); the eager runner prepares nothing."""

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
    (docs/benchmarks.md, "Start-up of the demo (2-core CPU)"). Paused for that, then resumed as it was,
    after one full collection: paused, the collector still counts them as young, and resumed it
    would walk them all three times over (young, middle, then oldest generation) at whatever later
    allocation its counts reach, inside a timed run as likely as not; walked once here, they sit in
    the oldest generation, which it walks again only once that has grown by a quarter."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if enabled:
            gc.collect()
    finally:
        if enabled:
            gc.enable()
