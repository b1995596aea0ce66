"""A refill's host values on the device: RowParams through the start record, and Staging's pinned buffers."""

from __future__ import annotations

import pytest
import torch

from specgen.core.round.batch_round import FIELDS, RowParams
from specgen.core.round.row_start import RowStarts
from specgen.core.round.staging import Staging, _Buffer, host_tensor
from specgen.core.settings import SamplingSpec

SPECS = [
    SamplingSpec(),
    SamplingSpec(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                 presence_penalty=0.3, frequency_penalty=0.2),
    SamplingSpec(temperature=1 / 3, top_k=1, top_p=0.123456789, min_p=1e-7, repetition_penalty=1.3,
                 presence_penalty=-0.7, frequency_penalty=2.0),
    SamplingSpec(temperature=0.0),
]


def _filled(batch: int, rows_per: int, sets, device) -> dict[str, torch.Tensor]:
    """The fields as a fill per field writes them (what RowParams.set did before the packed copy)."""
    n = batch * rows_per
    fields = {name: torch.full((n,), getattr(SamplingSpec(), name), dtype=torch.int32 if name == "top_k"
                               else torch.float32, device=device) for name in FIELDS}
    log_min_p = torch.log(fields["min_p"])
    for b, spec in sets:
        at = slice(b * rows_per, (b + 1) * rows_per)
        for name in FIELDS:
            fields[name][at].fill_(getattr(spec, name))
        log_min_p[at].copy_(torch.log(fields["min_p"][at]))
    fields["log_min_p"] = log_min_p
    return fields


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows_per", [1, 4])
def test_row_params_are_bitwise_a_fill_per_field(device, rows_per):
    batch = 3
    sets = [(1, SPECS[1]), (0, SPECS[2]), (2, SPECS[3]), (1, SPECS[2]), (0, SPECS[0])]
    starts = RowStarts(batch, torch.device(device), Staging(torch.device(device)))
    params = RowParams(batch, rows_per, torch.device(device), starts, "warp")
    for i, (b, spec) in enumerate(sets):
        params.set(b, spec)
        if i % 2:  # some sets flushed alone, some with the next (a later set of a row replaces its values)
            starts.flush()
    starts.flush()
    want = _filled(batch, rows_per, sets, device)
    for name in (*FIELDS, "log_min_p"):
        got = getattr(params.params, name)
        assert got.dtype == want[name].dtype, name
        assert torch.equal(got, want[name]), name
    assert not params.params.flags.all_greedy and params.params.flags.top_k


def test_row_params_fields_are_views_of_one_buffer():
    starts = RowStarts(2, torch.device("cpu"), Staging(torch.device("cpu")))
    params = RowParams(2, 3, torch.device("cpu"), starts, "warp")
    base = params.packed.untyped_storage().data_ptr()
    for name in (*FIELDS, "log_min_p"):
        field = getattr(params.params, name)
        assert field.untyped_storage().data_ptr() == base and field.is_contiguous() and field.shape == (6,), name
    params.set(1, SPECS[1])  # the flush writes the buffer the fields view (a captured warp reads them at replay)
    assert params.params.top_k.tolist() == [-1] * 6
    starts.flush()
    assert params.params.top_k.tolist() == [-1, -1, -1, 40, 40, 40]


def test_staging_on_the_cpu_is_the_values():
    values = torch.tensor([3, 1, 4, 1, 5], dtype=torch.long)
    assert torch.equal(Staging(torch.device("cpu")).put(values), values)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_staging_never_rewrites_a_buffer_whose_copy_is_queued():
    """Puts queued behind a long kernel: each takes a buffer of its own, and each device result is
    what it put (a rewritten pinned buffer would show as another put's values)."""
    staging = Staging(torch.device("cuda"))
    torch.cuda._sleep(200_000_000)  # the round in flight
    puts = [torch.arange(i, i + 5 + 40 * i, dtype=torch.long) for i in range(6)]
    outs = []
    for i, p in enumerate(puts):  # a prefill's puts run in inference mode, a row's params' not
        with torch.inference_mode(i % 2 == 0):
            outs.append(staging.put(p).clone())  # clone: queued right behind its copy
    assert len(staging.buffers) == len(puts)
    torch.cuda.synchronize()
    for put, out in zip(puts, outs):
        assert torch.equal(out.cpu(), put)
    for mode in (True, False):  # every copy done: a buffer is reused, in either mode
        with torch.inference_mode(mode):
            again = staging.put(torch.ones(3, dtype=torch.long))
        assert len(staging.buffers) == len(puts) and again.tolist() == [1, 1, 1]


def test_buffers_of_two_sizes_are_told_apart_by_identity():
    """Growing a buffer finds it among the others: buffers compare by identity, never by their
    tensors (an elementwise compare of a 1,024- and a 256-byte buffer failed a CUDA bench at
    batch 32 with "the size of tensor a (1024) must match the size of tensor b (256)")."""
    small, large = (_Buffer(torch.zeros(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)) for n in (256, 1024))
    assert [small, large].index(large) == 1 and small != large and small == small


VALUES = {
    torch.int64: [0, 1, -1, torch.iinfo(torch.int64).max, torch.iinfo(torch.int64).min, 123456],
    torch.int32: [0, 1, -1, torch.iinfo(torch.int32).max, torch.iinfo(torch.int32).min, -98765],
    torch.float32: [0.0, -0.0, 0.1, 1 / 3, -2.5e-39, 3.4e38, 1e40, float("inf"), float("-inf"), 7],
    torch.float64: [0.1, 1 / 3, -1e300, float("-inf")],
    torch.bool: [True, False, True, True],
}


@pytest.mark.parametrize("dtype", list(VALUES), ids=str)
def test_host_tensor_is_torch_tensors_values(dtype):
    """host_tensor gives bit for bit what torch.tensor gives for a list (the extremes of an integer
    dtype; floats rounded to float32, overflowing to inf, a subnormal, -0.0), as a tensor of its
    own: writing the list afterwards leaves it as it was; an empty list too."""
    values = list(VALUES[dtype])
    got, want = host_tensor(values, dtype), torch.tensor(values, dtype=dtype)
    assert got.dtype == dtype and got.device.type == "cpu"
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    values[0] = values[1]
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(host_tensor([], dtype), torch.tensor([], dtype=dtype))


def test_host_tensor_rows_view_as_a_matrix():
    assert torch.equal(host_tensor(list(range(500))).view(5, -1), torch.arange(500).view(5, -1))
