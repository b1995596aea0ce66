"""`python -m specgen`: the `specgen` command, for environments whose scripts folder is not on PATH."""

from specgen.cli.main import main

main()
