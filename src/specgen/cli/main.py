"""The `specgen` command. Command modules import torch lazily, so --help answers at once."""

from __future__ import annotations

import os
import sys

import typer

from specgen.cli import bench, errors, generate, inspect, profiles
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
app.add_typer(profiles.app, name="profiles")


@app.callback()
def root(version: opt.Version = False) -> None:
    """Lossless speculative generation: a draft proposes, the target verifies, the output is the target's."""


def main() -> None:
    if "_SPECGEN_COMPLETE" in os.environ:  # a shell asking for completions (see --install-completion)
        app(prog_name="specgen")
    sys.exit(errors.run(app))


if __name__ == "__main__":
    main()
