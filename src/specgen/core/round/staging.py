"""Host values onto the device without a stall, between a batch's rounds.

A copy from ordinary (pageable) host memory to a GPU waits for the work queued before it: between
rounds that is the round in flight, so a row's refill (its prompt's ids, its warp parameters)
would hold the host until the device drains. A copy from pinned memory is only queued. Staging
keeps pinned buffers (allocated once, grown when needed), each with the event recorded after its
last copy: a buffer is written again only once that event has passed, so a copy never reads
values a later put wrote; while every buffer's copy is still queued, another buffer is added (their
number is bounded by the puts of the rounds in flight).

The device side: each buffer has a device buffer of its own, which the put's copy writes and the
caller's work reads; the next copy into it is queued after that work (one stream), so the values
stay what the put wrote for every op queued before the next put of the same buffer.
On a CPU device a put is the values themselves (nothing is queued).
"""

from __future__ import annotations

import array
from dataclasses import dataclass

import torch

MIN_BYTES = 256  # a new buffer's size at least: a row's params and short prompts never grow it
# array.array's codes for the host values a round stages ("b": a bool is a byte of 0 or 1)
_CODES = {torch.int64: "q", torch.int32: "i", torch.float32: "f", torch.float64: "d", torch.bool: "b"}


def host_tensor(values: list, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A list of numbers as a 1-D host tensor of `dtype`, through one array of machine values (the
    same values as torch.tensor's: C's conversions). Why not torch.tensor: it converts a list
    element by element, about 0.2 us an element on the project's 2-core VM (torch 2.13), and the
    host builds such lists between a round's sync and the next launch (a lookup's tree, 90 to 250
    ints a row and round): 16 rows of 91 ints took 287 us, through an array 41 us."""
    if not values:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(array.array(_CODES[dtype], values), dtype=dtype)


# compared by identity (list.index finds one): a generated __eq__ would compare the tensors
# elementwise, which fails on buffers of two sizes
@dataclass(eq=False)
class _Buffer:
    host: torch.Tensor  # uint8, pinned
    device: torch.Tensor  # uint8, the same size
    event: torch.cuda.Event | None = None  # recorded after its last copy (None: never copied)

    def free(self) -> bool:
        return self.event is None or self.event.query()


class Staging:
    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.buffers: list[_Buffer] = []

    def put(self, values: torch.Tensor) -> torch.Tensor:
        """values (a host tensor) on the device, its copy queued (see the module's docstring for how
        long the result holds them)."""
        if self.device.type != "cuda":
            return values.to(self.device)
        values = values.contiguous()
        nbytes = values.numel() * values.element_size()
        buffer = self._buffer(nbytes)
        host = buffer.host[:nbytes].view(values.dtype).view(values.shape)
        host.copy_(values)
        out = buffer.device[:nbytes].view(values.dtype).view(values.shape)
        out.copy_(host, non_blocking=True)
        buffer.event = torch.cuda.Event()
        buffer.event.record()
        return out

    def _buffer(self, nbytes: int) -> _Buffer:
        """A free buffer of at least nbytes (the smallest that fits), else a free one grown, else a
        new one."""
        free = [b for b in self.buffers if b.free()]
        fits = [b for b in free if b.host.numel() >= nbytes]
        if fits:
            return min(fits, key=lambda b: b.host.numel())
        size = max(MIN_BYTES, 1 << (nbytes - 1).bit_length())
        with torch.inference_mode(False):  # a put inside inference mode (a prefill's) must not make
            # inference tensors: a later put outside it writes them
            fresh = _Buffer(torch.empty(size, dtype=torch.uint8, pin_memory=True),
                            torch.empty(size, dtype=torch.uint8, device=self.device))
        if free:  # grown: the old one's copy is done, and the device's work queued on its device
            self.buffers[self.buffers.index(free[0])] = fresh  # buffer is stream-ordered before any reuse
        else:
            self.buffers.append(fresh)
        return fresh
