"""`specgen bench`: speed and acceptance of a pair over a k x temperature sweep, against baselines.

The measuring is core/bench/run.py; this module parses, runs and renders. The progress bar (with an
ETA) goes to stderr, only on a terminal. The result goes to stdout: a table, or one JSON document
with --format json (docs/bench-schema.md), in which case the table goes to stderr unless --quiet.
After Ctrl-C the same is printed for what finished (JSON: "incomplete": true) and the exit code is 130.
"""

from __future__ import annotations

import enum
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.cells import cell_len
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from specgen.cli import options as opt
from specgen.cli import render
from specgen.core.bench.bench_plan import shape_label


# the proposers a batch bench drafts with, one a run: core/bench/batches.PROPOSERS (not imported
# here: torch loads with the models, after the options are checked)
BATCH_PROPOSERS = ("draft", "eagle", "ngram", "hybrid")


class Format(str, enum.Enum):
    text = "text"
    json = "json"


def _sweep(*names: str, **kwargs):
    """An option of bench's own, in the help's "Sweep" panel: panels are separate tables, so long
    option names elsewhere do not squeeze these (or theirs) at 80 columns."""
    return typer.Option(*names, rich_help_panel="Sweep", **kwargs)


def bench(
    profile: opt.Profile = None,
    target: opt.Target = None,
    draft: opt.Draft = None,
    head: opt.Head = None,
    draft_p_min: opt.DraftPMin = None,
    adaptive_k: opt.AdaptiveK = None,
    proposers: Annotated[Optional[str], _sweep(
        "--proposer", help="Comma list of proposers measured side by side, e.g. draft,ngram (default: the "
        "profile's).")] = None,
    ks: Annotated[str, _sweep("--k", help="Comma list of k to sweep, e.g. 1,2,4,8.")] = "1,2,4,8",
    tree_widths: Annotated[Optional[str], _sweep(
        "--tree-width", help="Comma list of tree widths each k runs with, e.g. 1,2,4 (1 = a chain; default: "
        "the profile's).")] = None,
    tree_budgets: Annotated[Optional[str], _sweep(
        "--tree-nodes", help="Comma list of tree node budgets, e.g. 8,16 (0 = k; default: the profile's).")] = None,
    temperatures: Annotated[str, _sweep("--temperature", "-t", help="Comma list, e.g. 0,0.8.")] = "0",
    couplings: Annotated[Optional[str], _sweep(
        "--coupling", help="Comma list of rejection, gumbel for sampled temperatures (default: both, "
        "the profile's first).")] = None,
    baselines: Annotated[str, _sweep(
        "--baseline", help="Comma list of target-only, hf, hf-static, hf-assisted.")] = "target-only",
    batch_sizes: Annotated[Optional[str], _sweep(
        "--batch-size", help="Comma list of batch sizes, e.g. 1,4,16: throughput and per-row latency of "
        "batches, target-only and each k and tree shape, and where speculation stops paying.")] = None,
    prompts_file: opt.PromptsFile = None,
    prompts: opt.PromptsAlias = None,
    num_prompts: Annotated[Optional[int], _sweep("--num-prompts", min=1, help="Use the first N prompts.")] = None,
    max_tokens: opt.MaxTokens = None,
    repeat: Annotated[int, _sweep("--repeat", min=1, help="Timed runs per prompt; the median counts.")] = 1,
    warmup: Annotated[int, _sweep("--warmup", min=0, help="Untimed runs before each method.")] = 1,
    top_p: opt.TopP = None,
    top_k: opt.TopK = None,
    min_p: opt.MinP = None,
    repetition_penalty: opt.RepetitionPenalty = None,
    presence_penalty: opt.PresencePenalty = None,
    frequency_penalty: opt.FrequencyPenalty = None,
    seed: opt.Seed = None,
    ignore_eos: Annotated[bool, _sweep(
        "--ignore-eos/--no-ignore-eos", help="Generate max-tokens for every prompt (default) or stop at EOS.")] = True,
    chat: opt.Chat = False,
    system: opt.System = None,
    truncate_prompt: opt.TruncatePrompt = False,
    dtype: opt.Dtype = None,
    device: opt.Device = None,
    compile: opt.Compile = None,
    autotune: opt.Autotune = None,
    threads: opt.Threads = None,
    download: opt.Download = None,
    fp32_check: Annotated[Optional[bool], _sweep(
        "--fp32-check/--no-fp32-check",
        help="After timing, compare greedy speculative with target-only output in float32 "
             "(default: when the sweep has temperature 0 and the models are not float32).")] = None,
    records: Annotated[bool, opt.output_option(
        "--records", help="Keep per-round records in the JSON (for inspect-acceptance --bench).")] = False,
    output_format: Annotated[Format, opt.output_option("--format", "-f", help="text | json.")] = Format.text,
    quiet: opt.Quiet = False,
    trust_remote_code: opt.TrustRemoteCode = False,
    allow_pickle: opt.AllowPickle = False,
) -> None:
    """Benchmark speculative decoding against baselines; stdout gets the table (or JSON).

    Prompts come from --prompts-file, or by default from the prompts.jsonl beside the profile's target folder.
    """
    from specgen.core.bench.bench_plan import Plan
    from specgen.core.profile import load_profile

    plan = Plan(ks=parse_list(ks, int, "--k"), temperatures=parse_list(temperatures, float, "--temperature"),
                proposers=parse_names(proposers, "--proposer"), baselines=parse_baselines(baselines),
                repeat=repeat, warmup=warmup, records=records, trees=parse_trees(tree_widths, tree_budgets))
    overrides = opt.overrides(**locals())
    path = opt.prompts_path(prompts_file, prompts)

    def settings_for(k: int, temperature: float, proposer: str | None = None, tree: tuple | None = None):
        """proposer None: the profile's own; tree (width, nodes) None: the profile's own."""
        return load_profile(profile, {**overrides, "speculation.k": k, "sampling.temperature": temperature,
                                      "proposer.kind": proposer, **tree_overrides(tree)})

    first = settings_for(plan.ks[0], plan.temperatures[0])
    named = bool(plan.proposers)
    plan = replace(plan, couplings=parse_couplings(couplings, first.sampling.coupling),
                   proposers=plan.proposers or (first.proposer.kind,))
    validate(settings_for, plan, named)
    opt.warn_settings(settings_for(plan.ks[0], max(plan.temperatures)), quiet)
    texts = bench_prompts(path, first, num_prompts)
    if num_prompts is not None and len(texts) < num_prompts and not quiet:  # the document says how many ran
        print(f"specgen: --num-prompts {num_prompts}: the prompts file holds {len(texts)}; measuring those",
              file=sys.stderr)
    if batch_sizes is not None:
        sizes = parse_batch_sizes(batch_sizes, plan, records)
        unfilled = [size for size in sizes if size > len(texts)]
        if unfilled and not quiet:  # such a batch runs part empty: its rows_per_round says how full
            print(f"specgen: --batch-size {','.join(map(str, unfilled))}: more rows than the {len(texts)} prompts "
                  "measured; those batches never fill", file=sys.stderr)
        encoding = Encoding(chat, system, truncate_prompt, settings_for(max(plan.ks), plan.temperatures[0],
                                                                          plan.proposers[0]))
        batch_bench(settings_for, texts, plan, sizes, encoding, allow_pickle, quiet, output_format)
        return
    encoding = Encoding(chat, system, truncate_prompt, settings_for(max(plan.ks), plan.temperatures[0],
                                                                      plan.proposers[0]))
    document = measure(settings_for, texts, plan, encoding, allow_pickle, quiet)
    if not document["incomplete"] and wants_fp32_check(fp32_check, plan, document):
        measured = [p["text"] for p in document["prompts"]]
        document["fp32_check"] = run_fp32_check(profile, overrides, measured, plan, encoding, allow_pickle, quiet)
        document["incomplete"] = document["fp32_check"] is None
    if not document["incomplete"]:
        keep_measured(document, first.runtime.measured)
    emit(document, output_format, quiet, show)


def emit(document: dict, output_format: Format, quiet: bool, shower) -> None:
    """The document as JSON on stdout (and, unless quiet, its table on stderr) or as the table on
    stdout; an interrupted run then exits 130 with its partial results out."""
    if output_format == Format.json:
        sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        if not quiet:
            shower(document, render.stderr_console())
    else:
        shower(document, Console(highlight=False, no_color=render.no_color()))
    if document["incomplete"]:
        print("specgen: interrupted", file=sys.stderr)
        raise typer.Exit(130)


def parse_batch_sizes(text: str, plan, records: bool) -> tuple[int, ...]:
    """--batch-size as batch sizes (1..256 each); what batches do not take is refused here, in one line."""
    from specgen.core.errors import UsageError

    sizes = parse_list(text, int, "--batch-size")
    if not all(1 <= size <= 256 for size in sizes):
        raise UsageError(f"--batch-size {text}: each batch size must be from 1 to 256", hint="e.g. --batch-size 1,4,16")
    if len(plan.proposers) != 1 or plan.proposers[0] not in BATCH_PROPOSERS:
        raise UsageError(f"--batch-size measures one proposer ({', '.join(BATCH_PROPOSERS)}) against target-only, "
                         f"not {','.join(plan.proposers)}",
                         hint="one --proposer a run, e.g. --proposer draft; mtp in a run without --batch-size")
    if records:
        raise UsageError("--batch-size takes no --records", hint="drop --records, or --batch-size")
    if 0 in plan.ks:
        raise UsageError("--batch-size: k 0 is target-only, which every batch size measures already",
                         hint="list the k of the speculative runs, e.g. --k 2,4")
    return sizes


def batch_bench(settings_for, prompts: list[str], plan, sizes: tuple[int, ...], encoding, allow_pickle: bool,
                quiet: bool, output_format: Format) -> None:
    """Batches at each size (core/bench/batches.py), at the sweep's first temperature, each with
    the profile's coupling, drafted by the plan's one proposer (BATCH_PROPOSERS); the JSON document
    or the table, as bench prints its own."""
    from specgen.cli.loading import collector_paused, load_engine

    with collector_paused():
        from specgen.core.bench import batches, floors
    temperature = plan.temperatures[0]
    start = time.perf_counter()
    proposer = plan.proposers[0]
    engine = load_engine(settings_for(max(plan.ks), temperature, proposer), allow_pickle, status=not quiet,
                         proposers=(proposer,))
    startup = time.perf_counter() - start
    encode = encoding.for_engine(engine)
    ids = [encode(text) for text in prompts]
    checker = engine.decoder(settings_for(max(plan.ks), temperature, proposer))
    for one in ids:  # a prompt the context cannot hold at the largest k: one error before anything runs
        checker.check_prompt(one)
    results, incomplete = [], False
    bandwidth = floors.copy_bandwidth(engine.pair.device)  # before any timing: it empties torch's cache
    with progress_bar(render.stderr_console(), enabled=not quiet and sys.stderr.isatty()) as bar:
        task = bar.add_task("batches", total=len(sizes) * (sum(len(plan.shapes(k)) for k in plan.ks) + 1))
        try:
            for size in sizes:
                results += batches.measure(engine, ids, settings_for, (size,), plan.ks, temperature, plan.warmup,
                                           lambda steps, label: bar.update(task, advance=steps, description=label),
                                           bandwidth, proposer, plan.shapes)
        except KeyboardInterrupt:
            incomplete = True
    document = batches.document(results, engine, temperature, startup, len(ids),
                                engine.profile.sampling.max_tokens, incomplete, bandwidth, proposer)
    if not incomplete:
        keep_batch_measured(document, engine.profile.runtime.measured)
    emit(document, output_format, quiet, show_batches)


def show_batches(document: dict, console: Console) -> None:
    """A batch bench's table: per batch size, target-only then each k (tok/s, the row's ms per
    token, × target-only, the round's device ms, its floor and the round over it: "–" where the
    bandwidth is not known, off CUDA), then per batch size the choice, and where speculation stops
    paying."""
    env = document["environment"]
    t = document["temperature"]
    console.print(f"{document['profile']} · batches · {document.get('proposer', 'draft')} · "
                  f"{document['prompts']} prompts × {document['max_tokens']} tokens"
                  f" · T={t:g}{' ' + document['coupling'] if document['coupling'] else ''} · {env['device']}"
                  + (" · INCOMPLETE (interrupted)" if document["incomplete"] else ""), soft_wrap=True)
    grid = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("batch", "method", "tok/s", "row ms/tok", "× target-only", "mean len"):
        grid.add_column(name, justify="left" if name == "method" else "right", no_wrap=True)
    base = {r["batch_size"]: r["tokens_per_second"] for r in document["results"] if r["method"] == "target-only"}
    for r in document["results"]:
        ratio = r["tokens_per_second"] / base[r["batch_size"]] if base.get(r["batch_size"]) else None
        row_ms = (r["row_ms_per_token"] or {}).get("median")
        grid.add_row(str(r["batch_size"]), _method(r), f"{r['tokens_per_second']:.1f}", _or_dash(row_ms, "{:.2f}"),
                     _or_dash(ratio, "{:.2f}×"), _or_dash(r["mean_accepted_length"], "{:.2f}"))
    console.print(grid)
    if any(r.get("decoder") == "single" for r in document["results"]):
        console.print(Text("batch 1: the prompts one after another through the single-prompt decoder, "
                           "as generate runs them at batch 1", style="dim"), soft_wrap=True)
    show_batch_floors(document, console)
    for line in batch_recommendation_lines(document):
        console.print(line, soft_wrap=True)


def show_batch_floors(document: dict, console: Console) -> None:
    """Each run's rounds against their floor (core/bench/floors.py, batch_bytes): a round's device
    ms, the floor's GB and ms, and the round over it; "–" where it is not known (the floor's ms
    off CUDA, where the copy bandwidth is not measured)."""
    bandwidth = (document.get("floor") or {}).get("copy_bandwidth_bytes_per_s")
    console.print("rounds against their floor: the weights streamed once a step, and each row's keys and values"
                  + (f" at {bandwidth / 1e9:,.0f} GB/s" if bandwidth else " (– : no bandwidth measured off CUDA)"),
                  soft_wrap=True)
    grid = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("batch", "method", "rows/round", "round ms", "floor GB", "floor ms", "× floor"):
        grid.add_column(name, justify="left" if name == "method" else "right", no_wrap=True)
    for r in document["results"]:
        parts = r.get("round_floor_bytes")
        gb = sum(v for v in parts.values() if v is not None) / 1e9 if parts else None
        grid.add_row(str(r["batch_size"]), _method(r), _or_dash(r.get("rows_per_round"), "{:.1f}"),
                     _or_dash(r.get("round_ms"), "{:.2f}"), _or_dash(gb, "{:.3g}"),
                     _or_dash(r.get("round_floor_ms"), "{:.2f}"), _or_dash(r.get("round_over_floor"), "{:.2f}×"))
    console.print(grid)


def _method(result: dict) -> str:
    return "target-only" if result["method"] == "target-only" else shape_label(result)


def _or_dash(value: float | None, form: str) -> str:
    return form.format(value) if value is not None else "–"


def batch_recommendation_lines(document: dict) -> list[Text]:
    lines = []
    for rec in document["recommendations"]:
        line = Text(f"batch {rec['batch_size']}: ", style="bold")
        line.append(rec["choice"], style="bold green" if rec["speculation_pays"] else "bold red")
        line.append(f"  (best {rec.get('best', 'k=' + str(rec['best_k']))}: {rec['speculative_tokens_per_second']:.1f} tok/s, "
                    f"{rec['speedup']:.2f}× target-only's {rec['target_only_tokens_per_second']:.1f})"
                    if rec["speedup"] is not None else "")
        lines.append(line)
    stops = document["speculation_stops_paying_at"]
    lines.append(Text(f"speculation stops paying at batch {stops}" if stops is not None
                      else "speculation pays at every batch size measured", style="bold"))
    kept = document.get("measured")
    if kept and kept["path"]:
        lines.append(Text(f"measured: {kept['rows']} rows kept in {kept['path']} for batch_size auto", style="dim"))
    elif kept:
        lines.append(Text(f"measured: not kept for batch_size auto ({kept['error']})", style="yellow"))
    return lines


def record_measured(document: dict, save) -> None:
    """Run save() -> (path, rows) and note in the document's `measured` where the rows went, or
    why they did not (an unwritable folder is reported, never fatal)."""
    try:
        path, rows = save()
    except OSError as error:
        document["measured"] = {"path": None, "rows": 0, "error": f"{error.strerror}: {error.filename}"}
        return
    document["measured"] = {"path": str(path), "rows": rows, "error": None}


def keep_batch_measured(document: dict, folder: str) -> None:
    """A complete batch bench's rows into the measured facts `batch_size` auto reads
    (core/measured.py); the document's `measured` says where (or why not), as the sweep's does."""
    from specgen.core import measured

    record_measured(document, lambda: measured.save_batches(folder, document))


def validate(settings_for, plan, named: bool) -> None:
    """Every (proposer, k, temperature) through the profile's own checks (a proposer kind the settings
    do not define; one the profile cannot run, such as draft without [draft]), and the checkpoints
    they need on disk, before torch is imported and any model loads. The target-only kind is the baseline, not a proposer to compare.
    named: the proposers came from --proposer (else the profile's own)."""
    from specgen.core.errors import UsageError

    for proposer in plan.proposers:
        for k in plan.ks:
            for temperature in plan.temperatures:
                for tree in plan.shapes(k):
                    settings_for(k, temperature, proposer, tree)
        for tree in plan.trees:  # a node budget no (k, width) holds: the profile's error, at the largest k
            if tree and not any(shape and shape[1] == tree[1] for k in plan.ks for shape in plan.shapes(k)):
                settings_for(max(plan.ks), plan.temperatures[0], proposer, tree)
        if settings_for(plan.ks[0], plan.temperatures[0], proposer).proposer.kind == "none":
            what = f"--proposer {proposer}" if named else "the profile's proposer (none)"
            raise UsageError(f"{what} drafts nothing: it is the target-only baseline",
                             hint="pass --proposer with proposers that draft; target-only runs as "
                                  "--baseline target-only")
    from specgen.cli.loading import check_before_loading

    check_before_loading(engine_settings(settings_for, plan), plan.proposers)


def engine_settings(settings_for, plan):
    """The settings the engine loads with (the first proposer's); the engine loads what every
    proposer of the plan drafts with (Engine's `proposers`)."""
    return settings_for(plan.ks[0], plan.temperatures[0], plan.proposers[0])


@dataclass(frozen=True)
class Encoding:
    """How bench turns a prompt's text into ids: --chat / --system, and --truncate-prompt, which
    keeps the end that fits at the sweep's largest k (`settings`)."""

    chat: bool
    system: str | None
    truncate: bool
    settings: object

    def for_engine(self, engine):
        from specgen.cli.prompts import prompt_ids

        return lambda text: prompt_ids(engine, self.settings, text, self.chat, self.system, self.truncate)


def measure(settings_for, prompts: list[str], plan, encoding: Encoding, allow_pickle: bool, quiet: bool) -> dict:
    """Load the pair (timed: the document's startup_seconds) and run the sweep; the engine is
    released on return, before a float32 check loads a second copy."""
    from specgen.cli.loading import collector_paused, load_engine

    with collector_paused():  # torch and transformers before the clock: startup_seconds is the loading
        from specgen.core.bench.run import Bench
    start = time.perf_counter()
    engine = load_engine(engine_settings(settings_for, plan), allow_pickle, status=not quiet,
                             proposers=tuple(plan.proposers))
    startup = time.perf_counter() - start
    # Settings that leave no room for any prompt: one error with its hint, not a warning per prompt.
    engine.decoder(encoding.settings).check_prompt([0])
    warn = (lambda message: None) if quiet else (lambda message: print(f"specgen: warning: {message}", file=sys.stderr))
    runner = Bench(engine, prompts, settings_for, plan, warn=warn, startup_seconds=startup,
                   encode=encoding.for_engine(engine))
    with progress_bar(render.stderr_console(), enabled=not quiet and sys.stderr.isatty()) as bar:
        task = bar.add_task("bench", total=runner.total_steps)
        runner.progress = lambda steps, label: bar.update(task, advance=steps, description=label)
        return runner.run()


def keep_measured(document: dict, folder: str) -> None:
    """What tree_width auto would choose from this run alone (the document's `auto`), and this
    run's rows into the measured facts later runs' auto reads (core/measured.py): the document's
    `measured` says where (or why not), and the footer shows it."""
    from specgen.core import measured

    document["auto"] = measured.auto_from_bench(document)
    record_measured(document, lambda: measured.save(folder, document))


def fp32_sweeps(plan) -> tuple:
    """The sweeps whose text must equal target-only's: greedy, and sampled with Gumbel coupling."""
    return tuple((t, c) for t, c in plan.sweeps() if c in (None, "gumbel"))


def wants_fp32_check(option: bool | None, plan, document: dict) -> bool:
    """--fp32-check, or by default: greedy or Gumbel coupling is in the sweep and the models ran in
    another dtype."""
    if option is not None:
        return option and bool(fp32_sweeps(plan))
    return bool(fp32_sweeps(plan)) and document["environment"]["dtype"] != "float32"


def run_fp32_check(profile, overrides: dict, prompts: list[str], plan, encoding: Encoding, allow_pickle: bool,
                   quiet: bool):
    """The float32 check on a second load of the pair (it is not timed); None after Ctrl-C."""
    import gc

    import torch

    from specgen.cli.loading import load_engine
    from specgen.core.bench.run import fp32_check
    from specgen.core.profile import load_profile

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    fp32 = {**overrides, "target.dtype": "float32", "draft.dtype": "float32"}

    def settings_for(k: int, temperature: float, proposer: str | None = None, tree: tuple | None = None):
        return load_profile(profile, {**fp32, "speculation.k": k, "sampling.temperature": temperature,
                                      "proposer.kind": proposer, **tree_overrides(tree)})

    err = render.stderr_console()
    try:
        engine = load_engine(engine_settings(settings_for, plan), allow_pickle, status=not quiet,
                             proposers=tuple(plan.proposers))
        with progress_bar(err, enabled=not quiet and sys.stderr.isatty()) as bar:
            sweeps = fp32_sweeps(plan)
            runs = len(plan.proposers) * sum(len(plan.shapes(k)) for k in plan.ks) + 1
            task = bar.add_task("float32 check", total=len(prompts) * runs * len(sweeps))
            return fp32_check(engine, prompts, settings_for, plan.ks, encode=encoding.for_engine(engine), sweeps=sweeps,
                              proposers=plan.proposers, shapes=plan.shapes,
                              progress=lambda steps, label: bar.update(task, advance=steps, description=label))
    except KeyboardInterrupt:
        return None


def parse_trees(widths: str | None, nodes: str | None) -> tuple:
    """--tree-width and --tree-nodes as the plan's tree shapes; neither given: the profile's own."""
    from specgen.core.bench.bench_plan import tree_shapes

    from specgen.core.errors import UsageError

    if widths is None and nodes is None:
        return (None,)
    if widths is None:
        raise UsageError("--tree-nodes sizes a tree, and no --tree-width was given",
                         hint="add --tree-width, e.g. --tree-width 2,4 --tree-nodes 8,16")
    return tree_shapes(parse_list(widths, int, "--tree-width"), parse_list(nodes or "0", int, "--tree-nodes"))


def tree_overrides(tree: tuple | None) -> dict:
    if tree is None:
        return {}
    return {"speculation.tree_width": tree[0], "speculation.tree_nodes": tree[1]}


def parse_list(text: str, kind, option: str) -> tuple:
    from specgen.core.errors import UsageError

    example = "1,2,4" if kind is int else "0,0.8"
    try:
        values = tuple(kind(part) for part in opt.comma_list(text, option, example))
    except ValueError:
        raise UsageError(f"{option} takes a comma list of numbers, got {text!r}", hint=f"e.g. {option} {example}") from None
    return tuple(dict.fromkeys(values))


COUPLINGS = ("rejection", "gumbel")


def parse_couplings(text: str | None, default: str) -> tuple[str, ...]:
    from specgen.core.errors import UsageError

    if text is None:
        return (default, *(c for c in COUPLINGS if c != default))
    names = tuple(dict.fromkeys(opt.comma_list(text, "--coupling", "rejection,gumbel")))
    unknown = [n for n in names if n not in COUPLINGS]
    if unknown:
        raise UsageError(f"unknown coupling {unknown[0]!r}", hint="choose from rejection, gumbel (comma list)")
    return names


def parse_names(text: str | None, option: str) -> tuple[str, ...]:
    """A comma list of names, in order, without repeats; () when the option was not given. The names
    themselves are checked by the profile (bench's validate)."""
    if text is None:
        return ()
    return tuple(dict.fromkeys(opt.comma_list(text, option, "draft,ngram")))


def parse_baselines(text: str) -> tuple[str, ...]:
    from specgen.core.bench.bench_plan import BASELINES
    from specgen.core.errors import UsageError

    if not text:  # --baseline "": the speculative runs alone
        return ()
    names = tuple(dict.fromkeys(opt.comma_list(text, "--baseline", "target-only,hf")))
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise UsageError(f"unknown baseline {unknown[0]!r}", hint=f"choose from {', '.join(BASELINES)}")
    return names


def bench_prompts(path: Path | None, settings, limit: int | None) -> list[str]:
    """--prompts-file, or the prompts.jsonl that the pair's recipe writes beside its target folder."""
    from specgen.cli.prompts import read_file, without_settings
    from specgen.core.errors import UsageError

    if path is None:
        path = Path(settings.target.path).expanduser().parent / "prompts.jsonl"
        if not path.is_file():
            raise UsageError(f"no prompts: the profile's pair has no prompts.jsonl (looked for {path})",
                             hint="give --prompts-file FILE (text lines or JSONL with a 'prompt' field)")
    prompts = [p.text for p in without_settings(read_file(path), "bench")]
    return prompts[:limit] if limit else prompts


def progress_bar(console: Console, enabled: bool):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True, disable=not enabled)


# -- rendering -------------------------------------------------------------------------------


def show(document: dict, console: Console) -> None:
    """The title, the table, what its marks mean, the recommendation and the notes. On a terminal
    too narrow for the table, it is split into as few tables as fit; off a terminal (a pipe, a log
    file) it stays one, as wide as its cells, and no line is wrapped. Cells never wrap."""
    grids = tables(document, console)
    needed = max(_width(grid, console) for grid in grids)
    if not console.is_terminal or needed > console.width:
        console.width = max(console.width, needed)  # wider than a terminal: it wraps lines, never a cell
    lines = (*legend_lines(document), *recommendation_lines(document), *footer_lines(document))
    console.print(title(document), soft_wrap=True)
    for grid in grids:
        console.print(grid)
    for line in lines:
        console.print(line, soft_wrap=not console.is_terminal)


SPEED = ("tok/s", "p25–p75", "decode tok/s")  # then one × column per baseline; then TTFT and (CUDA) peak memory
ACCEPTANCE = ("accept", "mean len", "per position", "round ms d/v/s/o", "same text")
TEXT_COLUMNS = ("proposer", "method", "per position", "same text")
BASELINE_CELLS = ("tok/s", "p25–p75", "decode tok/s", "TTFT ms", "peak MiB")  # n/a where a baseline did not run


def proposers(document: dict) -> list[str]:
    return document["settings"].get("proposers") or [document["profile"]["proposer"]]


def title(document: dict) -> str:
    env = document["environment"]
    return (f"{document['profile']['name']} · {len(document['prompts'])} prompts × "
            f"{document['settings']['max_tokens']} tokens · {env['device']} ({env['device_name']})"
            + (" · INCOMPLETE (interrupted)" if document["incomplete"] else ""))


def tables(document: dict, console: Console) -> list[Table]:
    """One table; on a terminal too narrow for it, as few as fit, each with the key columns (the
    temperature, the proposer where the bench compared several, the method). A proposer column only
    when the bench compared several."""
    keys, groups = _columns(document)
    rows = _rows(document)
    if not console.is_terminal:
        return [_grid((*keys, *(c for group in groups for c in group)), rows, "whole")]

    def fitted(columns: tuple[str, ...]) -> Table | None:
        return _fitted((*keys, *columns), rows, console)

    packed = _pack(groups, lambda columns: fitted(columns) is not None)
    return [fitted(columns) or _grid((*keys, *columns), rows, "wrapped") for columns in packed]


def _columns(document: dict) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The key columns, and the others in groups: speed, latency and memory, acceptance."""
    names = document["settings"]["baselines"]
    cuda = any(r["peak_gpu_memory_bytes"] is not None for r in document["results"])
    keys = ("T", "proposer", "method") if len(proposers(document)) > 1 else ("T", "method")
    floored = any(r.get("round_over_floor") is not None for r in document["results"])
    return keys, [(*SPEED, *(f"× {n}" for n in names)), ("TTFT ms", *(["peak MiB"] if cuda else [])),
                  ACCEPTANCE[:-1] + (("× floor",) if floored else ()) + ACCEPTANCE[-1:]]


def _rows(document: dict) -> list[tuple[dict, bool]]:
    """(cells, last of its sweep) per row: per sweep, the baselines, then the results."""
    names = document["settings"]["baselines"]
    rows = []
    sweeps = dict.fromkeys((r["temperature"], r.get("coupling")) for r in document["baselines"] + document["results"])
    for temperature, coupling in sweeps:
        def ours(entry, t=temperature, c=coupling) -> bool:
            return entry["temperature"] == t and entry.get("coupling") == c

        block = [_baseline_row(b) for b in document["baselines"] if ours(b)]
        block += [_result_row(r, names) for r in document["results"] if ours(r)]
        rows += [(row, i == len(block) - 1) for i, row in enumerate(block)]
    return rows


def _pack(groups: list[tuple[str, ...]], fits) -> list[tuple[str, ...]]:
    """The columns, in order, into as few tables as `fits` allows: whole groups where they fit, a
    group's columns one by one where it does not fit alone (a column that fits nowhere stands alone)."""
    packed, current = [], ()
    for group in groups:
        if fits(current + group):
            current += group
            continue
        if current:
            packed.append(current)
        current = group if fits(group) else ()
        for column in (() if current else group):
            if current and not fits(current + (column,)):
                packed.append(current)
                current = ()
            current += (column,)
    return packed + [current] if current else packed


def _fitted(columns: tuple[str, ...], rows: list[tuple[dict, bool]], console: Console) -> Table | None:
    """The table with whole headers, else with headers wrapped between words; None when neither fits."""
    for headers in ("whole", "wrapped"):
        grid = _grid(columns, rows, headers)
        if _width(grid, console) <= console.width:
            return grid
    return None


def _width(grid: Table, console: Console) -> int:
    return Measurement.get(console, console.options.update_width(100_000), grid).maximum


def _grid(columns: tuple[str, ...], rows: list[tuple[dict, bool]], headers: str) -> Table:
    """Every column as wide as its widest cell (and its header, or with headers="wrapped" the
    header's longest word), so that no cell wraps."""
    grid = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for column in columns:
        head = len(column) if headers == "whole" else max(len(word) for word in column.split())
        width = max(head, *(cell_len(str(row.get(column, ""))) for row, _ in rows))
        grid.add_column(column, justify="left" if column in TEXT_COLUMNS else "right", width=width)
    for row, last in rows:
        grid.add_row(*(row.get(column, "") for column in columns), end_section=last)
    return grid


def _sweep_label(entry: dict) -> str:
    """The temperature, and the coupling where it matters (sampled)."""
    coupling = entry.get("coupling")
    return f"{entry['temperature']:g}" + (f" {coupling}" if coupling else "")


def _baseline_row(base: dict) -> dict:
    row = {"T": _sweep_label(base), "method": Text(base["method"], style="dim")}
    if not base["available"]:  # the reason goes below the table (legend_lines)
        return row | dict.fromkeys(BASELINE_CELLS, "n/a")
    return row | {**_speed_cells(base), "TTFT ms": _ms(base["time_to_first_token_seconds"]),
                  "peak MiB": _mib(base["peak_gpu_memory_bytes"])}


def _result_row(result: dict, names: list[str]) -> dict:
    split = result["round_ms"]
    return {
        "T": _sweep_label(result), "proposer": result.get("proposer", ""), "method": shape_label(result),
        **_speed_cells(result),
        **{f"× {n}": f"{s['median']:.2f}×" if s else "n/a" for n, s in ((n, result["speedup"][n]) for n in names)},
        "TTFT ms": _ms(result["time_to_first_token_seconds"]), "peak MiB": _mib(result["peak_gpu_memory_bytes"]),
        "accept": f"{result['acceptance_rate']:.1%}", "mean len": f"{result['mean_accepted_length']:.2f}",
        "per position": render.position_bars(result["per_position_acceptance"]),
        "round ms d/v/s/o": "/".join(f"{split[p]:.1f}" for p in ("draft", "verify", "sample", "other")),
        "× floor": f"{result['round_over_floor']:.2f}×" if result.get("round_over_floor") is not None else "–",
        "same text": _same_text(result),
    }


def _speed_cells(entry: dict) -> dict[str, str]:
    tps, decode = entry["tokens_per_second"], entry.get("decode_tokens_per_second")
    return {"tok/s": f"{tps['median']:.1f}", "p25–p75": f"{tps['p25']:.1f}–{tps['p75']:.1f}",
            "decode tok/s": f"{decode['median']:.1f}" if decode else "–"}


def _ms(summary: dict | None) -> str:
    return f"{1000 * summary['median']:.1f}" if summary else "–"


def _mib(value: int | None) -> str:
    return f"{value / 2**20:.0f}" if value is not None else "–"


def _agreement(result: dict) -> dict | None:
    """The row's comparison of texts: greedy, or sampled with Gumbel coupling; none under rejection
    coupling, whose text is not expected to be target-only's."""
    if result.get("coupling") == "rejection":
        return None
    return result["greedy_agreement"] or result.get("sampled_agreement")


def _same_text(result: dict) -> str:
    """The share of prompts whose tokens are all the reference's (_reference), and the earliest
    divergence; `–` where there is no comparison."""
    agreement = _agreement(result)
    if not agreement:
        return "–"
    entry = agreement[_reference(agreement)]
    cut = [d for d in entry["first_divergence"] if d is not None]
    return f"{entry['identical_fraction']:.0%}" + (f" (tok {min(cut)})" if cut else "")


def _reference(agreement: dict) -> str:
    """target-only, else the first greedy baseline."""
    return "target-only" if "target-only" in agreement else next(iter(agreement))


def legend_lines(document: dict) -> list[Text]:
    """What the table's marks mean: the `same text` figures and dashes, and why a cell is n/a."""
    results, lines = document["results"], []
    compared = next((_reference(a) for a in map(_agreement, results) if a), None)
    if compared is not None:
        lines.append(f"same text: the share of prompts whose tokens are all {compared}'s "
                     "(tok N: the earliest divergence)")
    if any(r["temperature"] > 0 and r.get("coupling") == "rejection" for r in results):
        lines.append("same text –: rejection coupling: same distribution, not the same text")
    missing: dict[tuple[str, str], list[str]] = {}
    for base in document["baselines"]:
        if not base["available"]:
            missing.setdefault((_sweep_label(base), base["reason"]), []).append(base["method"])
    lines += [f"n/a: {', '.join(methods)} at T={sweep}: {reason}" for (sweep, reason), methods in missing.items()]
    return [Text(line, style="dim") for line in lines]


def recommendation_lines(document: dict) -> list[Text]:
    """Per sweep, the recommended k (and tree shape, where the sweep ran trees), or no speculation
    where target-only was faster; with several proposers, the recommended proposer and k, then each
    proposer's best k, indented. Each says the statistic it was chosen by, and where another row
    has the highest median tok/s, which one. Then what tree_width auto would choose from these
    measurements (auto_lines)."""
    several = len(proposers(document)) > 1
    trees = any(r.get("tree_width", 1) > 1 for r in document["results"])
    lines = []
    for rec in document["recommendation"]:
        coupling = f" ({rec['coupling']} coupling)" if rec.get("coupling") else ""
        sweep = f"at temperature {rec['temperature']:g}{coupling}: "
        what = ("proposer and k" if several else "k") + (" and tree shape" if trees else "")
        lines += [_recommendation(f"recommended {what} {sweep}", recommended_choice(rec, several, trees), rec),
                  *_fastest(document, rec, "  " if several else "")]
        if several:
            lines += [_recommendation(f"  best k for {each['proposer']}: ", shape_choice(each, trees), each)
                      for each in document["recommendation_per_proposer"]
                      if (each["temperature"], each.get("coupling")) == (rec["temperature"], rec.get("coupling"))]
    return lines + auto_lines(document)


def recommended_choice(rec: dict, several: bool, trees: bool) -> str:
    """The recommended row: `4`, `k=4 (a chain)` or `k=4 w=2 n=8 (a tree)` where the sweep ran trees,
    the proposer first where several ran (`draft k=4`). Where no row beat target-only, the line
    says so after it (_recommendation), and the JSON's `shape` is none."""
    if several:
        return f"{rec['proposer']} {shape_label(rec)}" + (_kind(rec) if trees else "")
    return shape_choice(rec, trees)


def shape_choice(rec: dict, trees: bool) -> str:
    """A row's shape as a recommendation names it: its k alone where the sweep ran chains only."""
    return shape_label(rec) + _kind(rec) if trees else shape_label(rec).removeprefix("k=")


def _kind(rec: dict) -> str:
    return " (a chain)" if rec.get("tree_width", 1) == 1 else " (a tree)"


def auto_lines(document: dict) -> list[Text]:
    """What tree_width / tree_nodes auto would choose from this bench's measurements alone (the
    document's `auto`; core/tree_cost.py), where the sweep ran trees."""
    if not any(r.get("tree_width", 1) > 1 for r in document["results"]):
        return []
    return [Text(f"tree_width auto at temperature {each['temperature']:g}"
                 + (f" ({each['coupling']} coupling)" if each.get("coupling") else "") + f", k={each['k']}: "
                 + each["reason"], style="dim") for each in document.get("auto") or []]


def _recommendation(head: str, choice: str, rec: dict) -> Text:
    line = Text(head, style="bold")
    line.append(choice, style="bold green" if rec["faster_than_target_only"] is not False else "bold red")
    if rec["speedup"] is not None:
        line.append(f"  (best median × {rec['by'].removeprefix('speedup.')}: {rec['speedup']:.2f}×, "
                    f"at {rec['tokens_per_second']:.1f} tok/s")
    else:
        line.append(f"  (best median tok/s: {rec['tokens_per_second']:.1f}")
    if rec["faster_than_target_only"] is False:
        line.append("; speculation does not pay off here: use target-only, --proposer none")
    line.append(")")
    return line


def _fastest(document: dict, rec: dict, indent: str) -> list[Text]:
    """A line when the recommended row, chosen by its median ratio, is not the one of highest
    median tok/s: a ratio pairs each prompt with its own baseline run, so the two can disagree."""
    if rec["speedup"] is None:
        return []
    rows = [r for r in document["results"]
            if (r["temperature"], r.get("coupling")) == (rec["temperature"], rec.get("coupling"))]
    fastest = max(rows, key=lambda r: r["tokens_per_second"]["median"])
    if (fastest.get("proposer"), shape_label(fastest)) == (rec.get("proposer"), shape_label(rec)):
        return []
    against = rec["by"].removeprefix("speedup.")
    ratio = (fastest["speedup"].get(against) or {}).get("median")
    name = f"{fastest['proposer']} {shape_label(fastest)}" if len(proposers(document)) > 1 else shape_label(fastest)
    return [Text(f"{indent}{name} has the highest median tok/s ({fastest['tokens_per_second']['median']:.1f}) but "
                 f"a lower median × {against} ({f'{ratio:.2f}×' if ratio is not None else 'n/a'}): the ratio is "
                 f"taken prompt by prompt, against the same prompt's {against} run", style="dim")]


def footer_lines(document: dict) -> list[Text]:
    """Notes, the float32 check, skipped prompts and an interruption, one line each."""
    lines = [Text(f"note: {note}", style="yellow") for note in document["notes"]]
    check = document["fp32_check"]
    several = len(proposers(document)) > 1
    if check is not None:
        for temperature, coupling in dict.fromkeys((r.get("temperature", 0.0), r.get("coupling"))
                                                   for r in check["results"]):
            parts = []
            for row in check["results"]:
                if (row.get("temperature", 0.0), row.get("coupling")) != (temperature, coupling):
                    continue
                cut = [d for d in row["first_divergence"] if d is not None]
                named = f"{row['proposer']} " if several else ""
                parts.append(f"{named}{shape_label(row)} {row['identical_fraction']:.0%}"
                             + (f" (from tok {min(cut)})" if cut else ""))
            what = "greedy" if coupling is None else f"T={temperature:g} {coupling}"
            lines.append(Text(f"{what} same as target-only in float32 ({check['device']}): " + ", ".join(parts)))
        for fallback in check.get("fallbacks") or []:
            lines.append(Text(f"float32 check: {fallback}", style="yellow"))
    kept = document.get("measured")
    if kept and kept["path"]:
        lines.append(Text(f"measured: {kept['rows']} rows kept in {kept['path']} for tree_width auto", style="dim"))
    elif kept:
        lines.append(Text(f"measured: not kept for tree_width auto ({kept['error']})", style="yellow"))
    for skipped in document["skipped_prompts"]:
        lines.append(Text(f"skipped prompt {skipped['index'] + 1}: {skipped['reason']}", style="dim"))
    if document["incomplete"]:
        lines.append(Text("interrupted: the table holds only the prompts every method finished", style="bold red"))
    return lines
