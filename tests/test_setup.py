"""Set-up: CI installs and tests exactly as the README says, and a CPU install takes no Triton.

Text only but for the last test (the demo in a process where Triton cannot be imported).
"""

from __future__ import annotations

import re
from pathlib import Path

from cli_helpers import run_python

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


def _readme_install_section() -> str:
    return (REPO / "README.md").read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]


def test_ci_runs_the_readme_set_up_commands_verbatim():
    """.ci/run is what the README tells a user of a CPU-only machine: the torch command of its
    sentence for such machines, then its two fenced commands, word for word and in that order."""
    section = _readme_install_section()
    cpu_torch = re.findall(r"`(pip install torch[^`]*)`", section)[:1]
    fenced = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    steps = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
             if line and not line.startswith(("#", "set ", "cd ", "export "))]
    assert cpu_torch and len(fenced) == 2
    assert steps == cpu_torch + fenced


def test_a_cpu_install_takes_no_triton():
    """A CPU run never imports Triton and torch's CUDA builds bring their own: only the tests'
    extra names it, for the interpreter that runs the kernel tests on a CPU."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [dependency for dependency in project["dependencies"] if dependency.startswith("triton")]
    assert [dependency for dependency in project["optional-dependencies"]["test"] if dependency.startswith("triton")]


def test_the_demo_runs_where_triton_cannot_be_imported():
    code = (
        "import sys\n"
        "sys.modules['triton'] = None  # `import triton` raises ImportError\n"
        "from specgen.cli import errors\n"
        "from specgen.cli.main import app\n"
        "sys.exit(errors.run(app, ['generate', '-n', '4', '-q', '--device', 'cpu', 'def quicksort(arr):']))\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("\n    \"\"\"")  # the demo's greedy text for this prompt
