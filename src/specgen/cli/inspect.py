"""`specgen inspect-acceptance`: where and why a draft's tokens are accepted or rejected.

Runs prompts with an insight decoder (p, q and the target's entropy for every drafted token), or
reads the per-round records of `specgen bench --records`, and reports what core/insight.py finds:
the text coloured by fate, per-position acceptance, the most rejected draft tokens with their
contexts, and acceptance against the target's entropy; for token trees, what the tree bought over
the chain inside it, per depth, and each round's tree (the HTML export draws it). stdout gets the report (text or JSON);
--export writes it as .json, a self-contained .html page, or a .png plot.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from specgen.cli import options as opt
from specgen.cli import render

SCHEMA = "specgen.inspect/1"
EXPORTS = (".json", ".html", ".png")
BAR_WIDTH = 20
CONTEXT_CHARS = 24  # of the context before a rejected token, in the text report


class Format(str, enum.Enum):
    text = "text"
    json = "json"


def inspect_acceptance(
    prompt: Annotated[Optional[str], typer.Argument(help="Prompt text; '-' or nothing reads stdin.")] = None,
    prompts_file: opt.PromptsFile = None,
    prompts: opt.PromptsAlias = None,
    bench_file: Annotated[Optional[Path], typer.Option(
        "--bench", help="Read the records of `specgen bench --records --format json` instead of generating.")] = None,
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
    coupling: opt.Coupling = None,
    max_tokens: opt.MaxTokens = None,
    min_tokens: opt.MinTokens = None,
    stop: opt.Stop = None,
    stop_token_id: opt.StopTokenId = None,
    ignore_eos: opt.IgnoreEos = None,
    dtype: opt.Dtype = None,
    device: opt.Device = None,
    compile: opt.Compile = None,
    autotune: opt.Autotune = None,
    chat: opt.Chat = False,
    system: opt.System = None,
    truncate_prompt: opt.TruncatePrompt = False,
    top: Annotated[int, opt.output_option("--top", min=1, help="How many of the most rejected tokens to list.")] = 10,
    export: Annotated[Optional[Path], opt.output_option(
        "--export", help="Also write FILE.json, FILE.html or FILE.png.")] = None,
    skip_long_prompts: Annotated[bool, opt.prompts_option(
        "--skip-long-prompts", help="Leave out prompts of the file too long for the context (a warning names each).",
    )] = False,
    output_format: Annotated[Format, opt.output_option("--format", "-f", help="text | json.")] = Format.text,
    quiet: opt.Quiet = False,
    threads: opt.Threads = None,
    download: opt.Download = None,
    trust_remote_code: opt.TrustRemoteCode = False,
    allow_pickle: opt.AllowPickle = False,
) -> None:
    """Show which draft tokens the target accepts, where, and which it rejects."""
    from specgen.core import insight

    check_export(export)
    path = opt.prompts_path(prompts_file, prompts)
    complete = True
    if bench_file is not None:
        if prompt is not None or path is not None:
            from specgen.core.errors import UsageError

            raise UsageError("give a prompt, --prompts-file or --bench, not several")
        source, runs = _from_bench(bench_file, k, temperature)
    else:
        request = Request(prompt, path, profile, opt.overrides(**locals()), chat, system, truncate_prompt,
                          skip_long_prompts, quiet)
        source, runs, complete = _generate(request, allow_pickle)
    document = {"schema": SCHEMA, "source": source, **insight.analyse(runs, top),
                "runs": [run.as_dict() for run in runs]}
    if not complete:
        document["incomplete"] = True  # Ctrl-C: the prompts finished until then, and the interrupted one's rounds
    failure = write_export(document, export) if export is not None else None
    if output_format == Format.json:  # the report reaches stdout even when the export could not be written
        sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    else:
        show(document, Console(highlight=False, no_color=render.no_color()))
    if failure is not None:
        raise failure
    if export is not None and not quiet:
        print(f"report written to {_where(export)}", file=sys.stderr)
    if not complete:
        raise typer.Exit(130)


@dataclass(frozen=True)
class Request:
    """What to generate from, as the options gave it."""

    prompt: str | None
    prompts_file: Path | None
    profile: str | None
    overrides: dict
    chat: bool
    system: str | None
    truncate: bool
    skip_long: bool
    quiet: bool


def check_export(path: Path | None) -> None:
    """Before any model loads: the export can be written where it is asked to go."""
    from specgen.cli import inspect_export
    from specgen.core.errors import UsageError

    if path is None:
        return
    if path.suffix.lower() not in EXPORTS:
        raise UsageError(f"--export takes a .json, .html or .png file, not {path.name!r}")
    problem = _destination_problem(path)
    if problem:
        raise UsageError(f"--export {path}: {problem}", hint="choose another --export path")
    if path.suffix.lower() == ".png":
        inspect_export.require_matplotlib()


def _destination(path: Path) -> Path:
    """Where the export goes: through a symlink to the file it points to, as a shell's `>` writes."""
    return Path(os.path.realpath(path))


def _where(path: Path) -> str:
    destination = _destination(path)
    return str(path) if destination == path.absolute() else f"{path} (→ {destination})"


def _destination_problem(path: Path) -> str | None:
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        pass  # a new file; a parent that is a file is said below
    except OSError as exc:  # a symlink loop
        return f"cannot be reached ({exc.strerror})"
    path = _destination(path)
    folder = path.parent
    if path.is_dir():
        return "is a directory"
    if path.exists() and not path.is_file():  # a device such as /dev/full, a pipe, a socket
        return "is not a regular file"
    if not folder.exists():
        return f"directory {folder} does not exist"
    if not folder.is_dir():
        return f"{folder} is not a directory"
    try:  # the way the export is written: a new file in that directory, renamed over the destination
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"cannot create a file in {folder} ({exc.strerror})"
    return None


def _from_bench(path: Path, k: int | None, temperature: float | None):
    from specgen.core import insight
    from specgen.core.errors import UsageError

    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not JSON ({exc})") from None
    result, runs = insight.runs_from_bench(document, k, temperature)
    source = {"kind": "bench", "file": str(path), "profile": document["profile"]["name"], "k": result["k"],
              "temperature": result["temperature"]}
    return source, runs


def _generate(request: Request, allow_pickle: bool):
    """(source, runs, complete): complete is False after Ctrl-C, with the runs recorded until then.
    The prompts, profile and options are checked before torch is imported."""
    from specgen.cli.loading import load_engine
    from specgen.cli.prompts import fitting, prompt_ids, read, without_settings
    from specgen.core.profile import load_profile

    prompts = without_settings(read(request.prompt, request.prompts_file), "inspect-acceptance")
    settings = load_profile(request.profile, request.overrides)
    opt.warn_settings(settings, request.quiet)
    engine = load_engine(settings, allow_pickle, status=not request.quiet)  # torch: only for valid input
    check = engine.decoder().check_prompt
    jobs = fitting(prompts, lambda item: prompt_ids(engine, settings, item.text, request.chat, request.system,
                                                    request.truncate),
                   lambda item, ids: check(ids), skip_long=request.skip_long,
                   warn=None if request.quiet else (lambda line: print(line, file=sys.stderr)))
    runs, complete = [], True
    # tree_width auto weighs trees at the positions these prompts reach, as generate does
    reach = max((len(ids) for _, ids in jobs), default=0) + settings.sampling.max_tokens
    with progress(len(jobs), enabled=not request.quiet) as shown:
        for number, (item, ids) in enumerate(jobs, start=1):
            run, complete = _record(engine.decoder(insight=True, positions=reach), item.text, ids, engine.tokenizer,
                                    lambda tokens, done: shown(number, tokens, done))
            runs += [run] if run is not None else []
            if not complete:
                break
    if not runs:  # interrupted before a single round: nothing to report
        raise KeyboardInterrupt
    source = {"kind": "prompts", "file": str(request.prompts_file) if request.prompts_file else None,
              "profile": settings.name, "proposer": settings.proposer.kind, "k": settings.speculation.k,
              "temperature": settings.sampling.temperature, "chat": request.chat or request.system is not None}
    # the round's tree (auto resolved): width 1 and k nodes for a chain
    shape = engine.tree_report(settings, positions=reach)
    source.update(tree_width=shape["tree_width"], tree_nodes=shape["tree_nodes"])
    return source, runs, complete


@contextlib.contextmanager
def progress(total: int, enabled: bool):
    """Yields shown(prompt number, tokens so far, done) for the minutes a prompts file takes: on
    stderr, only when it is a terminal; a transient status line where stdout is a terminal too,
    else one plain line per finished prompt (a redrawn line would garble what stdout prints to
    the same terminal through a pipe)."""
    console = render.stderr_console()
    if not enabled or not console.is_terminal:
        yield lambda number, tokens, done: None
        return
    if not (render.can_draw(console) and sys.stdout is not None and sys.stdout.isatty()):
        def line(number: int, tokens: int, done: bool) -> None:
            if done:
                console.print(f"inspected prompt {number} of {total}: {tokens} tokens", style="dim")

        yield line
        return
    with console.status(f"inspecting prompt 1 of {total}") as status:
        yield lambda number, tokens, done: status.update(f"inspecting prompt {number} of {total}: {tokens} tokens")


def _record(decoder, prompt: str, ids: list[int], tokenizer, shown):
    """(the run's record, True), or after Ctrl-C (the record of its rounds so far or None, False).
    shown(tokens, done) is told of every round."""
    from specgen.cli.generate import Partial
    from specgen.core.events import RoundEvent
    from specgen.core.insight import RunRecord

    events, tokens = [], 0
    try:
        for event in decoder.run(ids):
            events.append(event)
            if isinstance(event, RoundEvent):
                tokens += len(event.token_ids)
                shown(tokens, False)
        shown(tokens, True)
    except KeyboardInterrupt:
        partial = Partial.of(events, decoder.stats)
        return (RunRecord.build(prompt, partial, events, tokenizer) if events else None), False
    return RunRecord.build(prompt, events[-1], events[:-1], tokenizer), True


def write_export(document: dict, path: Path):
    """Write the export; returns the error to raise once the report is on stdout, or None."""
    from specgen.cli import inspect_export
    from specgen.core.errors import SpecgenError

    suffix = path.suffix.lower()
    # A new file renamed over the destination: a failure leaves no half-written report (and any
    # earlier one stays as it was). A symlink stays: the file it points to is the one replaced.
    destination = _destination(path)
    temporary = destination.with_name(f".{destination.name}.{os.getpid()}.tmp")
    try:
        if suffix == ".json":
            temporary.write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        elif suffix == ".html":
            temporary.write_text(inspect_export.html_page(document), encoding="utf-8")
        else:
            inspect_export.png_plot(document, temporary)
        os.replace(temporary, destination)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        return SpecgenError(f"cannot write --export {path}: {exc.strerror or exc}",
                            hint="free some space or choose another --export path; the report is on stdout")
    return None


# -- text report -----------------------------------------------------------------------------


def show(document: dict, console: Console) -> None:
    for i, run in enumerate(document["runs"]):
        console.rule(Text(f"prompt {i + 1}", style="dim"), align="left", style="dim")
        text = Text(run["prompt"] + ("\n" if document["source"].get("chat") else ""), style="dim")
        text.append_text(render.coloured(run["pieces"], run["fates"], len(run["text"])))
        console.print(text)
        won = branch_line(run)
        if won:
            console.print(won, style="dim", soft_wrap=True)
    console.print(render.legend())
    console.print(totals_line(document), soft_wrap=True)
    console.print(position_table(document["per_position"]))
    if document.get("tree"):
        console.print(tree_table(document["tree"]))
        if document["tree"].get("hybrid"):
            console.print(hybrid_table(document["tree"]["hybrid"]))
            console.print(hybrid_depths(document["tree"]["hybrid"]), style="dim", soft_wrap=True)
    console.print(rejected_table(document))
    if document["entropy"]:
        console.print(entropy_table(document["entropy"]))


def branch_line(run: dict) -> str:
    """A tree run's rounds that a branch won (round number, then the accepted path's sibling index
    per depth, 0 the first child): '' for a chain, or where the first children always won."""
    won = [f"{i + 1} ({'·'.join(map(str, r['branch']))})" for i, r in enumerate(run["rounds"])
           if any(r.get("branch") or ())]
    if not won and not any(r.get("branch") is not None for r in run["rounds"]):
        return ""
    return "rounds a branch won (sibling per depth): " + (", ".join(won) or "none")


def totals_line(document: dict) -> Text:
    totals, fates = document["totals"], document["fates"]
    line = Text(f"{totals['generated_tokens']} tokens = ", style="bold")
    for fate in ("accepted", "recovered", "bonus"):
        line.append(f"{fates[fate]} {fate}", style=render.fate_style(fate))
        line.append(" + " if fate != "bonus" else "")
    line.append(f" · {totals['rounds']} rounds · acceptance {totals['acceptance_rate']:.1%}"
                f" · mean accepted length {totals['mean_accepted_length']:.2f}"
                f" · mean k {totals['mean_k']:.2f} · {totals['early_stops']} early stops")
    return line


def _bar(rate: float | None) -> str:
    if rate is None:
        return ""
    eighths = round(rate * BAR_WIDTH * 8)
    return "█" * (eighths // 8) + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[eighths % 8]


def position_table(rows: list[dict]) -> Table:
    table = Table("position", "drafted", "accepted", "rate", Column("", no_wrap=True), title="Per-position acceptance",
                  box=box.SIMPLE_HEAD, title_justify="left")
    for row in rows:
        table.add_row(str(row["position"]), str(row["drafted"]), str(row["accepted"]), f"{row['rate']:.1%}",
                      Text(_bar(row["rate"]), style="green"))
    return table


def tree_table(tree: dict) -> Table:
    """Per depth: how often the tree's accepted path reached it, how often the chain inside the
    tree would have, and how often a branch (not the first child) won there."""
    title = (f"Token tree against its chain: {tree['tokens_per_round']:.2f} tokens per round, its chain "
             f"{tree['chain_tokens_per_round']:.2f} ({tree['gain_per_round']:+.2f})")
    table = Table("depth", "reached", "rate", Column("", no_wrap=True), "chain reached", "chain rate",
                  "branch wins", title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for d in tree["per_depth"]:
        wins = f"{d['branch_wins']} ({_pct(d['branch_rate'])})"
        table.add_row(str(d["depth"]), str(d["reached"]), f"{d['rate']:.1%}", Text(_bar(d["rate"]), style="green"),
                      str(d["chain_reached"]), f"{d['chain_rate']:.1%}", wins)
    return table


def hybrid_table(hybrid: dict) -> Table:
    """A hybrid tree run's rounds by whose nodes their accepted path took: rounds (rate: of all
    rounds), the tokens accepted from each part's nodes (share: of all accepted) and per round."""
    title = (f"Hybrid tree: whose nodes the accepted path took ({hybrid['rounds']} rounds, "
             f"{hybrid['merged_rounds']} with the lookup's nodes)")
    table = Table("path", "rounds", "rate", "accepted", "share", "per round", title=title, box=box.SIMPLE_HEAD,
                  title_justify="left")
    for part in ("lookup", "model"):
        p = hybrid[part]
        per = "–" if p["tokens_per_round"] is None else f"{p['tokens_per_round']:.2f}"
        table.add_row(f"the {part}'s", str(p["rounds"]), f"{p['rate']:.1%}", str(p["accepted"]), _pct(p["share"]),
                      per)
    table.add_row("none accepted", str(hybrid["none"]), f"{hybrid['none'] / hybrid['rounds']:.1%}", "", "", "")
    return table


def hybrid_depths(hybrid: dict) -> str:
    """Per depth, the rounds whose accepted path reached it through the lookup's nodes and the model's."""
    depths = " · ".join(f"{d['depth']}: {d['lookup']}/{d['model']}" for d in hybrid["per_depth"])
    return f"paths reaching each depth through the lookup's/the model's nodes: {depths or 'none'}"


def _pct(rate: float | None) -> str:
    return "–" if rate is None else f"{rate:.0%}"


def visible(text: str) -> str:
    """Text with line breaks, tabs and control characters made visible (a context snippet)."""
    return repr(text)[1:-1]


def token(text: str) -> str:
    """A token's text in quotes, as repr writes it: ' a' and 'a' look different, and so do tokens
    that differ only in white space."""
    return repr(text)


def _p(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def rejected_table(document: dict) -> Table:
    note = "" if document["has_probabilities"] else " (no p, q: bench records carry none)"
    rows = []
    for entry in document["rejected"]:
        example = entry["examples"][0]
        rows.append((Text(token(entry["text"]), style="red"), Text(str(entry["count"])), Text(_p(entry["mean_q"])),
                     Text(_p(entry["mean_p"])), Text(token(example["target_text"]), style="yellow")))
    # Only the context gives way on a narrow terminal: a token or a number cut short would mislead.
    heads = ("token", "count", "q(x)\ndraft", "p(x)\ntarget", "target\nchose")
    whole = [Column(head, no_wrap=True, min_width=max([len(line) for line in head.split("\n")]
                                                      + [row[i].cell_len for row in rows]))
             for i, head in enumerate(heads)]
    table = Table(*whole, Column("context", no_wrap=True, overflow="ellipsis", max_width=32),
                  title=f"Most rejected draft tokens{note}", box=box.SIMPLE_HEAD, title_justify="left")
    for entry, row in zip(document["rejected"], rows):
        context = entry["examples"][0]["context"][-CONTEXT_CHARS:]
        table.add_row(*row, Text("…" + visible(context), style="dim"))
    return table


def entropy_table(bins: list[dict]) -> Table:
    table = Table("target entropy (nats)", "verified", "accepted", "rate", Column("", no_wrap=True),
                  title="Acceptance by target entropy (verified positions)", box=box.SIMPLE_HEAD,
                  title_justify="left")
    for b in bins:
        upper = "∞" if b["upper"] is None else f"{b['upper']:g}"
        rate = "–" if b["rate"] is None else f"{b['rate']:.1%}"
        table.add_row(f"[{b['lower']:g}, {upper})", str(b["verified"]), str(b["accepted"]), rate,
                      Text(_bar(b["rate"]), style="green"))
    return table
