"""Showing a generation: the live view on stderr, plain text or JSON on stdout.

stdout carries results only. The live view (tokens coloured by fate, a footer with the acceptance
statistics) goes to stderr, and only when stdout and stderr are both terminals; NO_COLOR turns
colours off.
"""

from __future__ import annotations

import contextlib
import os
import sys

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

FATE_STYLES = {"accepted": "green", "recovered": "yellow", "bonus": "cyan"}
# With NO_COLOR, Rich drops colours but keeps attributes: these keep the three fates apart.
PLAIN_FATE_STYLES = {"accepted": "none", "recovered": "underline", "bonus": "bold"}
BARS = " ▁▂▃▄▅▆▇█"


def no_color() -> bool:
    return "NO_COLOR" in os.environ


def fate_style(fate: str) -> str:
    return (PLAIN_FATE_STYLES if no_color() else FATE_STYLES).get(fate, "")


def stderr_console() -> Console:
    return Console(file=sys.stderr, no_color=no_color(), highlight=False, soft_wrap=True)


def can_draw(console: Console) -> bool:
    """A live view needs a terminal that moves the cursor: not a pipe, not TERM=dumb."""
    return console.is_terminal and not console.is_dumb_terminal


def can_draw_beside_stdout(console: Console) -> bool:
    """A view that redraws lines while the results stream also needs stdout on a terminal: stdout on
    a pipe may come back to the same terminal (`| tee out.txt`, `| cat`, `| head`), where each
    redraw would wipe the lines that the pipe's reader printed between two frames."""
    return can_draw(console) and sys.stdout.isatty()


def legend() -> Text:
    text = Text()
    for fate in FATE_STYLES:
        text.append(f"■ {fate}" if not no_color() else fate, style=fate_style(fate))
        text.append("  ")
    return text


@contextlib.contextmanager
def startup_status(enabled: bool):
    """While models load (and CUDA graphs capture): a status line on a terminal's stderr,
    transient; yields the progress(done, total, what) callback for Engine. Off a terminal, only the
    capture's last step is said, as one line."""
    console = stderr_console()
    if not enabled or not can_draw(console):
        yield _plain_progress if enabled else None
        return
    with console.status("loading the models…") as status:
        def progress(done: int, total: int, what: str) -> None:
            status.update(one_line(f"capturing CUDA graphs {done}/{total}: {what}", console.width - 2))

        yield progress


def one_line(line: str, width: int) -> str:
    """The line cut to `width` columns: a status redrawn in place must not wrap, or each redraw
    would climb over the line above it."""
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


def _plain_progress(done: int, total: int, what: str) -> None:
    if done == total:
        print(f"capturing CUDA graphs: {what}", file=sys.stderr)


def position_bars(rates: list[float]) -> str:
    return "".join(BARS[min(len(BARS) - 1, round(r * (len(BARS) - 1)))] for r in rates)


def footer(stats) -> Text:
    rate = stats.decode_tokens_per_second  # the final line's rate; none until a second round
    line = (
        f"{f'{rate:.1f}' if rate is not None else '–':>7} tok/s · {stats.rounds} rounds · acceptance {stats.acceptance_text:>5}"
        f" · mean accepted length {stats.mean_accepted_length:.2f}"
    )
    text = Text(line, style="bold")
    if stats.drafted_at:
        text.append(f"\nper position ▕{position_bars(stats.per_position)}▏")
        if len(stats.per_position) <= 8:  # percentages while they fit on the line
            text.append("  " + "  ".join(f"{i + 1}:{r:.0%}" for i, r in enumerate(stats.per_position)), style="dim")
    if stats.tree_rounds:  # what the token tree bought over the chain inside it (core/stats.py)
        text.append("\n" + stats.tree_line())
    return text


def coloured(pieces: list[str], fates: list[str], limit: int | None = None) -> Text:
    """Per-token text styled by fate; `limit` cuts it to the final text's length (stop strings)."""
    text = Text()
    for piece, fate in zip(pieces, fates):
        if limit is not None:
            piece = piece[: max(0, limit - len(text))]
        text.append(piece, style=fate_style(fate))
    return text


class LiveView:
    """Tokens stream in colour with a footer; transient, so the final text is printed once afterwards."""

    def __init__(self):
        self.console = stderr_console()
        self.text = Text()
        # Live would take sys.stdout over by default and print what is written there through the
        # view: stdout stays the results' own stream, written by the command alone.
        self.live = Live(console=self.console, transient=True, refresh_per_second=12, auto_refresh=True,
                         redirect_stdout=False)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        return self.live.__exit__(*exc)

    def update(self, event, stats) -> None:
        self.text.append_text(coloured(event.pieces, [f.value for f in event.fates]))
        below = footer(stats)
        self.live.update(Group(self._tail(len(below.plain.split("\n"))), Text(""), below, legend()))

    def _tail(self, footer_lines: int) -> Text:
        # the footer, a blank line, the legend and one line to spare
        room = max(3, self.console.size.height - footer_lines - 3)
        lines = self.text.split("\n", allow_blank=True)
        return Text("\n").join(lines[-room:])


def summary(stats, console: Console | None = None, label: str | None = None, startup=None,
            interrupted: bool = False) -> None:
    """One line on stderr at the end (off a terminal, or after the live view); label names the
    prompt when there are several; startup (cli/loading.Startup) ends it when given."""
    line = stats.summary_line(interrupted)
    line = f"{label}: {line}" if label else line
    if startup is not None:
        line += f"; {startup.text()}"
    (console or stderr_console()).print(line, style="dim", highlight=False, markup=False)
