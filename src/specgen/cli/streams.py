"""stdout and stderr as a shell may hand them over: closed, full, or gone.

- stdout carries the results: a write that fails (a full disk) becomes OutputError, a one-line
  message naming stdout, instead of an unexplained OSError; a reader gone away (`| head`) stays a
  BrokenPipeError, which ends specgen quietly.
- stderr carries diagnostics only, so it must never fail a run: when it is closed (`2>&-`) or its
  writes fail (`2> /dev/full`), descriptor 2 is pointed at /dev/null. Closed, it must also not leave
  descriptor 2 free: the next file opened would get it, and writes meant for stderr would land there
  (or, through print(file=None), on stdout).

protect() installs this in the real process (cli/main.py); the in-process tests use their own streams.
"""

from __future__ import annotations

import io
import os
import sys

from specgen.core.errors import SpecgenError

STDERR = 2


class OutputError(SpecgenError):
    """The results could not be written to stdout (exit code 1)."""


def protect() -> None:
    if sys.stderr is None:  # started with descriptor 2 closed
        _point_at_devnull(STDERR)
        sys.stderr = io.TextIOWrapper(io.FileIO(STDERR, "w", closefd=False), line_buffering=True,
                                      errors="backslashreplace")
    sys.stderr = Diagnostics(sys.stderr)
    if sys.stdout is not None:
        sys.stdout = Results(sys.stdout)


def _point_at_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


def discard(stream) -> None:
    """From now on what is written to `stream` (and what it still buffers) goes nowhere."""
    try:
        _point_at_devnull(stream.fileno())
    except (AttributeError, OSError, ValueError):  # not a real file (tests)
        pass


class _Wrapper:
    """A text stream that hands everything but writing to the stream it wraps."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class Diagnostics(_Wrapper):
    """stderr whose failures are dropped, after which it writes to /dev/null."""

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            discard(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            discard(self._stream)


class Results(_Wrapper):
    """stdout whose failures (other than a closed pipe) name stdout."""

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _output_error(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _output_error(exc) from None


def _output_error(exc: OSError) -> OutputError:
    return OutputError(f"cannot write the results to stdout: {exc.strerror or exc}",
                       hint="make room where stdout goes, or redirect it elsewhere")
