"""`specgen generate`: stream a speculative generation for one prompt or a file of prompts."""

from __future__ import annotations

import contextlib
import enum
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specgen.cli import options as opt


class Format(str, enum.Enum):
    text = "text"
    json = "json"
    jsonl = "jsonl"


def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="Prompt text; '-' or nothing reads stdin.")] = None,
    profile: opt.Profile = None,
    target: opt.Target = None,
    draft: opt.Draft = None,
    proposer: opt.Proposer = None,
    k: opt.K = None,
    draft_p_min: opt.DraftPMin = None,
    adaptive_k: opt.AdaptiveK = None,
    temperature: opt.Temperature = None,
    top_p: opt.TopP = None,
    top_k: opt.TopK = None,
    min_p: opt.MinP = None,
    repetition_penalty: opt.RepetitionPenalty = None,
    presence_penalty: opt.PresencePenalty = None,
    frequency_penalty: opt.FrequencyPenalty = None,
    seed: opt.Seed = None,
    max_tokens: opt.MaxTokens = None,
    min_tokens: opt.MinTokens = None,
    stop: opt.Stop = None,
    stop_token_id: opt.StopTokenId = None,
    ignore_eos: opt.IgnoreEos = None,
    dtype: opt.Dtype = None,
    device: opt.Device = None,
    compile: opt.Compile = None,
    autotune: opt.Autotune = None,
    logprobs: opt.Logprobs = None,
    chat: opt.Chat = False,
    system: opt.System = None,
    output_format: Annotated[Format, typer.Option("--format", "-f", help="text | json | jsonl.")] = Format.text,
    prompts_file: opt.PromptsFile = None,
    prompts: opt.PromptsAlias = None,
    truncate_prompt: opt.TruncatePrompt = False,
    live: Annotated[bool, typer.Option("--live/--no-live", help="Live view on stderr (only on a terminal).")] = True,
    quiet: opt.Quiet = False,
    threads: opt.Threads = None,
    trust_remote_code: opt.TrustRemoteCode = False,
    allow_pickle: opt.AllowPickle = False,
) -> None:
    """Generate text; stdout gets only the text (or JSON), stderr the live view and statistics."""
    from specgen.core.profile import load_profile

    texts = read_prompts(prompt, opt.prompts_path(prompts_file, prompts), output_format)
    settings = load_profile(profile, opt.overrides(**locals()))
    opt.warn_settings(settings, quiet)
    from specgen.core.engine import Engine  # torch and transformers (seconds): only for valid input

    engine = Engine(settings, allow_pickle=allow_pickle, progress=None if quiet else startup_progress)
    show_live = live and not quiet and sys.stderr.isatty() and output_format == Format.text
    for index, text in enumerate(texts):
        ids = encode(engine, text, chat, system)
        if truncate_prompt and engine.max_context:
            room = engine.max_context - settings.sampling.max_tokens - settings.speculation.k - 1
            ids = ids[-max(room, 1):]
        result = run_one(engine.decoder(), ids, output_format, show_live, quiet, separator=index > 0)
        emit_json(result, text, settings, output_format)


def encode(engine, text: str, chat: bool, system: str | None) -> list[int]:
    """A prompt's ids: plain, or in the chat template (--system implies --chat)."""
    from specgen.core.chat import chat_ids

    if chat or system is not None:
        return chat_ids(engine.tokenizer, text, system)
    return engine.encode(text)


def startup_progress(done: int, total: int, what: str) -> None:
    """CUDA graph capture (and compilation) at start-up: one line on stderr, rewritten in place."""
    end = "\n" if done == total else ""
    sys.stderr.write(f"\r\033[Kcapturing CUDA graphs {done}/{total}: {what}{end}" if sys.stderr.isatty()
                     else (f"capturing CUDA graphs: {what}\n" if done == total else ""))
    sys.stderr.flush()


def read_prompts(prompt: str | None, prompts_file: Path | None, output_format: Format) -> list[str]:
    from specgen.core.errors import UsageError

    if prompts_file is not None:
        if prompt is not None:
            raise UsageError("give a prompt or --prompts-file, not both")
        prompts = _read_prompts_file(prompts_file)
    else:
        if output_format == Format.jsonl:
            raise UsageError("--format jsonl needs --prompts-file", hint="use --format json for a single prompt")
        prompts = [_read_stdin() if prompt in (None, "-") else prompt]
    for i, text in enumerate(prompts):
        if not text.strip():
            where = f" (line {i + 1} of {prompts_file})" if prompts_file else ""
            raise UsageError(f"the prompt is empty{where}", hint="give a prompt as an argument or on stdin")
    if output_format == Format.json and len(prompts) > 1:
        raise UsageError("--format json takes one prompt", hint="use --format jsonl with --prompts-file")
    return prompts


def _read_stdin() -> str:
    from specgen.core.errors import UsageError

    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("no prompt given", hint='pass one as an argument (specgen generate "def f():") or on stdin')
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"stdin is not valid UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start})",
                         hint="convert the prompt to UTF-8, e.g. with iconv") from None


def _read_prompts_file(path: Path) -> list[str]:
    from specgen.core.errors import UsageError

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read prompts file {path}: {exc.strerror}") from None
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise UsageError(f"prompts file {path} is not valid UTF-8 (offset {exc.start})") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise UsageError(f"{path}:{number}: a JSON line needs a string field 'prompt'")
            prompts.append(record["prompt"])
        else:
            prompts.append(line)
    if not prompts:
        raise UsageError(f"prompts file {path} has no prompts")
    return prompts


def run_one(decoder, ids: list[int], output_format: Format, show_live: bool, quiet: bool, separator: bool):
    """Run one generation, streaming as the format allows; returns the Finished event."""
    from specgen.cli import render
    from specgen.core.decode import Finished

    stream = output_format == Format.text and not (show_live and sys.stdout.isatty())
    if stream and separator:
        sys.stdout.write("\n")
    view = render.LiveView() if show_live else None
    try:
        finished = _drive(decoder, ids, view, stream, Finished)
    except KeyboardInterrupt:
        if stream:
            sys.stdout.write("\n")
            sys.stdout.flush()
        elif view is not None and output_format == Format.text:
            _print_text(view.text)  # the live view was transient: keep what was generated
        if not quiet:
            render.summary(decoder.stats)
        raise typer.Exit(130) from None
    if stream:
        sys.stdout.write(finished.tail + "\n")
        sys.stdout.flush()
    elif output_format == Format.text:
        _print_final(finished)
    if not quiet:
        render.summary(finished.stats)
    return finished


def _drive(decoder, ids, view, stream: bool, finished_type):
    with view if view is not None else contextlib.nullcontext():
        for event in decoder.run(ids):
            if isinstance(event, finished_type):
                return event
            if view is not None:
                view.update(event, decoder.stats)
            if stream and event.text:
                sys.stdout.write(event.text)
                sys.stdout.flush()
    raise AssertionError("the decode loop ended without a Finished event")


def _print_final(finished) -> None:
    """After a transient live view on a terminal stdout: the text once, coloured by fate."""
    from specgen.cli import render

    text = render.coloured(finished.pieces, [f.value for f in finished.fates], len(finished.text))
    text.append(finished.text[len(text.plain):])  # bytes completed only at the end have no fate of their own
    _print_text(text)


def _print_text(text) -> None:
    from rich.console import Console

    from specgen.cli import render

    Console(no_color=render.no_color(), highlight=False, soft_wrap=True).print(text)


def emit_json(finished, prompt: str, settings, output_format: Format) -> None:
    if output_format == Format.text:
        return
    record = {
        "prompt": prompt,
        "text": finished.text,
        "finish_reason": finished.reason,
        "token_ids": finished.token_ids,
        "fates": [f.value for f in finished.fates],
        "profile": settings.name,
        "stats": finished.stats.as_dict(),
    }
    if finished.logprobs is not None:
        record["logprobs"] = finished.logprobs
    sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    sys.stdout.flush()
