"""`specgen tune-kernels`: time the linear kernel's configurations for a profile's pair on this GPU
(the draft model's shapes when the proposer runs it, the EAGLE-3 head's when it drafts).

Writes the winners to the profile's [kernels] tables folder (default $XDG_CACHE_HOME/specgen/kernels,
gpu/tuning/linear_table.py), where every later run on this machine reads them. Shapes tuned before for
another pair stay in the file. stdout gets one line per shape: the chosen configurations and their
time against the package's choice.

With a draft model (and --in-step, the default), the draft's one-row picks are then chosen again
inside its captured one-token step (gpu/tuning/tune.py's tune_in_step): a projection's fastest
configuration alone is not always its fastest between the step's other kernels. That loads the
draft's weights and takes a few minutes; stdout gets a line per pick it changes and the step's
time before and after.

With --launches (the default), the target's tensor-core picks then get their launches for tall calls
(more than 32 rows: a prompt's prefill chunks, a tree's nodes, a batch's rows): the fastest spread
over programs that keeps each row's bits, per row class (gpu/tuning/tune.py's tune_launches); stdout
gets a line per shape and row class.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from specgen.cli import options as opt
from specgen.core.errors import UsageError


def tune_kernels(
    profile: opt.Profile = None,
    rows: Annotated[str, typer.Option("--rows", help="Step sizes timed, comma-separated (default: 1, the "
                                      "profile's k + 1, its tree's rows and its batch's rows).")] = "",
    download: opt.Download = None,
    in_step: Annotated[bool, typer.Option("--in-step/--no-in-step", help="Choose the draft model's one-row "
                                          "configurations inside its captured step (loads the draft).")] = True,
    launches: Annotated[bool, typer.Option("--launches/--no-launches", help="Time the target's tall calls "
                                           "(over 32 rows) in launches that keep each row's bits.")] = True,
) -> None:
    """Time the linear kernel's configurations for the profile's target, draft and head shapes; keep the fastest."""
    from specgen.core.profile import load_profile

    settings = load_profile(profile, opt.overrides(download=download))
    if no_gpu_visible():  # told in a millisecond; torch's answer takes seconds of imports
        raise _no_gpu()
    sizes = _rows(rows, settings)
    import torch

    if not torch.cuda.is_available():
        raise _no_gpu()
    # progress on stderr, each shape as it is done (the whole takes minutes); the report on stdout
    table, lines = run(settings, sizes, torch.device("cuda"), in_step=in_step, launches=launches,
                       progress=lambda line: print(f"specgen: {line}", file=sys.stderr, flush=True))
    for line in lines:
        typer.echo(line)
    typer.echo(f"written: {table}")


def _no_gpu() -> UsageError:
    return UsageError("tune-kernels times the kernels on a CUDA GPU, and none is visible",
                      hint="Run it on the machine (and GPU) that runs specgen.")


def no_gpu_visible(root: Path = Path("/"), environ=None) -> bool:
    """Whether torch will certainly see no CUDA GPU, told without importing it: CUDA_VISIBLE_DEVICES
    hides every device ("" or a first entry of -1), or a Linux machine has neither NVIDIA's driver
    (proc/driver/nvidia) nor its device files (dev/nvidia0, ...), nor WSL's (dev/dxg) or ROCm's
    (dev/kfd) GPU device, through which torch.cuda also finds GPUs. Elsewhere (Windows) torch decides.
    root and environ: the file system and environment looked at (tests)."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.split(",")[0].strip() in ("", "-1"):
        return True
    if not sys.platform.startswith("linux"):
        return sys.platform == "darwin"  # no CUDA build of torch runs on macOS
    devices = ("proc/driver/nvidia", "dev/dxg", "dev/kfd")
    return not any((root / path).exists() for path in devices) and not any((root / "dev").glob("nvidia[0-9]*"))


def _rows(text: str, settings) -> tuple[int, ...]:
    """The row counts timed: --rows, else the ones the profile's runs call the target with: 1
    (target-only steps, prefill's last chunk), k + 1 (a verification), a tree's nodes + 1 (tree_width
    > 1 with a set tree_nodes) and a batch's B x (k + 1) (a set batch_size > 1). Why all of them: the
    table keeps one configuration per shape for every row count (a row's bits must not depend on
    it), and one fastest at 1 and k + 1 rows may compute a tree's or a batch's rows one after
    another (docs/benchmarks.md, "Batches (H200)": the bench target's matrix-vector picks)."""
    from specgen.gpu.kernels.linear import BATCH_ROWS  # noqa: PLC0415 (Triton only once the options are valid)

    if text:
        try:
            sizes = tuple(int(part) for part in opt.comma_list(text, "--rows", "1,5"))
        except ValueError:
            raise UsageError(f"--rows {text!r}: not a comma-separated list of integers", hint="For example --rows 1,5.")
        if not all(1 <= size <= BATCH_ROWS for size in sizes):
            raise UsageError(f"--rows {text}: each step size must be from 1 to {BATCH_ROWS}",
                             hint="For example --rows 1,5.")
        return sizes
    spec, k = settings.speculation, settings.speculation.k
    sizes = [1, k + 1]
    verified = k + 1  # the rows a request verifies a round: a chain's, or a tree's root and nodes
    if isinstance(spec.tree_width, int) and spec.tree_width > 1 and isinstance(spec.tree_nodes, int):
        verified = spec.nodes + 1
        sizes.append(verified)
    batch = settings.runtime.batch_size
    if isinstance(batch, int) and batch > 1:
        sizes.append(min(BATCH_ROWS, batch * verified))
    return tuple(dict.fromkeys(sizes))


def run(settings, sizes, device, timer=None, *, in_step: bool = False, step_timer=None, launches: bool = False,
        launch_timer=None, progress=None) -> tuple[str, list[str]]:
    """Tune the profile's shapes on `device`; write the table; with in_step and a draft model, choose
    the draft's one-row picks inside its step (timed by step_timer, else on the draft's GPU) and
    write them too; with launches, the target's launches for tall calls (timed by launch_timer, else
    on the GPU); (its path, report lines). progress(line), if given, hears of each step as done."""
    import torch

    from specgen.core.models.loading import load_config
    from specgen.gpu.tuning import linear_table
    from specgen.gpu.tuning import tune

    models = [settings.target] + ([settings.draft] if settings.draft is not None and settings.proposer.uses_draft
                                  else [])
    shapes = [shape for spec in models
              for shape in linear_table.model_shapes(load_config(spec, settings.runtime.download))]
    if settings.proposer.drafter() == "eagle" and settings.proposer.head:
        from specgen.core.drafters.head_formats import read_config

        shapes += linear_table.head_shapes(read_config(Path(settings.proposer.head))[1])
    dtype = {"float32": torch.float32, "float16": torch.float16}.get(settings.target.dtype, torch.bfloat16)
    table, choices = tune.tune(shapes, sizes, timer or tune.graph_timer, device=device, dtype=dtype, progress=progress)
    folder = linear_table.tables_dir(settings.kernels.tables)
    path = folder / linear_table.FILE
    previous = linear_table.load(path) if path.is_file() else linear_table.LinearTable()
    folder.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    written = table.over(previous)
    path.write_text(written.to_json(tuned_on=name, rows=list(sizes)))
    step_lines = []
    if in_step and settings.draft is not None and settings.proposer.uses_draft:
        written, step_lines = _in_step(settings, written, step_timer, progress)
        path.write_text(written.to_json(tuned_on=name, rows=list(sizes)))  # written twice: an interrupted
        # descent (minutes) leaves the per-shape results in the file
    launch_lines = []
    if launches:
        written, launch_lines = _launches(settings, written, sizes, device, dtype, launch_timer, progress)
        path.write_text(written.to_json(tuned_on=name, rows=list(sizes)))
    lines = []
    packaged = linear_table.packaged()
    for choice in choices:
        n, k, gated = choice.shape
        default = packaged.pick(n, k, gated, False)
        before = choice.seconds.get(default)
        lines.append(f"N={n} K={k}{' gated' if gated else ''}: plain {list(choice.plain)} "
                     f"{choice.seconds[choice.plain] * 1e6:.1f} us (package's {list(default)}: "
                     f"{'n/a' if before is None else f'{before * 1e6:.1f} us'}); split {list(choice.split)} "
                     f"{choice.seconds[choice.split] * 1e6:.1f} us"
                     + (f"; draft {list(choice.draft)} {choice.one_row[choice.draft] * 1e6:.1f} us at one row"
                        if choice.draft is not None else ""))
    return str(path), lines + step_lines + launch_lines


def _launches(settings, table, sizes, device, dtype, timer, progress=None):
    """The table with the target's launches for the row classes its runs call it with; report lines."""
    import dataclasses

    from specgen.core.models.loading import load_config
    from specgen.gpu.tuning import tune
    from specgen.gpu.tuning.linear_table import model_shapes, packaged

    if timer is None and device.type != "cuda":
        return table, [f"launches on {device}: tuned only on a CUDA GPU"]
    shapes = model_shapes(load_config(settings.target, settings.runtime.download))
    batch = settings.runtime.batch_size
    classes = tune.launch_classes(sizes, batch == "auto" or (isinstance(batch, int) and batch > 1))
    # the picks the runs will take: this file's over the package's
    found, choices = tune.tune_launches(table.over(packaged()), shapes, timer or tune.graph_timer, device=device,
                                        dtype=dtype, classes=classes,
                                        progress=None if progress is None else lambda line: progress(f"launch: {line}"))
    mine = {shape for shape, _, _ in table.entries}
    kept = tuple(launch for launch in found.launches if launch[0] in mine)
    return dataclasses.replace(table, launches=kept), [f"launch: {tune.launch_line(choice)}" for choice in choices]


def _in_step(settings, table, step_timer, progress=None):
    """The table with the draft's one-row picks chosen inside its captured step; report lines."""
    import dataclasses

    from specgen.core.models.loading import load_model, resolve_device
    from specgen.gpu.tuning import tune
    from specgen.gpu.policy import resolve
    from specgen.gpu.tuning.linear_table import LinearTable, model_shapes, packaged
    from specgen.gpu.workspace import Workspace

    device = resolve_device(settings.draft)
    if step_timer is None and device.type != "cuda":
        return table, [f"draft on {device}: its picks are chosen inside its step only on a CUDA GPU"]
    # the draft as the CUDA backend runs it: specgen's own model step
    model = load_model(settings.draft, False, settings.runtime.download, settings.runtime.modeling)
    kernels = resolve(settings.kernels, device, model)
    kernels = dataclasses.replace(kernels, linear_table=table.over(packaged()).for_drafts())
    # the shapes this file lists: a table file holds draft picks only beside a shape's entry
    shapes = [shape for shape in model_shapes(model.config) if shape in {s for s, _, _ in table.entries}]
    lines = []
    if progress is not None:
        progress(f"draft step: choosing the draft's one-row picks inside its captured step ({len(shapes)} shapes)")

    def changed(line: str) -> None:
        lines.append(f"draft step: {line}")
        if progress is not None:
            progress(lines[-1])

    found = tune.tune_draft(model, kernels, shapes, Workspace(device), timer=step_timer, progress=changed)
    lines.append(f"draft step: {found.before * 1e3:.4f} ms with the shapes' own picks, {found.after * 1e3:.4f} ms "
                 "with the picks chosen inside it")
    drafts = dict(table.drafts) | found.picks
    return LinearTable(table.entries, table.source, tuple(sorted(drafts.items()))), lines
