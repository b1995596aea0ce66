"""The `specgen` command. Command modules import torch lazily, so --help answers at once."""

from __future__ import annotations

import sys

import typer

from specgen.cli import bench, errors, generate, inspect, profiles

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


def main() -> None:
    sys.exit(errors.run(app))


if __name__ == "__main__":
    main()
