"""The one place where failures become a line on stderr and an exit code.

Exit codes: 0 success; 1 runtime failure (model loading, generation); 2 usage or profile error;
130 interrupted (Ctrl-C). SPECGEN_DEBUG=1 shows the traceback instead.
"""

from __future__ import annotations

import os
import re
import sys

import typer
import typer.main

try:  # recent Typer carries its own copy of Click; older Typer runs on Click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - exercised with older Typer only
    from click import exceptions as click_exceptions

EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPT = 1, 2, 130


def _say(message: str, hint: str | None = None) -> None:
    if sys.stderr is None:  # closed, and not replaced (cli/streams.py does): print(file=None) would use stdout
        return
    print(f"specgen: error: {_one_line(message)}", file=sys.stderr)
    if hint:
        print(f"hint: {_one_line(hint)}", file=sys.stderr)


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _debug() -> bool:
    return os.environ.get("SPECGEN_DEBUG", "") not in ("", "0")


def _quiet_broken_pipe() -> int:
    """The reader went away (e.g. `| head`): stop quietly, and keep Python from complaining at exit
    when it flushes what is still buffered for the closed pipe."""
    from specgen.cli.streams import discard

    discard(sys.stdout)
    discard(sys.stderr)
    return 0


def _out_of_memory(exc: BaseException) -> tuple[str, str, int]:
    size = re.search(r"[Tt]ried to allocate ([\d.]+ [KMGT]i?B)", str(exc))
    return (f"out of GPU memory{f' (tried to allocate {size.group(1)})' if size else ''}",
            "reduce --max-tokens, --k or the prompt length, use a smaller draft, or set dtype = \"bfloat16\"",
            EXIT_RUNTIME)


def _known(exc: BaseException) -> tuple[str, str | None, int] | None:
    from specgen.core.errors import SpecgenError

    if isinstance(exc, SpecgenError):
        return exc.message, exc.hint, exc.exit_code
    if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError, without importing torch
        return _out_of_memory(exc)
    if isinstance(exc, click_exceptions.NoSuchOption):
        from specgen.cli.options import foreign_hint

        hint = foreign_hint(exc.option_name, exc.ctx)
        if hint is not None:  # another tool's spelling: what specgen calls it, not Click's guesses
            return exc.message, hint, EXIT_USAGE
    if isinstance(exc, click_exceptions.UsageError):  # unknown option, bad value, missing argument
        command = exc.ctx.command_path if exc.ctx is not None else "specgen"
        return exc.format_message(), f"see `{command} --help`", EXIT_USAGE
    if isinstance(exc, click_exceptions.ClickException):
        return exc.format_message(), None, exc.exit_code
    return None


def run(app, args: list[str] | None = None) -> int:
    """Run the Typer app on `args` (default: sys.argv[1:]) and map every outcome to an exit code.

    The command is driven here, not by Typer's own main(), which would turn Ctrl-C into a silent
    exit and a broken pipe into exit 1 before this table could see them.
    """
    from specgen.cli.streams import OutputError, discard

    try:
        if sys.stdout is None:  # started with descriptor 1 closed (`>&-`)
            from specgen.core.errors import UsageError

            raise UsageError("stdout is closed: there is nowhere to write the results",
                             hint="redirect it to a file, or to /dev/null to discard them")
        return _invoke(app, sys.argv[1:] if args is None else args)
    except typer.Exit as exc:  # --help, or a command that set its exit code (130 after an interrupt)
        return exc.exit_code
    except (KeyboardInterrupt, typer.Abort):
        return interrupted()
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except SystemExit as exc:
        if isinstance(exc.__context__, BrokenPipeError):  # Rich's answer to a closed pipe (help, reports)
            return _quiet_broken_pipe()
        raise
    except OutputError as exc:
        _say(exc.message, exc.hint)
        discard(sys.stdout)  # what stdout still buffers would fail again when Python exits
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the one place that turns failures into messages
        if _debug():
            raise
        known = _known(exc)
        if known is None:
            _say(f"unexpected {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": "),
                 "run again with SPECGEN_DEBUG=1 for the traceback, and report it")
            return EXIT_RUNTIME
        message, hint, code = known
        _say(message, hint)
        return code


def interrupted() -> int:
    print("specgen: interrupted", file=sys.stderr)
    return EXIT_INTERRUPT


def _invoke(app, args: list[str]) -> int:
    command = typer.main.get_command(app)
    try:
        with command.make_context("specgen", list(args)) as ctx:
            result = command.invoke(ctx)
    except getattr(click_exceptions, "NoArgsIsHelpError", ()) as exc:  # bare `specgen`: help, exit 2
        if exc.format_message():  # empty when Rich has already printed the help
            print(exc.format_message(), file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.flush()  # here, so that a reader gone by now is a quiet broken pipe, not noise at exit
    return result if isinstance(result, int) else 0
