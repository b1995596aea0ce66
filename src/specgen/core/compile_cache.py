"""The folder where torch.compile keeps what it compiled for specgen's steps, between runs.

specgen hands it to inductor as TORCHINDUCTOR_CACHE_DIR while its steps compile (gpu/runner.py's
compile_cache). Inductor keeps everything a second start needs below it: the FX graph cache (the
generated code per graph), the AOT autograd cache in front of it, the Triton kernels it compiled
(bundled with their graphs, and under triton/ unless TRITON_CACHE_DIR is set) and its autotuning
results. A second start of the same pair with the same settings then traces the model again but
compiles nothing. Checked before any model loads, so that a folder specgen cannot write fails in
a line, not after a minute of loading and compiling. No torch import here.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specgen.core.errors import UsageError


def cache_dir(folder: str = "") -> Path:
    """speculation.compile_cache, else specgen's folder in the user's cache directory."""
    if folder:
        return Path(folder).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specgen" / "inductor"


def check_writable(folder: str = "") -> Path:
    """cache_dir(folder), created if missing; a UsageError when specgen cannot write there."""
    path = cache_dir(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        where = (f"speculation.compile_cache = {folder!r}" if folder
                 else f"specgen's compile cache folder {path} (speculation.compile_cache is not set)")
        hint = ("set compile_cache in [speculation] to a folder you can write" if folder else
                "set compile_cache in [speculation] to a folder you can write, or XDG_CACHE_HOME to a "
                "writable cache directory")
        raise UsageError(f"{where}: cannot write there ({reason})",
                         hint=hint + ", or turn compile off (--no-compile)") from None
    return path
