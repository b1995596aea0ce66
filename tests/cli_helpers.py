"""Running `specgen` in-process, with stdin, stdout and stderr of the test's choosing.

The command goes through cli/errors.run, like the console script, so exit codes and error lines are
the real ones. The streams can claim to be terminals, which capsys cannot.
"""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass

# Variables that change what specgen prints; each test starts without them.
OUTPUT_ENV = ("NO_COLOR", "FORCE_COLOR", "SPECGEN_DEBUG", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS")


class Stream(io.TextIOWrapper):
    """A UTF-8 text stream over bytes that says whether it is a terminal."""

    def __init__(self, data: bytes = b"", tty: bool = False):
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def text(self) -> str:
        self.flush()
        return self.buffer.getvalue().decode("utf-8")


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout.splitlines()]


def specgen(monkeypatch, *args, stdin: bytes = b"", tty: bool = False, env: dict | None = None,
            stdout: Stream | None = None) -> Result:
    """Run `specgen ARGS` in this process; tty=True makes stdout and stderr terminals."""
    from specgen.cli import errors
    from specgen.cli.main import app

    out, err = stdout or Stream(tty=tty), Stream(tty=tty)
    with monkeypatch.context() as patch:
        for name in OUTPUT_ENV:
            patch.delenv(name, raising=False)
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        patch.setattr(sys, "stdin", Stream(stdin))
        patch.setattr(sys, "stdout", out)
        patch.setattr(sys, "stderr", err)
        code = errors.run(app, [str(a) for a in args])
    return Result(code, out.text(), err.text())


def assert_error(result: Result, code: int, *fragments: str) -> None:
    """The error contract: the exit code, nothing on stdout, one line on stderr (two with a hint)."""
    assert result.code == code, result
    assert result.stdout == "", result
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("specgen: error: "), result
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), result
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def subprocess_env(**extra: str) -> dict:
    """The environment for a real `specgen` process: no output-changing variables, buffered output
    as in a real pipe (so specgen's own flushing is what the test sees), one torch thread."""
    env = {k: v for k, v in os.environ.items() if k not in (*OUTPUT_ENV, "PYTHONUNBUFFERED")}
    return env | {"OMP_NUM_THREADS": "1"} | extra
