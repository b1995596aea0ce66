"""The `specgen` Typer app. Command modules import torch lazily, so --help answers at once.

The entry point is cli/main.py, which installs the Ctrl-C handling before importing this.
"""

from __future__ import annotations

import typer

from specgen.cli import bench, generate, inspect, profiles, train_head, tune
from specgen.cli import options as opt

app = typer.Typer(
    name="specgen",
    help="Lossless speculative generation: a draft proposes, the target verifies, the output is the target's.",
    no_args_is_help=True,
    cls=opt.Group,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("generate", cls=opt.Command)(generate.generate)
app.command("bench", cls=opt.Command)(bench.bench)
app.command("inspect-acceptance", cls=opt.Command)(inspect.inspect_acceptance)
app.command("train-head", cls=opt.Command)(train_head.train_head)
app.command("tune-kernels", cls=opt.Command)(tune.tune_kernels)
app.add_typer(profiles.app, name="profiles")


@app.callback()
def root(version: opt.Version = False) -> None:
    """Lossless speculative generation: a draft proposes, the target verifies, the output is the target's."""

