"""Prompts from the command line, stdin or a prompts file, each knowing where it came from.

A prompts file has one prompt per line, or JSONL with a string field "prompt" and, for `generate`,
the prompt's own values of some [sampling] keys (core/profile.py's PROMPT_SETTINGS). Lines end at "\n"
only (a trailing "\r" is dropped): a form feed or U+2028 inside a prompt is part of the prompt, so
specgen's own JSONL output, which JSON writes with such characters raw, reads back as it was written.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specgen.core.errors import UsageError

# Far above any model's context in text (a million tokens is a few MiB), low enough that
# `< /dev/zero` or a wrong file stops at once instead of filling memory.
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
    if prompts_file is not None:
        if prompt is not None:
            raise UsageError("give a prompt or --prompts-file, not both")
        prompts = read_file(prompts_file)
    else:
        prompts = [Prompt(read_stdin() if prompt in (None, "-") else prompt)]
    for p in prompts:
        if not p.text.strip():
            where = f" (line {p.source.rsplit(':', 1)[1]} of {prompts_file})" if p.source else ""
            raise UsageError(f"the prompt is empty{where}", hint="give a prompt as an argument or on stdin")
    return prompts


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
    raw = _read_bounded(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"prompts file {path} is not valid UTF-8 (offset {exc.start})") from None
    prompts = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")  # files written on Windows
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            prompts.append(_json_prompt(path, number, line))
        else:
            prompts.append(Prompt(line, f"{path}:{number}"))
    if not prompts:
        raise UsageError(f"prompts file {path} has no prompts")
    return prompts


def _read_bounded(path: Path) -> bytes:
    try:
        if path.is_dir():
            raise UsageError(f"prompts file {path} is a directory", hint="give a file with one prompt per line")
        with path.open("rb") as file:
            raw = file.read(FILE_LIMIT + 1)
    except OSError as exc:
        raise UsageError(f"cannot read prompts file {path}: {exc.strerror}") from None
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
    jobs = []
    for prompt in prompts:
        ids = encode(prompt)
        try:
            check(prompt, ids)
        except UsageError as exc:
            if prompt.source is None:
                raise
            if not skip_long:
                hint = "; ".join(filter(None, [exc.hint, "or --skip-long-prompts to go on without such prompts"]))
                raise UsageError(prompt.locate(exc.message), hint=hint) from None
            if warn is not None:
                warn(f"specgen: warning: skipped {prompt.locate(exc.message)}")
            continue
        jobs.append((prompt, ids))
    if not jobs:
        raise UsageError("every prompt is too long for the model's context", hint="shorten them or lower --max-tokens")
    return jobs


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
