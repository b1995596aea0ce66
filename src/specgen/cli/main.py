"""The `specgen` command's entry point.

Ctrl-C must end specgen with "specgen: interrupted" and exit 130 at any moment, also in the first
second while Python imports Typer, Rich and torch. So this module imports nothing heavy: main()
takes over SIGINT first, then imports the app (cli/app.py) and runs it through cli/errors.py.
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_INTERRUPT = 130


def main() -> None:
    signal.signal(signal.SIGINT, _stop_now)  # while modules import: nothing to save yet
    from specgen.cli import streams

    streams.protect()  # before anything else opens a file that could take a closed stderr's descriptor
    from specgen.cli import errors
    from specgen.cli.app import app

    # From here Ctrl-C is a KeyboardInterrupt, which errors.run and the commands handle (the text
    # generated so far is written, the partial statistics printed).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if "_SPECGEN_COMPLETE" in os.environ:  # a shell asking for completions (see --install-completion)
        app(prog_name="specgen")  # Typer's own main answers them and exits
    try:
        code = errors.run(app)
    except KeyboardInterrupt:  # in the instant before run() or after it
        code = errors.interrupted()
    signal.signal(signal.SIGINT, _stop_now)
    _exit_now(code)


def _exit_now(code: int) -> None:
    """Exit without Python's shutdown, which would tear down every module torch loaded, one by
    one, for nothing (docs/benchmarks.md, "Start-up of the demo (2-core CPU)"). Everything specgen writes goes
    through stdout and stderr, flushed here; its files (exports) are closed when written."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - errors.run has reported stdout's failures; stderr's are dropped
            pass
    os._exit(code)


def _stop_now(signum, frame) -> None:
    try:
        os.write(2, b"specgen: interrupted\n")
    except OSError:  # stderr closed or failing: the exit code still says it
        pass
    os._exit(EXIT_INTERRUPT)


def __getattr__(name: str):
    if name == "app":  # `from specgen.cli.main import app`, without importing Typer when main() starts
        from specgen.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
