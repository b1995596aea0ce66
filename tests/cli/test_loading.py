"""cli/loading.py's collector_paused: the objects made while Python's cycle collector is paused
are walked once before it resumes, not left young for it to walk three times over later, at
whatever allocation its counts reach (inside a timed run of `specgen bench`, once)."""

from __future__ import annotations

import gc

from specgen.cli.loading import collector_paused


def _generation_of(obj) -> int | None:
    for generation in (0, 1, 2):
        if any(o is obj for o in gc.get_objects(generation=generation)):
            return generation
    return None


def test_objects_made_while_paused_are_in_the_oldest_generation_when_it_resumes():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        made = [[i] for i in range(20_000)]  # each a container the collector tracks
    assert gc.isenabled()
    assert _generation_of(made) == 2 and _generation_of(made[-1]) == 2
    assert gc.get_count()[0] < 700  # below the first generation's threshold: no walk is owed


def test_a_paused_collector_stays_paused_and_unwalked_inside_another_pause():
    gc.disable()
    try:
        with collector_paused():
            made = [[0]]
        assert not gc.isenabled()
        assert _generation_of(made) == 0  # the outer pause's owner walks them when it resumes
    finally:
        gc.enable()
