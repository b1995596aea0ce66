"""Prompts from the command line, stdin or a prompts file, each knowing where it came from.

A prompts file has one prompt per line, or JSONL with a string field "prompt" and, for `generate`,
the prompt's own values of some [sampling] keys (core/profile.py's PROMPT_SETTINGS). Lines end at "\n"
only (a trailing "\r" is dropped): a form feed or U+2028 inside a prompt is part of the prompt, so
specgen's own JSONL output, which JSON writes with such characters raw, reads back as it was written.

A prompts file is read a line at a time, as often as a run goes over it (generate checks every line
before the models load, every prompt against the context before anything generates, then feeds the
prompts to the loop as it takes them): memory holds a line, not the file. A file that can be read
only once (a pipe, /dev/stdin) is read whole into memory first, as every file was before.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Iterator

from specgen.core.errors import UsageError

# Far above any model's context in text (a million tokens is a few MiB), low enough that
# `< /dev/zero` or a wrong file stops at once instead of filling memory: a prompt (stdin, a line of a
# file) and a file that is read whole (a pipe).
STDIN_LIMIT = 32 * 2**20
FILE_LIMIT = 256 * 2**20


@dataclass(frozen=True)
class Prompt:
    text: str
    source: str | None = None  # "FILE:LINE" for a line of a prompts file; None for the argument or stdin
    settings: dict = field(default_factory=dict)  # the line's own [sampling] values, validated

    def locate(self, message: str) -> str:
        return f"{self.source}: {message}" if self.source else message


def read(prompt: str | None, prompts_file: Path | None) -> list[Prompt]:
    """The prompt argument ('-' or None: stdin), or every prompt of the file; none of them empty."""
    return list(source(prompt, prompts_file))


def source(prompt: str | None, prompts_file: Path | None) -> list[Prompt] | PromptsFile:
    """The prompt argument ('-' or None: stdin), or the file's prompts, read each time they are
    iterated; each checked as it is read (the file's whole once: an empty file is refused here)."""
    if prompts_file is not None:
        if prompt is not None:
            raise UsageError("give a prompt or --prompts-file, not both")
        prompts = PromptsFile(prompts_file)
        if not any(True for _ in prompts):
            raise UsageError(f"prompts file {prompts_file} has no prompts")
        return prompts
    text = read_stdin() if prompt in (None, "-") else prompt
    if not text.strip():
        raise UsageError("the prompt is empty", hint="give a prompt as an argument or on stdin")
    return [Prompt(text)]


def read_stdin() -> str:
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("no prompt given", hint='pass one as an argument (specgen generate "def f():") or on stdin')
    data = sys.stdin.buffer.read(STDIN_LIMIT + 1)
    if len(data) > STDIN_LIMIT:
        raise UsageError(f"stdin holds more than {STDIN_LIMIT // 2**20} MiB, more than any prompt can use",
                         hint="check what is piped in; for many prompts use --prompts-file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"stdin is not valid UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start})",
                         hint="convert the prompt to UTF-8, e.g. with iconv") from None


def read_file(path: Path) -> list[Prompt]:
    """Every prompt of the file, at once (bench and inspect-acceptance run each several times)."""
    return read(None, path)


class PromptsFile:
    """The prompts of a file, each line read, decoded and checked as it is reached, every time the
    file is iterated."""

    def __init__(self, path: Path):
        self.path = path
        try:
            if path.is_dir():
                raise UsageError(f"prompts file {path} is a directory", hint="give a file with one prompt per line")
            self._whole = None if path.is_file() else _read_bounded(path)  # a pipe: it cannot be read again
        except OSError as exc:
            raise UsageError(f"cannot read prompts file {path}: {exc.strerror}") from None

    def __iter__(self) -> Iterator[Prompt]:
        try:
            file = self.path.open("rb") if self._whole is None else BytesIO(self._whole)
        except OSError as exc:
            raise UsageError(f"cannot read prompts file {self.path}: {exc.strerror}") from None
        with file:
            offset, number = 0, 0
            while raw := file.readline(STDIN_LIMIT + 1):
                number += 1
                if len(raw) > STDIN_LIMIT and not raw.endswith(b"\n"):
                    raise UsageError(f"{self.path}:{number}: the line holds more than {STDIN_LIMIT // 2**20} MiB, "
                                     "more than any prompt can use", hint="check that this is the prompts file")
                prompt = self._prompt(raw, number, offset)
                offset += len(raw)
                if prompt is not None:
                    yield prompt

    def _prompt(self, raw: bytes, number: int, offset: int) -> Prompt | None:
        """Line `number` (at byte `offset`) as a prompt; None for a blank line."""
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"prompts file {self.path} is not valid UTF-8 (offset {offset + exc.start})") from None
        line = line.removesuffix("\n").removesuffix("\r")  # files written on Windows
        if not line.strip():
            return None
        prompt = _json_prompt(self.path, number, line) if line.lstrip().startswith("{") else Prompt(
            line, f"{self.path}:{number}")
        if not prompt.text.strip():
            raise UsageError(f"the prompt is empty (line {number} of {self.path})",
                             hint="give a prompt as an argument or on stdin")
        return prompt


def _read_bounded(path: Path) -> bytes:
    with path.open("rb") as file:
        raw = file.read(FILE_LIMIT + 1)
    if len(raw) > FILE_LIMIT:
        raise UsageError(f"prompts file {path} is larger than {FILE_LIMIT // 2**20} MiB",
                         hint="split it into several files")
    return raw


def _json_prompt(path: Path, number: int, line: str) -> Prompt:
    from specgen.core.profile import prompt_settings

    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise UsageError(f"{path}:{number}: a JSON line needs a string field 'prompt'")
    where = f"{path}:{number}"
    return Prompt(record["prompt"], where, prompt_settings(record, where))


def without_settings(prompts: list[Prompt], command: str) -> list[Prompt]:
    """Refuse prompts that carry their own settings where a command sets them for every prompt."""
    for prompt in prompts:
        if prompt.settings:
            names = ", ".join(f'"{name}"' for name in prompt.settings)
            raise UsageError(f"{prompt.source}: {command} runs every prompt with the same settings; this line sets {names}",
                             hint=f"remove them from the file for {command}, or run specgen generate with it")
    return prompts


def fitting(prompts: list[Prompt], encode, check, *, skip_long: bool, warn) -> list[tuple[Prompt, list[int]]]:
    """Each prompt with its token ids, checked against the context before anything generates.

    encode(prompt) -> ids (truncated if the user asked); check(prompt, ids) raises UsageError when
    they do not fit (prompt None: the run's own settings). A prompt of a file that does not fit
    stops the run with its file:line, or with skip_long is left out after warn(line) (None:
    silently). Settings that leave room for no prompt at all stop it either way.
    """
    check(None, [0])  # a one-token prompt: fails only when max_tokens and k leave no room for any prompt
    jobs = list(checked(prompts, encode, check, skip_long=skip_long, warn=warn))
    if not jobs:
        raise UsageError(EVERY_PROMPT_TOO_LONG, hint="shorten them or lower --max-tokens")
    return jobs


EVERY_PROMPT_TOO_LONG = "every prompt is too long for the model's context"


def checked(prompts, encode, check, *, skip_long: bool, warn) -> Iterator[tuple[Prompt, object]]:
    """fitting's prompts one at a time, as they are read: (prompt, encode(prompt)) for each that
    check(prompt, encode(prompt)) lets through, and for no other."""
    for prompt in prompts:
        encoded = encode(prompt)
        try:
            check(prompt, encoded)
        except UsageError as exc:
            if prompt.source is None:
                raise
            if not skip_long:
                hint = "; ".join(filter(None, [exc.hint, "or --skip-long-prompts to go on without such prompts"]))
                raise UsageError(prompt.locate(exc.message), hint=hint) from None
            if warn is not None:
                warn(f"specgen: warning: skipped {prompt.locate(exc.message)}")
            continue
        yield prompt, encoded


def prompt_ids(engine, settings, text: str, chat: bool, system: str | None, truncate: bool) -> list[int]:
    """A prompt's ids: plain, or in the chat template (--system implies --chat); with truncate
    (--truncate-prompt), the end that leaves room for settings' max_tokens and k."""
    ids = encode_prompt(engine, text, chat, system)
    if truncate:
        from specgen.core.models.context import keep_end

        ids = keep_end(ids, settings.sampling.max_tokens, settings.speculation.k, engine.max_context)
    return ids


def encode_prompt(engine, text: str, chat: bool, system: str | None = None) -> list[int]:
    """engine.encode, with a chat template that fails (Jinja's sandbox refusing it, a syntax error)
    reported as the checkpoint's problem."""
    if not chat and system is None:  # --system implies --chat
        return engine.encode(text)
    from jinja2 import TemplateError  # only here: a plain prompt need not wait for its import

    from specgen.core.models.chat import chat_ids
    from specgen.core.errors import ModelError

    try:
        return chat_ids(engine.tokenizer, text, system)
    except TemplateError as exc:
        folder = getattr(engine.tokenizer, "name_or_path", "") or "the target"
        raise ModelError(f"the chat template of {folder} failed: {type(exc).__name__}: {exc}",
                         hint="fix the template (in tokenizer_config.json or chat_template.jinja), "
                              "or drop --chat") from None
