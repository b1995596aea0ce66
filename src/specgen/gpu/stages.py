"""A model spread over several CUDA devices, stepped from one device and captured stretch by stretch.

A runner works from one device, its home (where the round's buffers and its logits live). When an
owned model's weights lie elsewhere too (a profile's `device_map`, or a draft placed on another
GPU: core/step/load.py places each decoder layer whole on one GPU), its step (core/step/model.py)
calls `Stages.bring` before each stretch of layers on another device:

- eagerly, bringing a tensor is a copy, and makes that device the current one, so that Triton's
  launches and the kernels' scratch follow;
- under capture (SegmentedGraph) it ends the CUDA graph of the stretch on the device before, packs
  what crosses (the residual stream, the rows, their rotary rows) into one buffer there, and
  begins the next stretch's graph on the device after: a replay is the graphs in order with one
  peer copy between each two.

Layers run one after another, so spreading a model over GPUs buys memory, never speed at batch 1:
docs/benchmarks.md, "A target over two GPUs", measures what a step pays for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch

ALIGN = 256  # bytes: each tensor's offset in a packed transfer (any dtype's view stays aligned)


@dataclass
class _Part:
    device: torch.device
    graph: torch.cuda.CUDAGraph
    after: list = field(default_factory=list)  # (source, destination) copies once the graph has run


class SegmentedGraph:
    """One capture that follows the work from device to device: a CUDA graph per stretch on one
    device, and between stretches the copies that carry tensors across. replay() runs them in the
    captured order, without a host synchronisation."""

    def __init__(self):
        self.parts: list[_Part] = []
        self.streams: dict[torch.device, torch.cuda.Stream] = {}
        self.pools: dict[torch.device, tuple] = {}  # one memory pool a device, shared by its stretches
        self._stack: contextlib.ExitStack | None = None
        self.held: list[torch.Tensor] = []  # tensors the graphs read or write across stretches

    @property
    def device(self) -> torch.device:
        return self.parts[-1].device

    @contextlib.contextmanager
    def capturing(self, device: torch.device):
        """Capture from `device`; the work must end back on it (a runner's step brings its logits home)."""
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)
        self._begin(device)
        try:
            yield self
        finally:
            self._end()
        if self.device != device:
            raise RuntimeError(f"a capture that began on {device} ended on {self.device}")

    def _begin(self, device: torch.device) -> None:
        stream = self.streams.get(device)
        if stream is None:
            stream = self.streams[device] = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.stream(stream))  # also makes `device` the current device
        graph = torch.cuda.CUDAGraph()
        if device not in self.pools:
            self.pools[device] = torch.cuda.graph_pool_handle()
        try:
            graph.capture_begin(pool=self.pools[device])
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        self.parts.append(_Part(device, graph))

    def _end(self) -> None:
        if self._stack is None:  # already ended (an error between two stretches)
            return
        try:
            self.parts[-1].graph.capture_end()
        finally:
            self._stack.close()
            self._stack = None

    def carry(self, tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """`tensors` (none on `device`) as tensors on `device`, and the capture moved there. Those on
        the stretch's device are packed into one buffer inside its graph and cross in one copy;
        others (left on a device by an earlier stretch) cross one by one."""
        here = self.device
        packed = [t for t in tensors if t.device == here and t.numel()]
        send, offsets = None, []
        if packed:
            offsets, total = _layout(packed)
            send = torch.empty(total, dtype=torch.uint8, device=here)  # in this stretch's pool
            for t, offset in zip(packed, offsets):
                _view(send, offset, t).copy_(t)
        self._end()
        out, after = {}, []
        if packed:
            receive = torch.empty(send.numel(), dtype=torch.uint8, device=device)
            after.append((send, receive))
            out.update((id(t), _view(receive, offset, t)) for t, offset in zip(packed, offsets))
        for t in tensors:
            if id(t) not in out:
                copy = torch.empty(t.shape, dtype=t.dtype, device=device)
                if t.numel():
                    after.append((t, copy))
                out[id(t)] = copy
        self.parts[-1].after = after
        self.held.extend(t for pair in after for t in pair)
        self._begin(device)
        return [out[id(t)] for t in tensors]

    def summary(self) -> str:
        """What a replay runs: '3 graphs (cuda:1, cuda:0, cuda:1), 3 copies, 33,536 bytes'."""
        copies = [pair for part in self.parts for pair in part.after]
        size = sum(source.numel() * source.element_size() for source, _ in copies)
        devices = ", ".join(str(part.device) for part in self.parts)
        return f"{len(self.parts)} graphs ({devices}), {len(copies)} copies, {size:,} bytes"

    @torch.inference_mode()  # the buffers are inference tensors, as everything a step makes
    def replay(self) -> None:
        for part in self.parts:
            with torch.cuda.device(part.device):
                part.graph.replay()
            for source, destination in part.after:
                destination.copy_(source, non_blocking=True)  # torch orders both devices' streams


def _layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    offsets, at = [], 0
    for t in tensors:
        offsets.append(at)
        at += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return offsets, at


def _view(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    size = like.numel() * like.element_size()
    return buffer[offset:offset + size].view(like.dtype).view(like.shape)


def model_devices(model) -> set[torch.device]:
    return {t.device for t in (*model.parameters(), *model.buffers())}


def spread(model, home: torch.device) -> bool:
    """Whether any weight of `model` lies on another GPU than `home` (then its runner needs Stages)."""
    return any(device.type == "cuda" and device != home for device in model_devices(model))


def units(module) -> list:
    """The largest modules whose weights and buffers all lie on one device, in module order."""
    devices = {t.device for t in (*module.parameters(), *module.buffers())}
    if len(devices) <= 1:
        return [module] if devices else []
    return [unit for child in module.children() for unit in units(child)]


def unit_device(module) -> torch.device:
    return next(iter((*module.parameters(), *module.buffers()))).device


class Stages:
    """How one runner's steps cross devices (see the module docstring). on_enter(device) runs at
    each change of device."""

    def __init__(self, model, home: torch.device, on_enter=None):
        self.home = home
        self.on_enter = on_enter
        self.units = units(model)
        self.devices = sorted({unit_device(u) for u in self.units} | {home}, key=str)
        self.recorder: SegmentedGraph | None = None  # set while a capture runs through this model
        self._moved: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._sources: list[torch.Tensor] = []  # keeps ids in _moved from being reused within a step
        self.current = home

    def describe(self) -> dict:
        """Which devices hold which units (decoder layers by their index in the model's list)."""
        where: dict[str, list[str]] = {}
        for unit in self.units:
            where.setdefault(str(unit_device(unit)), []).append(type(unit).__name__)
        return {device: _summary(names) for device, names in where.items()}

    @contextlib.contextmanager
    def step(self):
        """One step of the runner: starts at home, ends at home (bring() its outputs back)."""
        saved = torch.cuda.current_device()
        self._moved, self._sources = {}, []
        self.current = self.recorder.device if self.recorder is not None else self.home
        try:
            yield
        finally:
            self._moved, self._sources = {}, []
            self.current = self.home
            if self.recorder is None:
                torch.cuda.set_device(saved)
            if self.on_enter is not None:
                self.on_enter(self.home)

    @contextlib.contextmanager
    def recording(self, recorder: SegmentedGraph):
        self.recorder = recorder
        try:
            yield
        finally:
            self.recorder = None

    def bring(self, device: torch.device, tree):
        """tree (tensors, tuples, lists, dicts, dataclasses such as core/step/rows.py's Rows) with
        every CUDA tensor on `device`, which becomes the current device."""
        if device.type != "cuda":
            return tree
        away = []
        _collect(tree, device, away)
        fresh = []
        for t in away:
            if (id(t), device) not in self._moved and not any(t is f for f in fresh):
                fresh.append(t)
        if fresh or device != self.current:
            self._carry(fresh, device)
        return _replace(tree, device, self._moved)

    def _carry(self, tensors: list[torch.Tensor], device: torch.device) -> None:
        if self.recorder is not None:
            moved = self.recorder.carry(tensors, device)
        else:
            torch.cuda.set_device(device)
            moved = [t.to(device) for t in tensors]
        self._sources.extend(tensors)
        self._moved.update(((id(t), device), m) for t, m in zip(tensors, moved))
        if device != self.current and self.on_enter is not None:
            self.on_enter(device)
        self.current = device


def _collect(tree, device: torch.device, out: list) -> None:
    if isinstance(tree, torch.Tensor):
        if tree.device.type == "cuda" and tree.device != device:
            out.append(tree)
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for item in dataclasses.fields(tree):
            _collect(getattr(tree, item.name), device, out)
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            _collect(item, device, out)
    elif isinstance(tree, dict):
        for item in tree.values():
            _collect(item, device, out)


def _replace(tree, device: torch.device, moved: dict):
    if isinstance(tree, torch.Tensor):
        return moved.get((id(tree), device), tree)
    if isinstance(tree, (tuple, list)):
        items = [_replace(t, device, moved) for t in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)  # namedtuples by field
    if isinstance(tree, dict):
        return {k: _replace(v, device, moved) for k, v in tree.items()}
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return dataclasses.replace(tree, **{f.name: _replace(getattr(tree, f.name), device, moved)
                                            for f in dataclasses.fields(tree) if f.init})
    return tree


def _summary(names: list[str]) -> str:
    """['LlamaDecoderLayer'] * 16 + ['LlamaRMSNorm', 'Linear'] -> '16 LlamaDecoderLayer, LlamaRMSNorm, Linear'."""
    parts, i = [], 0
    while i < len(names):
        j = i
        while j < len(names) and names[j] == names[i]:
            j += 1
        parts.append(f"{j - i} {names[i]}" if j - i > 1 else names[i])
        i = j
    return ", ".join(parts)
