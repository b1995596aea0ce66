"""A model spread over several CUDA devices, stepped from one device and captured stretch by stretch.

A runner works from one device, its home (where the round's buffers and its logits live). When a
model's weights lie elsewhere too (a profile's `device_map`, or a draft placed on another GPU),
Stages takes over from accelerate's hooks, which move tensors with `.to()` inside every forward:
a cross-device copy that CUDA-graph capture cannot hold. Instead:

- the model is cut into units, the largest modules whose weights all lie on one device (its
  embedding, each decoder layer, the final norm, the output projection); a pre-hook on each, and
  on the model itself, brings the call's tensors to the unit's device and makes that device the
  current one, so that Triton's launches and the kernels' scratch follow;
- the KV cache's layers read a copy of the runner's position on their own device (`mirrors`),
  refreshed at the first entry into that device in each step;
- eagerly, bringing a tensor is a copy; under capture (SegmentedGraph) it ends the CUDA graph of
  the stretch on the device before, packs what crosses into one buffer there, and begins the next
  stretch's graph on the device after: a replay is the graphs in order with one peer copy between
  each two (plus the position's eight bytes).

Layers run one after another, so spreading a model over GPUs buys memory, never speed at batch 1:
docs/benchmarks.md, "A target over two GPUs", measures what a step pays for it.
"""

from __future__ import annotations

import contextlib
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

    def carry(self, tensors: list[torch.Tensor], device: torch.device,
              fixed: list[tuple[torch.Tensor, torch.Tensor]] = ()) -> list[torch.Tensor]:
        """`tensors` (none on `device`) as tensors on `device`, and the capture moved there. Those on
        the stretch's device are packed into one buffer inside its graph and cross in one copy;
        others (left on a device by an earlier stretch) cross one by one. fixed: copies into
        tensors the caller owns (the position's mirror), made at the same point."""
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
        after.extend(fixed)
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


def remove_dispatch_hooks(model) -> None:
    """accelerate's hooks off (they copy tensors inside forwards, which capture cannot hold); the
    weights stay where accelerate put them.

    accelerate puts back each module's forward as an instance attribute (the class's forward,
    bound): it would shadow every forward that rewiring later gives the module by changing its
    class (gpu/rewire.py), and the step would run cuBLAS and torch's norms instead of the kernels
    (a split 8B step ran 65% slower so). Those attributes go too."""
    hooked = [module for module in model.modules() if hasattr(module, "_hf_hook")]
    if not hooked:
        return
    from accelerate.hooks import remove_hook_from_module

    remove_hook_from_module(model, recurse=True)
    for module in hooked:
        forward = vars(module).get("forward")
        if getattr(forward, "__self__", None) is module and forward.__func__ is type(module).forward:
            del module.forward


class Stages:
    """The hooks that carry one model's calls from unit to unit, and the per-device copies of its
    runner's position (see the module docstring). on_enter(device) runs at each change of device
    (the runner points its linear kernel's split-K counters there)."""

    def __init__(self, model, home: torch.device, on_enter=None):
        self.home = home
        self.on_enter = on_enter
        remove_dispatch_hooks(model)
        self.entry = unit_device(model.get_input_embeddings())  # where a forward starts
        # Modules of buffers only (rotary embeddings: tables every layer reads) join the embedding,
        # where the forward calls them: placed elsewhere, each step would cross there and back.
        for module in model.modules():
            if next(module.buffers(recurse=False), None) is not None and next(module.parameters(), None) is None:
                module.to(self.entry)
        self.units = units(model)
        self.devices = sorted({unit_device(u) for u in self.units} | {home}, key=str)
        self.recorder: SegmentedGraph | None = None  # set while a capture runs through this model
        self.position: torch.Tensor | None = None
        self.mirrors: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._moved: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._sources: list[torch.Tensor] = []  # keeps ids in _moved from being reused within a step
        self._entered: set[torch.device] = set()
        self.current = home
        self.handles = [model.register_forward_pre_hook(self._model_hook, with_kwargs=True)]
        self.handles += [unit.register_forward_pre_hook(self._unit_hook, with_kwargs=True) for unit in self.units]
        self._devices = {id(unit): unit_device(unit) for unit in self.units}

    def describe(self) -> dict:
        """Which devices hold which units (decoder layers by their index in the model's list)."""
        where: dict[str, list[str]] = {}
        for unit in self.units:
            where.setdefault(str(unit_device(unit)), []).append(type(unit).__name__)
        return {device: _summary(names) for device, names in where.items()}

    # -- the runner's side ----------------------------------------------------------------------

    def allocate(self, position: torch.Tensor, steps: torch.Tensor) -> dict:
        """Mirrors of the runner's (position, steps) on every device the model uses; returns them
        by device (the home entry is the runner's own) for the KV cache's layers."""
        self.position = position
        self.mirrors = {self.home: (position, steps)}
        for device in self.devices:
            if device != self.home:
                self.mirrors[device] = (torch.zeros_like(position, device=device), steps.to(device))
        return self.mirrors

    def sync_positions(self) -> None:
        """Every mirror set to the position now (eager forwards, which read the cache's length)."""
        for device, (mirror, _) in self.mirrors.items():
            if device != self.home:
                mirror.copy_(self.position)

    @contextlib.contextmanager
    def step(self):
        """One forward of the runner: starts at home, ends at home (bring() its outputs back)."""
        saved = torch.cuda.current_device()
        self._moved, self._sources, self._entered = {}, [], {self.home}
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
        """tree (tensors, tuples, lists, dicts) with every CUDA tensor on `device`, which becomes
        the current device."""
        away = []
        _collect(tree, device, away)
        fresh = []
        for t in away:
            if (id(t), device) not in self._moved and not any(t is f for f in fresh):
                fresh.append(t)
        fixed = []
        if device not in self._entered and device != self.home:
            self._entered.add(device)
            mirror = self.mirrors[device][0]
            fixed.append((self.position, mirror))
            self._moved[(id(self.position), device)] = mirror
            fresh = [t for t in fresh if t is not self.position]
        if fresh or fixed or device != self.current:
            self._carry(fresh, device, fixed)
        return _replace(tree, device, self._moved)

    def _carry(self, tensors: list[torch.Tensor], device: torch.device, fixed: list) -> None:
        if self.recorder is not None:
            moved = self.recorder.carry(tensors, device, fixed)
        else:
            torch.cuda.set_device(device)
            moved = [t.to(device) for t in tensors]
            for source, destination in fixed:
                destination.copy_(source)
        self._sources.extend(tensors)
        self._moved.update(((id(t), device), m) for t, m in zip(tensors, moved))
        if device != self.current and self.on_enter is not None:
            self.on_enter(device)
        self.current = device

    # -- hooks ----------------------------------------------------------------------------------

    def _model_hook(self, module, args, kwargs):
        return self.bring(self.entry, (args, kwargs))

    def _unit_hook(self, module, args, kwargs):
        return self.bring(self._devices[id(module)], (args, kwargs))


def _collect(tree, device: torch.device, out: list) -> None:
    if isinstance(tree, torch.Tensor):
        if tree.device.type == "cuda" and tree.device != device:
            out.append(tree)
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
