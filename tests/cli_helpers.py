"""Running `specgen` in-process, with stdin, stdout and stderr of the test's choosing.

The command goes through cli/errors.run, like the console script, so exit codes and error lines are
the real ones. The streams can claim to be terminals, which capsys cannot.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import unicodedata
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
        return [json.loads(line) for line in self.stdout.split("\n") if line]  # JSON lines end at "\n" only


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


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh process (what it imports starts from nothing), output captured."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                          timeout=timeout)


def run_on_terminals(args: list[str], *, stdout_tty: bool, stderr_tty: bool, env: dict,
                     timeout: float = 300) -> tuple[int, bytes, bytes]:
    """Run a real process with stdout and stderr each on its own 100x24 pseudo-terminal or on a pipe,
    as chosen; returns (exit code, stdout bytes, stderr bytes). A terminal's bytes are as the terminal
    got them (CR LF line ends, escape sequences)."""
    ends = {}
    for name, tty in (("stdout", stdout_tty), ("stderr", stderr_tty)):
        if tty:
            leader, follower = pty.openpty()
            fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        else:
            leader, follower = os.pipe()
        ends[name] = (leader, follower)
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=ends["stdout"][1], stderr=ends["stderr"][1],
                            env=env)
    for _, follower in ends.values():
        os.close(follower)
    data, reading = {"stdout": b"", "stderr": b""}, {leader: name for name, (leader, _) in ends.items()}
    deadline = time.monotonic() + timeout
    while reading:
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{args} ran past {timeout} s")
        ready, _, _ = select.select(list(reading), [], [], 0.1)
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the process closed its side of the terminal
                chunk = b""
            if chunk:
                data[reading[fd]] += chunk
            else:
                os.close(fd)
                del reading[fd]
    return proc.wait(timeout=60), data["stdout"], data["stderr"]


def run_teed(args: list[str], *, env: dict, timeout: float = 300) -> tuple[int, bytes]:
    """Run a real process as `specgen ... | tee out.txt` runs in a terminal: stderr on a 100x24
    pseudo-terminal, stdout on a pipe whose reader writes what it reads back to that terminal as it
    arrives. Returns (exit code, every byte the terminal got, in order)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    pipe_out, pipe_in = os.pipe()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=pipe_in, stderr=follower, env=env)
    os.close(pipe_in)
    shown, deadline = b"", time.monotonic() + timeout
    piped = True
    while True:
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{args} ran past {timeout} s")
        ready, _, _ = select.select([leader] + ([pipe_out] if piped else []), [], [], 0.1)
        if pipe_out in ready:
            chunk = os.read(pipe_out, 65536)
            if chunk:
                os.write(follower, chunk)  # tee's copy, on the terminal stderr draws on
            else:
                piped = False
        if leader in ready:
            shown += os.read(leader, 65536)
        elif not piped and proc.poll() is not None:
            break
    os.close(pipe_out)
    os.close(follower)
    os.close(leader)
    return proc.wait(timeout=60), shown


CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


class Screen:
    """Just enough of a terminal to say what is left on it: characters, CR, LF, cursor up and erase
    in line (what Rich's live displays use); styles and the cursor's visibility change nothing that
    is read here. Any other control sequence is an error, so that the test cannot miss a move. The
    rows do not scroll away: what a real terminal scrolls off stays readable."""

    def __init__(self, width: int = 100):
        self.width, self.rows, self.row, self.col = width, [[]], 0, 0

    def feed(self, text: str) -> "Screen":
        at = 0
        while at < len(text):
            control = CSI.match(text, at)
            if control:
                self._control(*control.groups())
                at = control.end()
                continue
            self._char(text[at])
            at += 1
        return self

    def _char(self, char: str) -> None:
        if char == "\r":
            self.col = 0
        elif char == "\n":
            self._down()
        elif char == "\x1b":
            raise AssertionError("unexpected escape sequence")
        elif char == "\t":
            self.col = min(self.width, (self.col // 8 + 1) * 8)
        elif unicodedata.category(char) == "Cc":  # bell and the like: nothing to see
            pass
        else:
            if self.col >= self.width:
                self._down()
                self.col = 0
            line = self.rows[self.row]
            line.extend(" " * (self.col + 1 - len(line)))
            line[self.col] = char
            self.col += 1

    def _down(self) -> None:
        self.row += 1
        if self.row == len(self.rows):
            self.rows.append([])

    def _control(self, params: str, final: str) -> None:
        if final == "m" or (params.startswith("?") and final in "hl"):
            return
        if final == "A":
            self.row = max(0, self.row - int(params or 1))
        elif final == "K" and params in ("", "0"):
            del self.rows[self.row][self.col:]
        elif final == "K" and params == "2":
            self.rows[self.row] = []
        else:
            raise AssertionError(f"unexpected control sequence ESC[{params}{final}")

    def lines(self) -> list[str]:
        return ["".join(row).rstrip() for row in self.rows]


TERMINAL_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")  # styles, cursor moves, titles


def visible_text(text: str) -> str:
    """What a reader sees of some text: no escape sequences, control characters or white space, so that
    text shown by a terminal and the same text written to a pipe compare equal."""
    text = TERMINAL_CONTROL.sub("", text)
    return "".join(c for c in text if not c.isspace() and unicodedata.category(c) != "Cc")


def llama_classes() -> tuple:
    """(class, method) pairs that run Llama checkpoints: specgen's own model step (on the CPU and one
    GPU) and transformers' forward."""
    from transformers import LlamaForCausalLM

    from specgen.core.step.model import OwnedModel

    return (OwnedModel, "step"), (LlamaForCausalLM, "forward")


def wrap_forwards(monkeypatch, wrapper) -> None:
    """Replace each Llama class's step or forward by wrapper(real_method, self, *args, **kwargs)."""
    for cls, name in llama_classes():
        real = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, *a, real=real, **k: wrapper(real, self, *a, **k))


def count_forwards(monkeypatch, interrupt_at: int | None = None) -> list:
    """Counts the forwards of every Llama model (target and draft) in the returned list; with
    interrupt_at, forward number interrupt_at raises KeyboardInterrupt: Ctrl-C, simulated, wherever
    the loop happens to be."""
    calls = []

    def forward(real, self, *args, **kwargs):
        calls.append(1)
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    wrap_forwards(monkeypatch, forward)
    return calls


CHAT_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def add_chat_template(*folders) -> None:
    """Give the tokenizer saved in each checkpoint folder a small chat template."""
    from transformers import PreTrainedTokenizerFast

    for folder in folders:
        tok = PreTrainedTokenizerFast.from_pretrained(folder)
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(folder)


def option_names(command: str, hidden: bool = False) -> set[str]:
    """Every --name (and --no-name) of a specgen command ("" for specgen itself, "profiles show" for
    a subcommand), read from the Click command itself; --help, which every command has, left out."""
    import typer.main

    from specgen.cli.main import app

    cmd = typer.main.get_command(app)
    for word in command.split():
        cmd = cmd.commands[word]
    return {name for param in cmd.params if hidden or not getattr(param, "hidden", False)
            for name in (*param.opts, *param.secondary_opts) if name.startswith("--")}
