"""`specgen profiles list|show`: which profiles exist and what a profile resolves to.

Kept free of torch and transformers so that these commands answer at once.
ProfileError propagates to cli/errors.py, which prints it as one line on stderr.
"""

from __future__ import annotations

import enum
import json
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specgen.cli.options import Command, Group
from specgen.core.errors import SpecgenError
from specgen.core.profile import (
    list_profiles,
    load_profile,
    profile_as_dict,
    profile_as_toml,
    repository_profile_dir,
    user_profile_dir,
)

app = typer.Typer(
    help="List profiles and show the settings a profile resolves to.", no_args_is_help=True, cls=Group
)


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"


@app.command("list", cls=Command)
def list_command() -> None:
    """List built-in profiles, those in the user profile folder and, in a checkout, its profiles/."""
    columns = ("name", "source", "target", "draft / proposer")
    table = Table(*columns, box=box.SIMPLE_HEAD, show_edge=False)
    examples = repository_profile_dir()
    table.caption = Text(f"user profiles: {user_profile_dir()}" + (f"; examples: {examples}" if examples else ""))
    for name, source in list_profiles():
        # Text, not str: Rich would read "[draft]" in a message as markup.
        table.add_row(*map(Text, (name, source, *_summary(name))))
    _stdout().print(table)


@app.command(cls=Command)
def show(
    name: Annotated[str, typer.Argument(help="Profile name, or path to a .toml file.")],
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="text (a loadable TOML profile) or json.")
    ] = OutputFormat.text,
) -> None:
    """Print the settings NAME resolves to, with every default filled in."""
    profile = load_profile(name)
    if output_format is OutputFormat.json:
        typer.echo(json.dumps(profile_as_dict(profile), indent=2))
    else:
        typer.echo(profile_as_toml(profile), nl=False)


def _summary(name: str) -> tuple[str, str]:
    """(target, draft or proposer) for one row; a broken profile must not hide the others."""
    try:
        profile = load_profile(name)
    except SpecgenError as error:
        return f"invalid: {error.message}", ""
    proposer = profile.proposer
    drafter = {"draft": profile.draft.path if profile.draft else "", "eagle": f"{proposer.head} (eagle)",
               "mtp": "(mtp)"}.get(proposer.drafter(), "")
    if proposer.kind == "hybrid":
        return profile.target.path, f"{drafter} (hybrid)"
    return profile.target.path, drafter or f"({proposer.kind})"


def _stdout() -> Console:
    # Rich honours NO_COLOR itself. In a pipe, keep one row per line instead of wrapping at 80.
    console = Console()
    if not console.is_terminal:
        console.width = 100_000
    return console
