"""Shared fixtures: `cli` runs the specgen command in-process, the way `specgen` itself does."""

from __future__ import annotations

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
