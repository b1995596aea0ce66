"""Where the repository and the tests' shared files are, for test modules at any depth of tests/."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def script(path: Path, name: str | None = None) -> ModuleType:
    """A script of the repository (benchmarks/...), not a package module, loaded as module `name`
    (default: its file's stem), registered in sys.modules (dataclasses look their module up while
    being built) and loaded once a process."""
    name = name or path.stem
    module = sys.modules.get(name)
    if module is None or getattr(module, "__file__", None) != str(path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module
