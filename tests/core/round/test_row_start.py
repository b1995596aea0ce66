"""core/round/row_start.py: a batch's start values recorded on the host, written in one flush."""

from __future__ import annotations

import pytest
import torch

from specgen.core.round.row_start import RowStarts, int_bits
from specgen.core.round.staging import Staging

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _starts(device: str, batch: int = 4, backend=None) -> tuple[RowStarts, dict]:
    dev = torch.device(device)
    starts = RowStarts(batch, dev, Staging(dev), backend)
    feed = torch.full((batch, 3), 7, dtype=torch.long, device=dev)
    buffers = dict(feed=feed, key=torch.zeros(batch, 2, dtype=torch.long, device=dev),
                   budget=torch.full((batch,), 5, dtype=torch.int32, device=dev),
                   active=torch.zeros(batch, dtype=torch.bool, device=dev),
                   warp=torch.zeros(2, batch * 3, dtype=torch.float32, device=dev))
    starts.field("last", feed[:, 0])  # a strided column
    starts.field("key", buffers["key"], 2)
    starts.field("budget", buffers["budget"])
    starts.field("active", buffers["active"])
    starts.field("warp", buffers["warp"].view(2, batch, 3).permute(1, 0, 2), 2)  # each value over 3 rows
    return starts, buffers


@pytest.mark.parametrize("device", DEVICES)
def test_a_flush_writes_what_each_row_set_and_nothing_else(device):
    starts, buf = _starts(device)
    starts.set(1, "last", 11)
    starts.set(1, "key", 2**40 + 3, 2**31 + 1)
    starts.set(3, "budget", -2)
    starts.set(1, "active", True)
    starts.set(3, "active", True)
    starts.set(3, "active", False)  # a later set of the same row and field replaces the earlier
    starts.set(2, "warp", 0.1, int_bits(40))
    assert buf["feed"][:, 0].tolist() == [7, 7, 7, 7]  # nothing before the flush
    starts.flush()
    assert buf["feed"].tolist() == [[7, 7, 7], [11, 7, 7], [7, 7, 7], [7, 7, 7]]
    assert buf["key"].tolist() == [[0, 0], [2**40 + 3, 2**31 + 1], [0, 0], [0, 0]]
    assert buf["budget"].tolist() == [5, 5, 5, -2]
    assert buf["active"].tolist() == [False, True, False, False]
    warp = buf["warp"].view(2, 4, 3)
    assert torch.equal(warp[0, 2], torch.full((3,), 0.1, dtype=torch.float32, device=device))
    assert warp[1, 2].view(torch.int32).tolist() == [40, 40, 40]
    assert warp[:, [0, 1, 3]].abs().sum().item() == 0
    starts.set(0, "budget", 9)  # the next flush: only what was set since
    starts.flush()
    assert buf["budget"].tolist() == [9, 5, 5, -2] and buf["feed"][1, 0].item() == 11
    starts.flush()  # nothing recorded: nothing written
    assert buf["budget"].tolist() == [9, 5, 5, -2]


@pytest.mark.parametrize("value", [0, 1, 40, 50_000, 2**31 - 1, -1])
def test_int_bits_carry_an_int32_through_float32(value):
    assert torch.tensor([int_bits(value)], dtype=torch.float32).view(torch.int32).item() == value


def test_after_runs_after_the_writes_and_a_name_registered_again_takes_the_new_buffer():
    starts, buf = _starts("cpu")
    other = torch.zeros(4, dtype=torch.int32)
    starts.field("budget", other)  # a subclass's own buffer under the same name
    seen = []
    starts.after["check"] = lambda: seen.append(other.tolist())
    starts.set(2, "budget", 3)
    starts.flush()
    assert seen == [[0, 0, 3, 0]] and buf["budget"].tolist() == [5, 5, 5, 5]
    with pytest.raises(RuntimeError, match="after the first flush"):
        starts.field("late", torch.zeros(4))


def test_bad_fields_and_values_are_refused():
    starts, _ = _starts("cpu")
    with pytest.raises(ValueError, match="takes 2 values"):
        starts.set(0, "key", 1)
    with pytest.raises(ValueError, match="not \\[4, 1"):
        starts.field("short", torch.zeros(3))
    with pytest.raises(TypeError):
        starts.field("half", torch.zeros(4, dtype=torch.float16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_apply_writes_what_the_eager_one_does():
    """The CUDA backend captures the apply (one graph replayed a flush): the same buffers as eager,
    over several flushes, and a capture's warm-ups change nothing."""
    from specgen.gpu.capture import capture

    class Backend:  # as CudaBackend.graph captures
        def graph(self, fn, what):
            return capture(fn, torch.device("cuda"), 2)[0].replay

    backend = Backend()
    runs = []
    for captured in (False, True):
        starts, buf = _starts("cuda", backend=backend if captured else None)
        for step in range(3):
            starts.set(step, "last", 100 + step)
            starts.set((step + 1) % 4, "warp", 0.5 * step, int_bits(step))
            starts.set(step, "active", step % 2 == 0)
            starts.flush()
        torch.cuda.synchronize()
        runs.append({name: t.clone() for name, t in buf.items()})
    for name in runs[0]:
        assert torch.equal(runs[0][name], runs[1][name]), name
