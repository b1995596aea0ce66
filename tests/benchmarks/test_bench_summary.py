"""benchmarks/bench_summary.py: the device scripts' one-line summary of `specgen bench` JSON."""

from __future__ import annotations

from repo_paths import REPO, script


def _module():
    return script(REPO / "benchmarks" / "bench_summary.py")


def test_a_recorded_bench_reads_back_line_for_line():
    """The bench behind docs/benchmarks.md's "The owned model step" (its greedy row: 5,470 tok/s,
    0.540 ms a round)."""
    lines = _module().summary(REPO / "benchmarks" / "results" / "owned-step" / "pair-head-1.json")
    assert lines[0].startswith("== pair-head-1 dependent on startup 6.27")
    assert lines[1] == " target-only 0.0 tok/s 3209"
    assert lines[4] == ("draft 4 chain 0.0 - tok/s 5470 mal 3.31 x 2.02 identical 1.0 "
                        "{'draft': 0.179, 'verify': 0.332, 'sample': 0.015, 'other': 0.014, 'total': 0.54}")
    assert len(lines) == 7  # three baselines, three results


def test_an_unreadable_file_is_one_line(tmp_path):
    broken = tmp_path / "cut.json"
    broken.write_text('{"environment": ')
    assert _module().summary(broken)[0].startswith("cut unreadable")
