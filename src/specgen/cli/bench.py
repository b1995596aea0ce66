"""`specgen bench`: speed and acceptance of a pair over a k x temperature sweep, against baselines.

The measuring is core/bench.py; this module parses, runs and renders. The progress bar goes to
stderr (only on a terminal). The result goes to stdout: a table, or one JSON document with
--format json (docs/bench-schema.md), in which case the table goes to stderr unless --quiet.
"""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specgen.cli import options as opt
from specgen.cli import render


class Format(str, enum.Enum):
    text = "text"
    json = "json"


def bench(
    profile: opt.Profile = None,
    target: opt.Target = None,
    draft: opt.Draft = None,
    proposer: opt.Proposer = None,
    ks: Annotated[str, typer.Option("--k", help="Comma list of k to sweep, e.g. 1,2,4,8.")] = "1,2,4,8",
    temperatures: Annotated[str, typer.Option("--temperature", "-t", help="Comma list, e.g. 0,0.8.")] = "0",
    baselines: Annotated[str, typer.Option(
        "--baseline", help="Comma list of target-only, hf, hf-assisted.")] = "target-only",
    prompts_file: Annotated[Optional[Path], typer.Option(
        "--prompts", help="Text lines or JSONL with 'prompt' (default: the pair's prompts.jsonl).")] = None,
    num_prompts: Annotated[Optional[int], typer.Option("--num-prompts", min=1, help="Use the first N prompts.")] = None,
    max_tokens: opt.MaxTokens = None,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed runs per prompt; the median counts.")] = 1,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs before each method.")] = 1,
    top_p: opt.TopP = None,
    top_k: opt.TopK = None,
    min_p: opt.MinP = None,
    repetition_penalty: opt.RepetitionPenalty = None,
    seed: opt.Seed = None,
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos/--no-ignore-eos", help="Generate max-tokens for every prompt (default) or stop at EOS.")] = True,
    dtype: opt.Dtype = None,
    device: opt.Device = None,
    records: Annotated[bool, typer.Option(
        "--records", help="Keep per-round records in the JSON (for inspect-acceptance --bench).")] = False,
    output_format: Annotated[Format, typer.Option("--format", "-f", help="text | json.")] = Format.text,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Nothing on stderr but errors.")] = False,
    trust_remote_code: opt.TrustRemoteCode = False,
    allow_pickle: opt.AllowPickle = False,
) -> None:
    """Benchmark speculative decoding against baselines; stdout gets the table (or JSON)."""
    from specgen.core.bench import Bench, Plan
    from specgen.core.engine import Engine
    from specgen.core.profile import load_profile

    plan = Plan(ks=parse_list(ks, int, "--k"), temperatures=parse_list(temperatures, float, "--temperature"),
                baselines=parse_baselines(baselines), repeat=repeat, warmup=warmup, records=records)
    overrides = opt.overrides(**locals())

    def settings_for(k: int, temperature: float):
        return load_profile(profile, {**overrides, "speculation.k": k, "sampling.temperature": temperature})

    settings = settings_for(plan.ks[0], plan.temperatures[0])
    for k in plan.ks:  # every combination is validated before any model loads
        for temperature in plan.temperatures:
            settings_for(k, temperature)
    prompts = bench_prompts(prompts_file, settings, num_prompts)
    engine = Engine(settings, allow_pickle=allow_pickle)
    err = render.stderr_console()
    with progress_bar(err, enabled=not quiet and sys.stderr.isatty()) as bar:
        runner = Bench(engine, prompts, settings_for, plan)
        task = bar.add_task("bench", total=runner.total_steps)
        runner.progress = lambda steps, label: bar.update(task, advance=steps, description=label)
        document = runner.run()
    if output_format == Format.json:
        sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        if not quiet:
            show(document, wide(err))
    else:
        show(document, wide(Console(highlight=False, no_color=render.no_color())))


def parse_list(text: str, kind, option: str) -> tuple:
    from specgen.core.errors import UsageError

    try:
        values = tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"{option} takes a comma list of numbers, got {text!r}", hint=f"e.g. {option} 1,2,4") from None
    if not values:
        raise UsageError(f"{option} is empty")
    return tuple(dict.fromkeys(values))


def parse_baselines(text: str) -> tuple[str, ...]:
    from specgen.core.bench import BASELINES
    from specgen.core.errors import UsageError

    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise UsageError(f"unknown baseline {unknown[0]!r}", hint=f"choose from {', '.join(BASELINES)}")
    return names


def bench_prompts(path: Path | None, settings, limit: int | None) -> list[str]:
    """--prompts, or the prompts.jsonl that the pair's recipe writes beside its target folder."""
    from specgen.cli.generate import _read_prompts_file
    from specgen.core.errors import UsageError

    if path is None:
        path = Path(settings.target.path).expanduser().parent / "prompts.jsonl"
        if not path.is_file():
            raise UsageError(f"no prompts: the profile's pair has no prompts.jsonl (looked for {path})",
                             hint="give --prompts FILE (text lines or JSONL with a 'prompt' field)")
    prompts = _read_prompts_file(path)
    return prompts[:limit] if limit else prompts


def progress_bar(console: Console, enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=not enabled)


def wide(console: Console) -> Console:
    if not console.is_terminal:
        console.width = 200  # a pipe or file gets the whole table, not one squeezed into 80 columns
    return console


# -- rendering -------------------------------------------------------------------------------


def show(document: dict, console: Console) -> None:
    console.print(table(document))
    for line in recommendation_lines(document):
        console.print(line)


def table(document: dict) -> Table:
    names = document["settings"]["baselines"]
    cuda = any(r["peak_gpu_memory_bytes"] is not None for r in document["results"])
    env = document["environment"]
    title = (f"{document['profile']['name']} · {len(document['prompts'])} prompts × "
             f"{document['settings']['max_tokens']} tokens · {env['device']} ({env['device_name']})")
    grid = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, title_justify="left")
    for column in ("T", "method", "tok/s", "p25–p75", *(f"× {n}" for n in names), "accept", "mean len",
                   "per position", "round ms d/v/s/o", "TTFT ms", *(["peak MiB"] if cuda else []), "greedy same"):
        grid.add_column(column, justify="left" if column in ("method", "per position") else "right")
    for temperature in document["settings"]["temperatures"]:
        rows = [_baseline_row(b, names, cuda) for b in document["baselines"] if b["temperature"] == temperature]
        rows += [_result_row(r, names, cuda) for r in document["results"] if r["temperature"] == temperature]
        for i, row in enumerate(rows):
            grid.add_row(*row, end_section=i == len(rows) - 1)
    return grid


def _baseline_row(base: dict, names: list[str], cuda: bool) -> list:
    if not base["available"]:
        return [f"{base['temperature']:g}", base["method"], Text(f"n/a: {base['reason']}", style="dim"),
                *[""] * (len(names) + 6 + cuda)]
    return [f"{base['temperature']:g}", Text(base["method"], style="dim"), *_speed_cells(base),
            *["" for _ in names], "", "", "", "", _ms(base["time_to_first_token_seconds"]),
            *([_mib(base["peak_gpu_memory_bytes"])] if cuda else []), ""]


def _result_row(result: dict, names: list[str], cuda: bool) -> list:
    speedups = [f"{s['median']:.2f}×" if s else "–" for s in (result["speedup"][n] for n in names)]
    split = result["round_ms"]
    return [
        f"{result['temperature']:g}", f"k={result['k']}", *_speed_cells(result), *speedups,
        f"{result['acceptance_rate']:.1%}", f"{result['mean_accepted_length']:.2f}",
        render.position_bars(result["per_position_acceptance"]),
        "/".join(f"{split[p]:.1f}" for p in ("draft", "verify", "sample", "other")),
        _ms(result["time_to_first_token_seconds"]),
        *([_mib(result["peak_gpu_memory_bytes"])] if cuda else []),
        _agreement(result["greedy_agreement"]),
    ]


def _speed_cells(entry: dict) -> list[str]:
    tps = entry["tokens_per_second"]
    return [f"{tps['median']:.1f}", f"{tps['p25']:.1f}–{tps['p75']:.1f}"]


def _ms(summary: dict | None) -> str:
    return f"{1000 * summary['median']:.1f}" if summary else "–"


def _mib(value: int | None) -> str:
    return f"{value / 2**20:.0f}" if value is not None else "–"


def _agreement(agreement: dict | None) -> str:
    """Identical fraction against the first greedy baseline, and the earliest divergence."""
    if not agreement:
        return "–"
    name, entry = next(iter(agreement.items()))
    cut = [d for d in entry["first_divergence"] if d is not None]
    tail = f" (from tok {min(cut)})" if cut else ""
    return f"{entry['identical_fraction']:.0%} vs {name}{tail}"


def recommendation_lines(document: dict) -> list[Text]:
    lines = []
    for rec in document["recommendation"]:
        line = Text(f"recommended k at temperature {rec['temperature']:g}: ", style="bold")
        line.append(f"{rec['k']}", style="bold green" if rec["faster_than_target_only"] is not False else "bold red")
        line.append(f"  ({rec['tokens_per_second']:.1f} tok/s")
        if rec["speedup_vs_target_only"] is not None:
            line.append(f", {rec['speedup_vs_target_only']:.2f}× target-only")
            if not rec["faster_than_target_only"]:
                line.append("; speculation does not pay off here")
        line.append(")")
        lines.append(line)
    return lines
