"""The kernels' state on one device: grow-only scratch buffers and the error flag.

One Workspace per device is created by whoever builds the runners and the round, and passed to
every launcher that needs scratch (gpu/kernels/warp.py, gpu/kernels/verify.py, gpu/kernels/linear.py's split-K counters).
Kernels on one stream use a buffer one after the other, so one of each name serves them all.

Buffers only grow, and every buffer ever handed out stays in `buffers`: a captured CUDA graph
keeps the addresses it was captured with, so a buffer replaced by a larger one must stay alive
as long as the workspace. Buffers from `zeros` hold arrival counters and slots that the kernels
reset themselves, so they are zero between launches.

`error` is the int32 flag the warp kernels OR into (gpu/kernels/warp.py: 1 NaN/+inf logits, 2 a row with
every id masked) and the verify kernels turn into a sentinel in their output row.
"""

from __future__ import annotations

import torch

MIN_ELEMENTS = 1 << 16  # the first buffer of a name: most later requests then fit without growing


def device_of(device: torch.device | str) -> torch.device:
    """The device with its index: "cuda" and "cuda:0" (when current) are one device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class Workspace:
    def __init__(self, device: torch.device | str):
        self.device = device = device_of(device)
        self.error = torch.zeros(1, dtype=torch.int32, device=device)  # [1]
        self.buffers: list[torch.Tensor] = [self.error]
        self._named: dict[str, torch.Tensor] = {}

    def scratch(self, name: str, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A buffer of at least `numel` elements, contents undefined."""
        return self._get(name, numel, dtype, torch.empty)

    def zeros(self, name: str, numel: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        """A buffer of at least `numel` elements that is zero between launches: the kernels that
        use it (arrival counters, slots) leave it zeroed."""
        return self._get(name, numel, dtype, torch.zeros)

    def get(self, name: str) -> torch.Tensor | None:
        """The current buffer of that name, if one was handed out (tests read kernel state here)."""
        return self._named.get(name)

    def clear_error(self) -> None:
        self.error.zero_()

    def _get(self, name: str, numel: int, dtype: torch.dtype, make) -> torch.Tensor:
        buffer = self._named.get(name)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype:
            buffer = make(max(numel, MIN_ELEMENTS), dtype=dtype, device=self.device)
            self._named[name] = buffer
            self.buffers.append(buffer)
        return buffer
