"""benchmarks/bench_summary.py: the device scripts' one-line summary of `specgen bench` JSON."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("bench_summary", ROOT / "benchmarks" / "bench_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_recorded_bench_reads_back_line_for_line():
    lines = _module().summary(ROOT / "benchmarks" / "results" / "compile-operators" / "bench-compile.json")
    assert lines[0].startswith("== bench-compile dependent on startup 10.64")
    assert lines[1] == " target-only 0.0 tok/s 2728"
    assert lines[4] == ("draft 4 0.0 tok/s 5909 mal 3.72 x 2.17 identical 1.0 "
                        "{'draft': 0.192, 'verify': 0.299, 'sample': 0.04, 'other': 0.044, 'total': 0.576}")
    assert len(lines) == 7  # three baselines, three results


def test_an_unreadable_file_is_one_line(tmp_path):
    broken = tmp_path / "cut.json"
    broken.write_text('{"environment": ')
    assert _module().summary(broken)[0].startswith("cut unreadable")
