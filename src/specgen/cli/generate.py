"""`specgen generate`: stream a speculative generation for one prompt or a file of prompts."""

from __future__ import annotations

import contextlib
import enum
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from specgen.cli import options as opt
from specgen.cli import render
from specgen.cli.loading import start_engine
from specgen.cli.prompts import checked, prompt_ids, source


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
    head: opt.Head = None,
    k: opt.K = None,
    tree_width: opt.TreeWidth = None,
    tree_nodes: opt.TreeNodes = None,
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
    logprobs_mode: opt.LogprobsMode = None,
    coupling: opt.Coupling = None,
    chat: opt.Chat = False,
    system: opt.System = None,
    output_format: Annotated[Format, opt.output_option("--format", "-f", help="text | json | jsonl.")] = Format.text,
    prompts_file: opt.PromptsFile = None,
    prompts: opt.PromptsAlias = None,
    batch_size: opt.BatchSize = None,
    truncate_prompt: opt.TruncatePrompt = False,
    skip_long_prompts: Annotated[bool, opt.prompts_option(
        "--skip-long-prompts", help="Leave out prompts of the file too long for the context (a warning names each).",
    )] = False,
    live: Annotated[bool, opt.output_option(
        "--live/--no-live", help="Live view on stderr (only on a terminal).")] = True,
    quiet: opt.Quiet = False,
    threads: opt.Threads = None,
    download: opt.Download = None,
    verbose: Annotated[bool, opt.output_option(
        "--verbose", "-v", help="Print the resolved backend and kernels on stderr.")] = False,
    trust_remote_code: opt.TrustRemoteCode = False,
    allow_pickle: opt.AllowPickle = False,
) -> None:
    """Generate text; stdout gets only the text (or JSON), stderr the live view and statistics."""
    from specgen.core.profile import load_profile, with_prompt_settings

    began = time.perf_counter()  # the records' wall_seconds count from here
    texts, several = read_prompts(prompt, opt.prompts_path(prompts_file, prompts), output_format)
    if logprobs is not None and output_format == Format.text:
        from specgen.core.errors import UsageError

        raise UsageError("--logprobs needs --format json or jsonl: text output has no place for them",
                         hint="add --format json (one prompt) or --format jsonl (--prompts-file)")
    settings = load_profile(profile, opt.overrides(**locals()))
    opt.warn_settings(settings, quiet)
    for item in texts:  # each line's own settings, checked before the models load
        with_prompt_settings(settings, item.settings, item.source)
    # torch and transformers: only for valid input
    engine, decoder, startup = start_engine(settings, allow_pickle, status=not quiet)
    show_live = (live and not quiet and output_format == Format.text
                 and render.can_draw_beside_stdout(render.stderr_console()))

    def encode(item):  # (the prompt's settings, its ids)
        own = with_prompt_settings(settings, item.settings, item.source)
        return own, prompt_ids(engine, own, item.text, chat, system, truncate_prompt)

    def check(item, job):
        own, ids = job
        (engine.decoder(own) if item.settings else decoder).check_prompt(ids)

    def jobs(warn_skipped):
        return checked(texts, encode, check, skip_long=skip_long_prompts, warn=warn_skipped)

    prompts, longest = fit(decoder, jobs(None if quiet else warn))  # every prompt, before anything generates
    # tree_width auto weighs trees at the positions this run's generations reach (core/tree_cost.py)
    if verbose and not quiet:
        warn(describe({**engine.describe(positions=longest), "startup": startup.as_dict()}))
    batch = engine.resolve_batch(settings, prompts, longest)
    runs = settings
    if batch.measured:  # from the bench's rows: its recommendation at that size (target-only, or its k and shape)
        runs = engine.batch_profile(settings, batch)
    if verbose and not quiet:
        warn(describe({"batch_size": batch.batch, "batch_auto": batch.reason}))
    elif batch.reason and not batch.measured and prompts > 1 and not quiet:  # auto fell back: say why
        auto = settings.runtime.batch_size == "auto"  # else a set batch size's tree shape auto, left a chain
        warn(f"specgen: {'batch_size auto: ' if auto else ''}{batch.reason}")
    # read again as the loop takes them (the ids as checked above; the run's settings for the rest)
    work = ((item, ids, with_prompt_settings(runs, item.settings, item.source) if runs is not settings else own)
            for item, (own, ids) in jobs(None))
    if batch.batch > 1 and prompts > 1:
        run_batch(engine, engine.batch_decoder(batch.batch, runs, longest), work, output_format, quiet, startup,
                  began)
        return
    for n, (item, ids, own) in enumerate(work):
        label = (item.source or "prompt") if several else None
        # start-up happens once: said on the first summary line, and in every record
        result = run_one(engine.decoder(own, positions=longest), ids, output_format, show_live, quiet, label,
                         startup if n == 0 else None)
        emit_json(result, item.text, len(ids), own, output_format, engine.tokenizer,
                  {"startup": startup.as_dict(), "wall_seconds": time.perf_counter() - began})
        if result.reason == INTERRUPTED:
            raise typer.Exit(130)


def fit(decoder, jobs) -> tuple[int, int]:
    """(prompts that fit the context, the most positions one takes: its tokens and max_tokens), from
    one pass over them that keeps nothing else (cli/prompts.py `fitting`, one prompt at a time)."""
    from specgen.cli.prompts import EVERY_PROMPT_TOO_LONG
    from specgen.core.errors import UsageError

    decoder.check_prompt([0])  # a one-token prompt: fails only when max_tokens and k leave no room for any prompt
    prompts = longest = 0
    for _, (own, ids) in jobs:
        prompts, longest = prompts + 1, max(longest, len(ids) + own.sampling.max_tokens)
    if not prompts:
        raise UsageError(EVERY_PROMPT_TOO_LONG, hint="shorten them or lower --max-tokens")
    return prompts, longest


def run_batch(engine, decoder, work, output_format: Format, quiet: bool, startup, began: float) -> None:
    """The prompts of a file through a BatchDecoder: each result, in input order, written as
    run_one writes a finished one (no live view: many prompts advance at once); after Ctrl-C, the
    prompts that were running as far as they got, then exit 130. work: (prompt, ids, settings) of
    each, read as the loop takes them; only those taken and not yet written are held."""
    held: dict[int, tuple] = {}

    def queue():
        for index, (item, ids, own) in enumerate(work):
            held[index] = item, len(ids), own
            yield ids, own.sampling

    try:
        for index, finished in decoder.run(queue()):
            item, tokens, own = held.pop(index)
            label = item.source or "prompt"
            if output_format == Format.text:
                sys.stdout.write(f"==> {label} <==\n{finished.text}\n")
                sys.stdout.flush()
            if not quiet:
                render.summary(finished.stats, label=label, startup=startup if index == 0 else None,
                               interrupted=finished.reason == INTERRUPTED)
            emit_json(finished, item.text, tokens, own, output_format, engine.tokenizer,
                      {"startup": startup.as_dict(), "wall_seconds": time.perf_counter() - began})
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def describe(resolved: dict) -> str:
    """The resolved run settings as `key: value` lines (nested tables flattened with dots). A key
    whose value is None does not apply to this run (placement on one device) and is left out;
    seconds are rounded as the summary line rounds them."""
    lines = []
    for key, value in resolved.items():
        if isinstance(value, dict):
            lines += [f"{key}.{sub}" for sub in describe(value).splitlines()]
        elif key.endswith("_seconds") and isinstance(value, float):
            lines.append(f"{key}: {value:.2f}")
        elif value is not None:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def warn(line: str) -> None:
    print(line, file=sys.stderr)


def read_prompts(prompt: str | None, prompts_file: Path | None, output_format: Format):
    """(the prompts, read again each time they are iterated; whether there are several), every line
    of a file checked once here, none of it kept."""
    from specgen.core.errors import UsageError

    if prompts_file is None and output_format == Format.jsonl:
        raise UsageError("--format jsonl needs --prompts-file", hint="use --format json for a single prompt")
    prompts = source(prompt, prompts_file)
    count = sum(1 for _ in prompts)
    if output_format == Format.json and count > 1:
        raise UsageError("--format json takes one prompt", hint="use --format jsonl with --prompts-file")
    return prompts, count > 1


INTERRUPTED = "interrupted"


@dataclass
class Partial:
    """What an interrupted generation produced, shaped like the loop's Finished for the output code."""

    text: str
    token_ids: list[int]
    fates: list
    stats: object
    logprobs: list[dict] | None
    pieces: list[str]
    reason: str = INTERRUPTED

    @classmethod
    def of(cls, events: list, stats) -> "Partial":
        logprobs = [lp for e in events for lp in (e.logprobs or [])] if any(e.logprobs for e in events) else None
        return cls("".join(e.text for e in events), [t for e in events for t in e.token_ids],
                   [f for e in events for f in e.fates], stats, logprobs, [p for e in events for p in e.pieces])


def run_one(decoder, ids: list[int], output_format: Format, show_live: bool, quiet: bool, label: str | None,
            startup=None):
    """Run one generation, streaming as the format allows; returns the Finished event, or a Partial
    one after Ctrl-C (what was generated is shown or written either way).

    label names the prompt when there are several (FILE:LINE): in text format a `==> label <==`
    line goes before its output, as `head` does for several files, and its summary line starts
    with it, so that outputs and statistics can be told apart. startup (cli/loading.Startup) ends
    the summary line when given."""
    from specgen.cli import render
    from specgen.core.events import Finished

    stream = output_format == Format.text and not show_live
    if label is not None and output_format == Format.text:
        sys.stdout.write(f"==> {label} <==\n")
    view = render.LiveView() if show_live else None
    events: list = []
    try:
        finished = _drive(decoder, ids, view, stream, Finished, events)
    except KeyboardInterrupt:
        if stream:
            sys.stdout.write("\n")
            sys.stdout.flush()
        elif view is not None and output_format == Format.text:
            _print_text(view.text)  # the live view was transient: keep what was generated
        if not quiet:
            render.summary(decoder.stats, label=label, startup=startup, interrupted=True)
        return Partial.of(events, decoder.stats)
    if stream:
        sys.stdout.write(finished.tail + "\n")
        sys.stdout.flush()
    elif output_format == Format.text:
        _print_final(finished)
    if not quiet:
        render.summary(finished.stats, label=label, startup=startup)
    return finished


def _drive(decoder, ids, view, stream: bool, finished_type, events: list):
    with view if view is not None else contextlib.nullcontext():
        for event in decoder.run(ids):
            if isinstance(event, finished_type):
                return event
            events.append(event)
            if view is not None:
                view.update(event, decoder.stats)
            if stream and event.text:
                sys.stdout.write(event.text)
                sys.stdout.flush()
    raise AssertionError("the decode loop ended without a Finished event")


def _print_final(finished) -> None:
    """After a transient live view on a terminal stdout: the text once, coloured by fate."""
    text = render.coloured(finished.pieces, [f.value for f in finished.fates], len(finished.text))
    text.append(finished.text[len(text.plain):])  # bytes completed only at the end have no fate of their own
    _print_text(text)


def _print_text(text) -> None:
    from rich.console import Console

    Console(no_color=render.no_color(), highlight=False, soft_wrap=True).print(text)


SCHEMA = "specgen.generate/2"  # 2: logprob alternatives are `top_logprobs` (records without a schema: `top`)


def emit_json(finished, prompt: str, prompt_tokens: int, settings, output_format: Format, tokenizer,
              times: dict) -> None:
    """times: the process's start-up and the wall seconds so far (docs/cli.md, "Times and rates")."""
    if output_format == Format.text:
        return
    record = {
        "schema": SCHEMA,
        "prompt": prompt,
        "prompt_tokens": prompt_tokens,
        "text": finished.text,
        "finish_reason": finished.reason,
        "token_ids": finished.token_ids,
        "fates": [f.value for f in finished.fates],
        "profile": settings.name,
        "stats": finished.stats.as_dict(),
        **times,
    }
    if finished.logprobs is not None:
        record["logprobs"] = with_token_text(finished.logprobs, tokenizer)
    if finished.reason == INTERRUPTED:
        record["incomplete"] = True  # Ctrl-C: what was generated until then
    sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def with_token_text(logprobs: list[dict], tokenizer) -> list[dict]:
    """Each logprob entry (and each of its alternatives, the loop's `top`, written `top_logprobs` as
    the OpenAI and vLLM APIs name them) with its token's text beside its id. A token that holds part
    of a multi-byte character decodes to U+FFFD on its own. Alternatives the warp removed (top-k /
    top-p / min-p: logprob -inf) are left out: JSON has no -inf, and json.dumps would write
    `-Infinity`, which strict parsers reject."""
    def named(entry: dict) -> dict:
        out = {"token": tokenizer.decode([entry["token_id"]]),
               **{key: value for key, value in entry.items() if key != "top"}}
        if "top" in entry:
            out["top_logprobs"] = [named(alt) for alt in entry["top"] if alt["logprob"] != float("-inf")]
        return out

    return [named(entry) for entry in logprobs]
