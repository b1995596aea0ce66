"""The one place where failures become a line on stderr and an exit code.

Exit codes: 0 success; 1 runtime failure (model loading, generation); 2 usage or profile error;
130 interrupted (Ctrl-C). SPECGEN_DEBUG=1 shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

import click

EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPT = 1, 2, 130


def _say(message: str, hint: str | None = None) -> None:
    print(f"specgen: error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


def _debug() -> bool:
    return os.environ.get("SPECGEN_DEBUG", "") not in ("", "0")


def _quiet_broken_pipe() -> int:
    """The reader went away (e.g. `| head`): stop quietly, and keep Python from complaining at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def _known(exc: BaseException) -> tuple[str, str | None, int] | None:
    from specgen.core.errors import SpecgenError

    if isinstance(exc, SpecgenError):
        return exc.message, exc.hint, exc.exit_code
    if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError, without importing torch
        return ("out of GPU memory", "reduce --max-tokens or --k, use a smaller draft, or dtype = \"bfloat16\"",
                EXIT_RUNTIME)
    if isinstance(exc, click.exceptions.NoSuchOption | click.exceptions.BadParameter | click.exceptions.UsageError):
        ctx = getattr(exc, "ctx", None)
        command = ctx.command_path if ctx is not None else "specgen"
        return exc.format_message(), f"see `{command} --help`", EXIT_USAGE
    return None


def run(app) -> int:
    """Run the Typer app and map every outcome to an exit code."""
    try:
        result = app(standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        return EXIT_INTERRUPT
    except KeyboardInterrupt:
        print("specgen: interrupted", file=sys.stderr)
        return EXIT_INTERRUPT
    except BrokenPipeError:
        return _quiet_broken_pipe()
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
