"""specgen in shell pipelines and long runs: `| head`, Ctrl-C, JSONL in and out, flat memory."""

from __future__ import annotations

import gc
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from cli_helpers import Stream, assert_error, count_forwards, specgen, subprocess_env
from tiny_models import build_pair, write_profile

CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # styles and cursor moves of a terminal
# the decode rate needs a round after the first; start-up ends the first prompt's line
# "(interrupted)" after the counts when Ctrl-C ended the run
SUMMARY = re.compile(r"^(\d+) tokens in (\d+) rounds( \(interrupted\))?, first token \d+ ms(?:, then [\d.]+ tok/s)?, acceptance [^,]+, "
                     r"mean accepted length [\d.]+(?:; load [\d.]+ s, setup [\d.]+ s)?$")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipelines")
    target, draft = build_pair(root, noisy=0.1)
    profile = write_profile(root / "tiny.toml", target, draft, sampling={"max_tokens": 12, "ignore_eos": True})
    return SimpleNamespace(root=root, profile=profile)


def command() -> list[str]:
    """The console script when installed, else the module: both are how people run specgen."""
    script = shutil.which("specgen")
    return [script] if script else [sys.executable, "-m", "specgen.cli.main"]


# ---------------------------------------------------------------- real processes


def test_head_closing_the_pipe_ends_specgen_quietly(tiny, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("def add(a, b):\n")
    err = tmp_path / "stderr.txt"
    generate = [*command(), "generate", "-p", str(tiny.profile), "-n", "480", "-"]
    script = (f"set -o pipefail; {shlex.join(generate)} < {shlex.quote(str(prompt))} 2> {shlex.quote(str(err))}"
              " | head -c 100")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, env=subprocess_env(), timeout=300)
    assert len(proc.stdout) == 100
    # pipefail: the status is specgen's. Its stderr is empty: no BrokenPipeError traceback, no
    # "Exception ignored" at exit, and no summary either, since the pipe broke long before 480 tokens.
    assert proc.returncode == 0, err.read_text()
    assert err.read_text() == ""


def shell(tiny, tmp_path, script: str) -> subprocess.CompletedProcess:
    """Run a bash script in which $SPECGEN is the command and $PROFILE the tiny profile."""
    env = subprocess_env(SPECGEN=shlex.join(command()), PROFILE=str(tiny.profile))
    return subprocess.run(["bash", "-c", "set -o pipefail; " + script], capture_output=True, env=env, cwd=tmp_path,
                          timeout=300)


@pytest.mark.parametrize("script", [
    "$SPECGEN generate --help | head -c 5",
    "$SPECGEN --help | head -c 5",
    "$SPECGEN inspect-acceptance -p $PROFILE -n 40 'def f():' | head -n 1",
], ids=["generate --help", "--help", "inspect-acceptance report"])
def test_head_ends_help_and_reports_quietly(tiny, tmp_path, script):
    proc = shell(tiny, tmp_path, script)
    assert (proc.returncode, proc.stderr) == (0, b"") and proc.stdout


@pytest.mark.parametrize("redirect, code, out, err", [
    ("2>&-", 0, "text", ""),
    ("2>/dev/full", 0, "text", ""),
    ("2>&- -p missing.toml", 2, "", ""),  # the error has nowhere to go, and must not go to stdout
    (">&-", 2, "", "specgen: error: stdout is closed: there is nowhere to write the results\n"
                   "hint: redirect it to a file, or to /dev/null to discard them\n"),
    (">/dev/full", 1, "", "specgen: error: cannot write the results to stdout: No space left on device\n"
                          "hint: make room where stdout goes, or redirect it elsewhere\n"),
], ids=["stderr closed", "stderr full", "stderr closed, an error", "stdout closed", "stdout full"])
def test_closed_or_full_streams(tiny, tmp_path, redirect, code, out, err):
    proc = shell(tiny, tmp_path, f"$SPECGEN generate -p $PROFILE -n 6 'def f():' {redirect}")
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.decode() == err
    if out:
        reference = shell(tiny, tmp_path, "$SPECGEN generate -p $PROFILE -n 6 -q 'def f():'")
        assert proc.stdout == reference.stdout and reference.stdout.strip()
    else:
        assert proc.stdout == b""


def test_ctrl_c_flushes_the_text_prints_partial_stats_and_exits_130(tiny):
    args = [*command(), "generate", "-p", str(tiny.profile), "-n", "480", "def add(a, b):"]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=subprocess_env())
    ready, _, _ = select.select([proc.stdout], [], [], 240)  # generation has started: text is streaming
    assert ready, "no output from specgen"
    first = os.read(proc.stdout.fileno(), 1)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    out = (first + rest).decode("utf-8", errors="replace")
    assert proc.returncode == 130, err
    assert out.endswith("\n") and out.strip()
    lines = err.decode().splitlines()
    assert len(lines) == 1 and "Traceback" not in err.decode(), err
    tokens = SUMMARY.match(lines[0])
    assert tokens and 0 < int(tokens.group(1)) < 480 and tokens.group(3), lines


def test_ctrl_c_on_a_terminal_keeps_the_text_the_live_view_showed(monkeypatch, tiny):
    count_forwards(monkeypatch, interrupt_at=30)
    result = specgen(monkeypatch, "generate", "-p", tiny.profile, "-n", "100", "def add(a, b):", tty=True,
                     env={"TERM": "xterm-256color", "NO_COLOR": "1"})
    assert result.code == 130
    assert result.stdout.strip()  # printed once the transient view is gone
    summary = SUMMARY.match(CONTROL.sub("", result.stderr).splitlines()[-1])
    assert summary and 0 < int(summary.group(1)) < 100 and summary.group(3)


# Ctrl-C at the moment a module starts importing, in a real `specgen` process: an import hook sends
# the process SIGINT, as a terminal would.
INTERRUPT_AT_IMPORT = """
import os, signal, sys

MODULE = sys.argv.pop(1)

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupt())
from specgen.cli.main import main
main()
"""


@pytest.mark.parametrize("module", ["typer", "rich.console", "specgen.cli.errors", "torch", "tokenizers",
                                    "safetensors.torch"])
def test_ctrl_c_during_start_up_says_interrupted_and_exits_130(tiny, module):
    """From the Typer import (the first ~0.2 s) to torch and the loading of tokenizer and weights:
    never a traceback."""
    args = [sys.executable, "-c", INTERRUPT_AT_IMPORT, module, "generate", "-p", str(tiny.profile), "def f():"]
    proc = subprocess.run(args, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "specgen: interrupted\n")


def test_ctrl_c_while_loading_says_interrupted(monkeypatch, tiny):
    from specgen.core import engine

    def load_pair(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "load_pair", load_pair)
    result = specgen(monkeypatch, "generate", "-p", tiny.profile, "def add(a, b):")
    assert (result.code, result.stdout, result.stderr) == (130, "", "specgen: interrupted\n")


@pytest.mark.parametrize("output_format", ["json", "jsonl"])
def test_ctrl_c_writes_the_json_of_what_was_generated_marked_incomplete(monkeypatch, tiny, tmp_path, output_format):
    source = tmp_path / "prompts.txt"
    source.write_text("def add(a, b):\n")
    args = ["--prompts-file", source] if output_format == "jsonl" else ["def add(a, b):"]
    full = specgen(monkeypatch, "generate", "-p", tiny.profile, "-n", "100", "--format", output_format, "-q", *args)
    count_forwards(monkeypatch, interrupt_at=30)
    result = specgen(monkeypatch, "generate", "-p", tiny.profile, "-n", "100", "--format", output_format, *args)
    assert result.code == 130
    [record] = result.json_lines()
    [reference] = full.json_lines()
    assert record["incomplete"] is True and record["finish_reason"] == "interrupted" and "incomplete" not in reference
    generated = len(record["token_ids"])
    assert 0 < generated < 100 and record["token_ids"] == reference["token_ids"][:generated]
    assert reference["text"].startswith(record["text"]) and record["text"]
    assert len(record["fates"]) == len(record["token_ids"]) == record["stats"]["generated_tokens"]
    summary = SUMMARY.match(result.stderr.splitlines()[-1])
    assert summary and int(summary.group(1)) == len(record["token_ids"]) and summary.group(3)


# ---------------------------------------------------------------- JSONL


def test_jsonl_round_trip(monkeypatch, tiny, tmp_path):
    """JSONL in, JSONL out, one record per prompt in order; the output is itself a valid prompts file."""
    prompts = ["def add(a, b):", "class Point:", "héllo wörld ✓", "import os", "a\u2028b\x85c\x0cd"]
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": p, "id": i}) + "\n" for i, p in enumerate(prompts)))
    first = specgen(monkeypatch, "generate", "-p", tiny.profile, "--prompts-file", source, "--format", "jsonl")
    assert first.code == 0, first
    records = first.json_lines()
    assert [r["prompt"] for r in records] == prompts
    for record in records:
        assert record["finish_reason"] == "length" and len(record["token_ids"]) == 12
        single = specgen(monkeypatch, "generate", "-p", tiny.profile, "--format", "json", record["prompt"])
        assert single.json_lines()[0]["text"] == record["text"]
    assert len(first.stderr.splitlines()) == len(prompts)  # one summary line per prompt

    again = tmp_path / "results.jsonl"
    again.write_text(first.stdout)
    second = specgen(monkeypatch, "generate", "-p", tiny.profile, "--prompts-file", again, "--format", "jsonl")
    assert [r["text"] for r in second.json_lines()] == [r["text"] for r in records]  # greedy: the same


def test_a_prompts_files_line_may_carry_its_own_settings(monkeypatch, tiny, tmp_path):
    """Each line's own max_tokens, temperature, seed and stop apply to its prompt alone: its record
    is the one a single run with those options gives; a line without any keeps the profile's."""
    lines = [{"prompt": "def add(a, b):", "max_tokens": 3},
             {"prompt": "class Point:", "temperature": 0.7, "seed": 3, "max_tokens": 6, "top_p": 0.9},
             {"prompt": "import os"}]
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = specgen(monkeypatch, "generate", "-p", tiny.profile, "--prompts-file", source, "--format", "jsonl")
    assert result.code == 0, result
    records = result.json_lines()
    assert [len(r["token_ids"]) for r in records] == [3, 6, 12]
    alone = [("-n", "3"), ("-t", "0.7", "--seed", "3", "-n", "6", "--top-p", "0.9"), ()]
    for record, options in zip(records, alone):
        single = specgen(monkeypatch, "generate", "-p", tiny.profile, "--format", "json", *options, record["prompt"])
        assert single.json_lines()[0]["token_ids"] == record["token_ids"]


@pytest.mark.parametrize("line, message", [
    ({"prompt": "x", "temperature": 1e300}, ':2: "temperature": 1e+300 is not allowed: must be from 0 (greedy) to 100'),
    ({"prompt": "x", "top_k": "3"}, ':2: "top_k": "3" is a string; expected an integer'),
    ({"prompt": "x", "stop": ["a", ""]}, ':2: "stop": ["a", ""] is not allowed: must not contain an empty string'),
])
def test_a_wrong_setting_of_a_line_names_the_line(monkeypatch, tiny, tmp_path, line, message):
    source = tmp_path / "prompts.jsonl"
    source.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps(line) + "\n")
    result = specgen(monkeypatch, "generate", "-p", tiny.profile, "--prompts-file", source, "--format", "jsonl")
    assert_error(result, 2, f"{source}{message}")


def test_settings_of_a_line_that_contradict_the_profile_or_the_command(monkeypatch, tiny, tmp_path):
    source = tmp_path / "prompts.jsonl"
    source.write_text(json.dumps({"prompt": "x", "max_tokens": 4}) + "\n")
    result = specgen(monkeypatch, "generate", "-p", tiny.profile, "--min-tokens", "8", "--prompts-file", source,
                     "--format", "jsonl")
    assert_error(result, 2, f"{source}:1: \"max_tokens\": 4 is below the profile's min_tokens (8)")
    for command in ("bench", "inspect-acceptance"):
        result = specgen(monkeypatch, command, "-p", tiny.profile, "--prompts-file", source)
        assert_error(result, 2, f"{source}:1: {command} runs every prompt with the same settings; this line sets "
                                '"max_tokens"')


class Recording(Stream):
    """stdout that logs what was written and when it was flushed."""

    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def write(self, text: str) -> int:
        self.log.append(("write", text))
        return super().write(text)

    def flush(self) -> None:
        self.log.append(("flush", None))
        super().flush()


def test_jsonl_streams_each_result_as_it_completes(monkeypatch, tiny, tmp_path):
    from specgen.core.engine import Engine

    log: list = []
    real_decoder = Engine.decoder

    def decoder(self, *args, **kwargs):  # a prompt starts when a decoder runs it
        built = real_decoder(self, *args, **kwargs)
        real_run = built.run

        def run(ids):
            log.append(("next prompt", None))
            return real_run(ids)

        built.run = run
        return built

    monkeypatch.setattr(Engine, "decoder", decoder)
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"x = {i}"}) + "\n" for i in range(3)))
    result = specgen(monkeypatch, "generate", "-p", tiny.profile, "--prompts-file", source, "--format", "jsonl",
                     "-q", stdout=Recording(log))
    assert result.code == 0 and len(result.json_lines()) == 3
    pending, flushed, started = "", "", 0
    for what, text in log:
        if what == "write":
            pending += text
        elif what == "flush":
            flushed, pending = flushed + pending, ""
        else:  # before each prompt starts, every earlier result is out of the process as a whole line
            assert flushed.count("\n") == started and flushed.endswith("\n") == bool(started), log
            started += 1


# ---------------------------------------------------------------- long runs


def _resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _live(kind: type) -> int:
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), kind))  # type(): no lazy attributes


RSS_BOUND_MIB = 10  # measured: +3 MiB from 100 to 1,000 generations (allocator warm-up, then flat)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc")
def test_memory_stays_flat_over_1000_generations(tiny):
    """1,000 short generations on one engine, as bench runs them: caches and decoders of finished runs
    are dropped (no DynamicCache or tensor survives its run) and resident memory stays flat."""
    from transformers import DynamicCache

    from specgen.core.engine import Engine
    from specgen.core.profile import load_profile

    torch.set_num_threads(1)  # 64-wide matrices: threads only add waiting
    engine = Engine(load_profile(str(tiny.profile), {"sampling.max_tokens": 4}))
    ids = engine.encode("def add(a, b):")

    def generate(count: int) -> None:
        for _ in range(count):
            *_, finished = engine.decoder().run(ids)
            assert len(finished.token_ids) == 4

    generate(100)
    gc.collect()
    rss, caches, tensors = _resident_mib(), _live(DynamicCache), _live(torch.Tensor)
    generate(900)
    gc.collect()
    assert _live(DynamicCache) == caches <= 2  # one per runner, replaced at each run's start
    assert _live(torch.Tensor) <= tensors  # none survives its run (an earlier test's may die meanwhile)
    assert _resident_mib() - rss < RSS_BOUND_MIB
