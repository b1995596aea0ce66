"""The live view of `specgen generate`: on a terminal's stderr, in colour, with the footer, while stdout is
a terminal too; never in a pipe, and never while stdout is a pipe that may come back to the terminal.

The terminal is a pseudo-terminal (the pty module), so no tmux or `script` is needed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from cli_helpers import Screen, run_on_terminals, run_teed, subprocess_env, visible_text
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
    return subprocess_env(TERM="xterm-256color")


@pytest.fixture(scope="module")
def reference(command):
    """The greedy text of `command`, from --format json with both streams on pipes."""
    proc = subprocess.run([*command, "--format", "json", "-q"], capture_output=True, env=environment(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["text"]


# The demo pair writes plain, Python-like text, which a terminal shows as it is.
DEMO = [sys.executable, "-m", "specgen.cli.main", "generate", "-n", "40", "--ignore-eos", "def add(a, b):"]
MOVES = re.compile(r"\x1b\[[0-9;?]*[A-HJKlh]|\r(?!\n)")  # cursor moves, erasing, a return that does not end a line


def test_live_view_on_a_terminal(command):
    code, out, err = run_on_terminals(command, stdout_tty=True, stderr_tty=True, env=environment())
    assert code == 0, err.decode(errors="replace")
    text = err.decode("utf-8", errors="replace")
    assert "\x1b[32m" in text  # green: accepted tokens (and the legend)
    assert "\x1b[33m" in text  # yellow: recovered tokens
    for word in FOOTER:
        assert word in text
    assert "■ accepted" in text and "■ recovered" in text and "■ bonus" in text
    assert "loading the models" in text  # the status line while models load
    assert b"\x1b[32m" in out  # the text, printed once in colour when the view ends


def test_a_pipe_back_to_the_terminal_keeps_every_line_on_screen():
    """`specgen generate ... | tee out.txt` in a terminal: tee prints the text on the terminal that
    stderr draws on. No live view then, so nothing wipes tee's lines: the whole text stays on
    screen, in order, with the summary once (below it, unless tee's last lines were still on
    their way)."""
    code, shown = run_teed(DEMO, env=environment())
    text = shown.decode("utf-8", errors="replace")
    assert code == 0, text
    assert not MOVES.search(after_status(text)) and "per position" not in text and "■" not in text
    lines = Screen().feed(text).lines()
    plain = visible_text(subprocess.run([*DEMO, "-q"], capture_output=True, text=True, env=environment(),
                                        timeout=300).stdout)
    # tee writes the text as it reads it, so its last lines may reach the terminal after stderr's
    # summary line (a real tee races the same way): the summary is one line, wherever it landed,
    # and every line of the text is on screen in order around it
    screen = visible_text("".join(lines))
    at = screen.find("40tokensin")
    assert plain and at >= 0 and screen.count("40tokensin") == 1, screen
    summary = len(screen) - len(plain)  # the summary's length: the text is the rest, whole and in order
    assert summary > len("40tokensin") and screen[:at] + screen[at + summary:] == plain


def after_status(stderr: str) -> str:
    """What a terminal got after the start-up's status line ended, erasing its own line; the status
    must be the only display that hid the cursor."""
    assert stderr.count("\x1b[?25l") == 1, stderr
    return stderr.rpartition("\x1b[?25h")[2].removeprefix("\r\x1b[1A\x1b[2K")


@pytest.mark.parametrize("stdout_tty, stderr_tty", [(True, True), (False, True), (True, False), (False, False)],
                         ids=["both terminals", "stdout piped", "stderr piped", "both piped"])
def test_stdout_gets_the_whole_text_whichever_stream_is_a_terminal(command, reference, stdout_tty, stderr_tty):
    """`specgen generate > out.txt` from a terminal: the live view on stderr must not take stdout's text."""
    code, out, err = run_on_terminals(command, stdout_tty=stdout_tty, stderr_tty=stderr_tty, env=environment())
    assert code == 0, err.decode(errors="replace")
    out_text, err_text = out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace")
    if stdout_tty:
        assert visible_text(out_text) == visible_text(reference)
    else:  # a pipe gets the exact text, plain, and one newline
        assert out_text == reference + "\n"
    assert "\x1b[" not in err_text or stderr_tty
    if stderr_tty and stdout_tty:
        assert "■ accepted" in err_text and "per position" in err_text  # the live view ran
    elif stderr_tty:  # stdout may be read back onto this terminal: at most the start-up's one line
        assert not MOVES.search(after_status(err_text)) and "■" not in err_text
        assert after_status(err_text).endswith(" s\x1b[0m\r\n") and "40 tokens in " in after_status(err_text)
    else:
        assert err_text.startswith("40 tokens in ") and err_text.count("\n") == 1  # only the summary line
        assert "■" not in err_text


def test_footer_content():
    stats = AcceptanceStats()
    stats.add_round(4, 4, 5, {"draft": 0.01, "verify": 0.02})
    stats.add_round(4, 1, 2, {"draft": 0.01, "verify": 0.02})
    footer = render.footer(stats).plain
    assert "2 rounds" in footer and "acceptance 62.5%" in footer and "mean accepted length 3.50" in footer
    assert "per position ▕" in footer and "1:100%  2:50%  3:50%  4:50%" in footer
    assert "tree" not in footer  # a chain's rounds


def test_footer_says_what_a_token_tree_bought():
    """Tree rounds (the accepted nodes' sibling indices): tokens per round over the chain inside the
    tree (its first children: min(leading zeros + 1, tokens) per round), and per depth the share of
    the paths reaching it through another child."""
    stats = AcceptanceStats()
    stats.add_round(3, 3, 4, {}, ranks=[0, 1, 0])  # the chain would have stopped at depth 2: 2 tokens
    stats.add_round(3, 1, 2, {}, ranks=[0])  # the chain's own path: 2 tokens
    stats.add_round(3, 2, 2, {}, ranks=[2, 0])  # ends on a draw outside the tree: the chain 1
    assert (stats.tree_emitted, stats.chain_emitted, stats.chain_at, stats.branch_at) == (8, 5, [2, 0, 0], [1, 1, 0])
    footer = render.footer(stats).plain
    assert footer.splitlines()[-1] == "tree +1.00 tok/round over its chain, branch wins at depth 1..3: 33% 50% 0%"


def test_footer_gives_a_hybrid_trees_lookup_share():
    """Hybrid tree rounds (whose nodes the accepted path took, the lookup's node count): the same
    line ends with the lookup's share of the accepted tokens."""
    stats = AcceptanceStats()
    stats.add_round(3, 3, 4, {}, ranks=[0, 0, 0], source=("lookup", 5))
    stats.add_round(3, 1, 2, {}, ranks=[1], source=("model", 5))  # the lookup's trie lost to the model
    stats.add_round(3, 2, 3, {}, ranks=[0, 0], source=("model", 0))  # the model's tree alone
    stats.add_round(3, 0, 1, {}, ranks=[], source=("none", 0))
    assert (stats.source_rounds, stats.merged_rounds, stats.lookup_paths, stats.model_paths) == (4, 2, 1, 2)
    assert (stats.lookup_accepted, stats.model_accepted, stats.lookup_at) == (3, 3, [1, 1, 1])
    footer = render.footer(stats).plain
    assert footer.splitlines()[-1].endswith("branch wins at depth 1..3: 33% 0% 0%, lookup 50% of accepted")


def test_a_dumb_terminal_gets_plain_streaming(command, reference):
    env = environment() | {"TERM": "dumb"}
    code, out, err = run_on_terminals(command, stdout_tty=False, stderr_tty=True, env=env)
    assert code == 0
    assert out.decode("utf-8", errors="replace") == reference + "\n"
    err_text = err.decode("utf-8", errors="replace")
    assert err_text.startswith("40 tokens in ") and err_text.count("\n") == 1, err_text  # no view, no status


def test_fates_stay_apart_without_colour(monkeypatch):
    import io

    from rich.console import Console

    monkeypatch.setenv("NO_COLOR", "1")
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, no_color=True, width=100)
    console.print(render.coloured(["acc", "rec", "bon"], ["accepted", "recovered", "bonus"]))
    console.print(render.legend())
    text = out.getvalue()
    assert text.startswith("acc\x1b[4mrec\x1b[0m\x1b[1mbon")  # accepted plain, recovered underlined, bonus bold
    assert "\x1b[4mrecovered" in text and "\x1b[1mbonus" in text and "■" not in text
    assert not any(f"[{c}m" in text or f";{c}m" in text for c in (32, 33, 36))  # no colour


def test_the_start_up_status_stays_on_one_line():
    """A status redrawn in place climbs over the line above it if it wraps: it is cut to the width."""
    capture = "capturing CUDA graphs 3/12: target step k=4 rows 5 " * 3
    assert render.one_line(capture, 40) == capture[:39] + "…"
    assert render.one_line("loading the models…", 40) == "loading the models…"
