"""Shared fixtures: `cli` runs the specgen command in-process, the way `specgen` itself does."""

from __future__ import annotations

import os
import sys

import pytest
import torch

# The tiny test models multiply 64-wide matrices: one thread is faster than several, and much
# faster when other processes share the cores (threads then wait on each other at every op).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _current_gpu():
    """A CUDA backend makes its GPU the current one for the rest of the process (gpu/backend.py):
    the current GPU goes back after each test, so that no test inherits another's."""
    saved = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else 0
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_device(saved)


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory):
    """The user's cache folder (tuned tables, the facts `bench` keeps for tree_width auto) is a
    folder of the test session's, for this process and the ones it starts: no test reads what
    the user measured, or writes there."""
    with pytest.MonkeyPatch.context() as patch:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        # Hugging Face's cache stays where it was (it follows XDG_CACHE_HOME where HF_HOME is unset)
        patch.setenv("HF_HOME", os.environ.get("HF_HOME") or os.path.join(cache, "huggingface"))
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture
def cli(capsys, monkeypatch):
    """cli(*args) -> (exit code, stdout, stderr), through cli/errors.py's exit-code mapping."""
    from specgen.cli import errors
    from specgen.cli.main import app

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["specgen", *map(str, args)])
        code = errors.run(app)
        out, err = capsys.readouterr()
        return code, out, err

    return run
