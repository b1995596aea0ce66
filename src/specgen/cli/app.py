"""The `specgen` Typer app. Command modules import torch lazily, so --help answers at once.

The entry point is cli/main.py, which installs the Ctrl-C handling before importing this.
"""

from __future__ import annotations

import typer

from specgen.cli import bench, generate, inspect, profiles

app = typer.Typer(
    name="specgen",
    help="Lossless speculative generation: a draft proposes, the target verifies, the output is the target's.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("generate")(generate.generate)
app.command("bench")(bench.bench)
app.command("inspect-acceptance")(inspect.inspect_acceptance)
app.add_typer(profiles.app, name="profiles")

