"""Loading the engine: the start-up seconds that follow the checks of options, profile and prompts."""

from __future__ import annotations

import contextlib
import gc

from specgen.cli import render


def load_engine(settings, allow_pickle: bool, status: bool):
    """Import torch and transformers and load the pair; status: the start-up status line on a
    terminal's stderr (shown from the first import on, not only once torch is in)."""
    with render.startup_status(enabled=status) as progress, collector_paused():
        from specgen.core.engine import Engine

        return Engine(settings, allow_pickle=allow_pickle, progress=progress)


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
