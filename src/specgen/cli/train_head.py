"""`specgen train-head`: train an EAGLE-3 head for the profile's target (core/train/train_head.py).

Every option, the profile and the data are checked before torch is imported. stdout gets the
result (where the head is, its simulated acceptance; `--format json`: report.json); a progress
bar with step, loss and the simulated acceptance length at k = 4 goes to stderr on a terminal,
a summary line elsewhere, nothing with --quiet. Ctrl-C saves the head trained so far (the report
says it is incomplete) and exits 130.
"""

from __future__ import annotations

import enum
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from specgen.cli import options as opt
from specgen.cli import render

_training, _data = opt._panel("Training"), opt._panel("Data")


class Format(str, enum.Enum):
    text = "text"
    json = "json"


def train_head(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the head, its profile and report.json.")],
    profile: opt.Profile = None,
    target: opt.Target = None,
    data: Annotated[Optional[Path], _data(
        "--data", help="Text file, folder of text files, or JSONL ('text' or 'prompt'); default: a "
        "make_pair pair's own training corpus.")] = None,
    regenerate: Annotated[bool, _data(
        "--regenerate/--no-regenerate", help="Train on the target's own continuations of the data.")] = False,
    eval_prompts: Annotated[int, _data("--eval-prompts", help="Held-out prompts that measure acceptance.")] = 16,
    minutes: Annotated[float, _training("--minutes", help="Wall-time cap of the whole command.")] = 5.0,
    steps: Annotated[int, _training("--steps", help="Training steps; 0 = as many as --minutes allows.")] = 0,
    batch_size: Annotated[Optional[int], _training(
        "--batch-size", help="Sequences per step (default: 16 on CUDA, 4 on the CPU).")] = None,
    seq_len: Annotated[Optional[int], _training(
        "--seq-len", help="Tokens per sequence (default: 1024 on CUDA, 256 on the CPU).")] = None,
    lr: Annotated[float, _training("--lr", help="Peak learning rate (warmup, then cosine to 10%).")] = 1e-3,
    warmup_steps: Annotated[int, _training(
        "--warmup-steps", help="Steps of linear warmup to the peak learning rate.")] = 50,
    ttt_steps: Annotated[int, _training(
        "--ttt-steps", help="Drafting steps unrolled in training (training-time test).")] = 4,
    layers: Annotated[Optional[str], _training(
        "--layers", help="Three target layer ids to read, e.g. 2,6,9 (default: EAGLE-3's 2, N/2, N-3).")] = None,
    draft_vocab: Annotated[Optional[int], _training(
        "--draft-vocab", help="Draft vocabulary: the most frequent ids (default: 32000 or the target's).")] = None,
    init_from_target: Annotated[bool, _training(
        "--init-from-target/--random-init", help="Start lm_head and norm from the target's.")] = True,
    seed: Annotated[int, _training("--seed", help="Seed of the head's weights and the data order.")] = 0,
    device: opt.Device = None,
    dtype: opt.Dtype = None,
    threads: opt.Threads = None,
    download: opt.Download = None,
    trust_remote_code: opt.TrustRemoteCode = False,
    allow_pickle: opt.AllowPickle = False,
    output_format: Annotated[Format, opt.output_option(
        "--format", "-f", help="text | json (report.json).")] = Format.text,
    quiet: opt.Quiet = False,
) -> None:
    """Train an EAGLE-3 draft head for the profile's target; stdout gets where it is and its acceptance."""
    from specgen.core.drafters import head_folder
    from specgen.core.train import train_plan
    from specgen.core.profile import load_profile

    started = time.perf_counter()
    plan = train_plan.TrainPlan(
        minutes=minutes, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, warmup_steps=warmup_steps,
        ttt_steps=ttt_steps,
        layers=train_plan.parse_layers(layers), draft_vocab=draft_vocab, seed=seed, regenerate=regenerate,
        init_from_target=init_from_target, eval_prompts=eval_prompts)
    head_folder.check(out)
    written = load_profile(profile, opt.overrides(target=target))
    settings = load_profile(profile, opt.overrides(target=target, device=device, dtype=dtype, threads=threads,
                                                   download=download, trust_remote_code=trust_remote_code))
    config = train_plan.local_target_config(settings.target.path)
    if config is not None and isinstance(config.get("num_hidden_layers"), int) and isinstance(
            config.get("vocab_size"), int):
        context = config.get("max_position_embeddings")
        plan.check_against_target(config["num_hidden_layers"], config["vocab_size"],
                                  context if isinstance(context, int) else None)
    texts = read_data(data, settings.target.path)
    command = shlex.join(["specgen", "train-head", *sys.argv[2:]]) if sys.argv[1:2] == ["train-head"] else None
    document = run(settings, plan, texts, out, started, written, command, allow_pickle, quiet)
    show(document, out, output_format)
    if not document["complete"]:
        raise typer.Exit(130)


def read_data(data: Path | None, target_path: str):
    """--data, or the training corpus of the make_pair pair the target belongs to."""
    from specgen.core.train import corpus
    from specgen.core.errors import UsageError

    if data is not None:
        return corpus.Data(*corpus.read_data(data))
    pair = corpus.pair_corpus(target_path)
    if pair is None:
        raise UsageError("--data is needed: the target is not a pair made by benchmarks/make_pair.py, whose "
                         "training corpus train-head would read", hint="give --data FILE|FOLDER|FILE.jsonl")
    return corpus.Data(*corpus.pair_texts(*pair))


def run(settings, plan, texts, out: Path, started: float, written, command, allow_pickle: bool, quiet: bool) -> dict:
    from specgen.cli.loading import collector_paused

    with render.startup_status(enabled=not quiet), collector_paused():  # torch's import, as the others do
        from specgen.core.train.train_head import train_head as train

    console = render.stderr_console()
    live = not quiet and render.can_draw(console)
    with progress_bar(console, live, plan) as update:
        document = train(settings, plan, texts, out, started, update, written, command, allow_pickle)
    if not quiet:
        console.print(summary(document), style="dim", highlight=False, markup=False)
    return document


def progress_bar(console, enabled: bool, plan):
    """A context manager yielding the trainer's progress callback: a Rich bar on a terminal."""
    import contextlib

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    @contextlib.contextmanager
    def bar():
        if not enabled:
            yield lambda progress: None
            return
        columns = (TextColumn("train-head"), BarColumn(), TextColumn("step {task.fields[step]}"),
                   TextColumn("loss {task.fields[loss]}"), TextColumn("accept@4 {task.fields[accept]}"),
                   TimeElapsedColumn(), TextColumn("{task.fields[left]}"))
        with Progress(*columns, console=console, transient=True) as view:
            task = view.add_task("train", total=plan.steps or 1.0, step=0, loss="–", accept="–", left="")

            def update(progress) -> None:
                done = progress.step if plan.steps else min(1.0, progress.elapsed / progress.budget)
                accept = f"{progress.acceptance[3]:.2f}" if len(progress.acceptance) >= 4 else "–"
                loss = f"{progress.loss:.3f}" if progress.loss == progress.loss else "–"
                view.update(task, completed=done, step=progress.step, loss=loss, accept=accept,
                            left=time_left(progress.remaining))

            yield update

    return bar()


def time_left(seconds: float | None) -> str:
    """The progress bar's estimate, from the steps measured so far (Rich's own needs a step every
    few seconds, which a large target on a CPU does not make)."""
    if seconds is None:
        return "estimating the time left"
    minutes, secs = divmod(round(seconds), 60)
    return f"~{minutes // 60}:{minutes % 60:02d}:{secs:02d} left"


def summary(document: dict) -> str:
    state = "" if document["complete"] else " (interrupted)"
    line = (f"trained {document['steps']} steps in {document['train_seconds']:.0f} s{state}: loss "
            f"{document['loss']['last'] if document['loss']['last'] is not None else 'n/a'}, simulated acceptance "
            f"length at k=4 {document['simulated_acceptance']['4']:.2f}")
    note = divergence_note(document["divergence"])
    return f"{line}; {note}" if note else line


def divergence_note(divergence: dict) -> str | None:
    """What report.json's "divergence" says, in a clause; None when the loss never diverged."""
    if divergence["stopped"]:
        return f"training stopped early: {divergence['stopped']}"
    if divergence["lr_drops"]:
        first, last = divergence["lr_drops"][0], divergence["lr_drops"][-1]
        return (f"the loss diverged at step {first['step']} ({first['loss']:g}, lowest {first['lowest']:g}): "
                f"learning rate lowered to {last['lr']:.3g}")
    return None


def show(document: dict, out: Path, output_format: Format) -> None:
    if output_format == Format.json:
        sys.stdout.write(json.dumps(document) + "\n")
        return
    lines = [f"head: {out}", f"profile: {out / 'profile.toml'}",
             "simulated acceptance length, k = 1..8: "
             + " ".join(f"{v:.2f}" for v in document["simulated_acceptance"].values())]
    note = divergence_note(document["divergence"])
    if note:
        lines.append(f"note: {note} (report.json: divergence)")
    if "draft_model_simulated_acceptance" in document:
        lines.append("the profile's draft model, same simulation: "
                     + " ".join(f"{v:.2f}" for v in document["draft_model_simulated_acceptance"].values()))
    sys.stdout.write("\n".join(lines) + "\n")
