"""The live view of `specgen generate`: on a terminal's stderr, in colour, with the footer; never in a pipe.

The terminal is a pseudo-terminal (the pty module), so no tmux or `script` is needed.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios

import pytest

from specgen.cli import render
from specgen.core.stats import AcceptanceStats
from tiny_models import build_pair, write_profile

FOOTER = ("tok/s", "rounds", "acceptance", "mean accepted length", "per position")


@pytest.fixture(scope="module")
def command(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    profile = write_profile(root / "tiny.toml", *build_pair(root, noisy=0.1))
    return [sys.executable, "-m", "specgen.cli.main", "generate", "-p", str(profile), "-n", "40", "--ignore-eos",
            "def add(a, b):"]


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "SPECGEN_DEBUG")}
    return env | {"TERM": "xterm-256color", "OMP_NUM_THREADS": "1"}


def run_with_terminal_stderr(args: list[str]) -> tuple[int, bytes, bytes]:
    """stderr on a 100x24 pseudo-terminal, stdout on a pipe."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower,
                            env=environment())
    os.close(follower)
    err = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            err += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read()
    proc.wait(timeout=120)
    os.close(leader)
    return proc.returncode, out, err


def test_live_view_on_a_terminal(command):
    code, out, err = run_with_terminal_stderr(command)
    assert code == 0, err.decode(errors="replace")
    text = err.decode("utf-8", errors="replace")
    assert "\x1b[32m" in text  # green: accepted tokens (and the legend)
    assert "\x1b[33m" in text  # yellow: recovered tokens
    for word in FOOTER:
        assert word in text
    assert "■ accepted" in text and "■ recovered" in text and "■ bonus" in text
    assert b"\x1b[" not in out  # stdout, a pipe, gets the plain text only
    assert out.strip()


def test_no_live_view_when_stderr_is_piped(command):
    proc = subprocess.run(command, capture_output=True, env=environment(), timeout=120)
    assert proc.returncode == 0
    err = proc.stderr.decode()
    assert "\x1b[" not in err and b"\x1b[" not in proc.stdout
    assert "per position" not in err and "■" not in err
    assert err.strip().startswith("40 tokens in ") and err.count("\n") == 1  # only the summary line


def test_footer_content():
    stats = AcceptanceStats()
    stats.add_round(4, 4, 5, {"draft": 0.01, "verify": 0.02})
    stats.add_round(4, 1, 2, {"draft": 0.01, "verify": 0.02})
    footer = render.footer(stats).plain
    assert "2 rounds" in footer and "acceptance 62.5%" in footer and "mean accepted length 3.50" in footer
    assert "per position ▕" in footer and "1:100%  2:50%  3:50%  4:50%" in footer
