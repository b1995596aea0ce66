"""benchmarks/gpu/round_kernels.py: its decode counts the rounds after the first round's tokens
(the prompt's prefill and that round left out of the figures) when told where to begin."""

from __future__ import annotations

import torch

from repo_paths import REPO, script
from specgen.core.events import Finished


def _module():
    return script(REPO / "benchmarks" / "gpu" / "round_kernels.py")


class _Decoder:
    """Five rounds' events, then Finished."""

    def run(self, ids):
        yield from range(5)
        yield Finished.__new__(Finished)


def test_rounds_are_counted_from_the_first_rounds_tokens_on(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)  # no GPU here
    decode, began = _module().decode, []
    finished, rounds = decode(_Decoder(), [1, 2], lambda: began.append(True))
    assert isinstance(finished, Finished) and rounds == 4 and began == [True]
    assert decode(_Decoder(), [1, 2])[1] == 5  # without begin: every round
