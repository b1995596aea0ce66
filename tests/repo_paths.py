"""Where the repository and the tests' shared files are, for test modules at any depth of tests/."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
