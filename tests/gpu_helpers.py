"""Builders shared by the gpu/ tests: runners with explicit kernel settings, and commit buffers
compared field by field.

Import tests/triton_cpu.py first (it sets TRITON_INTERPRET before Triton is imported).
"""

from __future__ import annotations

import dataclasses

import torch
from triton_cpu import DEVICE

from specgen.core.backend import TorchBackend
from specgen.core.settings import KernelSpec
from specgen.gpu.policy import ResolvedKernels, resolve
from specgen.gpu.workspace import Workspace


def kernels(attention: bool = False, linear: bool = False, rope: bool = False, split_k: bool = False,
            warp: bool = False, norm: bool = False, head: bool = False, step_io: bool = False,
            dependent_launch: bool = False) -> ResolvedKernels:
    return ResolvedKernels(attention=attention, linear=linear, rope=rope, split_k=split_k, warp=warp, norm=norm,
                           head=head, step_io=step_io, dependent_launch=dependent_launch)


def owned(model):
    """specgen's own model (core/step/) with a transformers model's weights (copied): what the
    loader gives for its checkpoint. An owned model is returned as it is."""
    from specgen.core.step import config as step_config
    from specgen.core.step.load import from_state
    from specgen.core.step.model import OwnedModel

    if isinstance(model, OwnedModel):
        return model
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    device = model.get_output_embeddings().weight.device
    return from_state(step_config.of(model.config.to_dict()), state, device)


def runner(model, *, kernels: ResolvedKernels, shapes=(), use_graphs: bool = False, workspace=None, width: int = 96,
           capacity: int = 600, **options):
    """A GraphRunner of `capacity` positions on DEVICE, handing out `width` logits columns (96: most
    tiny test models' vocabulary), over `model` as specgen's own (`owned`). The attention kernel
    launches a program per split of 64 cache positions: a smaller capacity makes interpreted runner
    tests cheaper."""
    from specgen.gpu.runner import GraphRunner

    return GraphRunner(owned(model), width, capacity, kernels=kernels, workspace=workspace or Workspace(DEVICE),
                       shapes=shapes, use_graphs=use_graphs, **options)


def resolved(model, **values) -> ResolvedKernels:
    """resolve() of a KernelSpec with these values (the rest `auto`) for model on DEVICE."""
    return resolve(KernelSpec(**values), DEVICE, model)


class KernelRunners(TorchBackend):
    """The torch backend (its verifier, its round run as it is) over GraphRunners with these
    kernels and no capture: on the CPU, the Triton interpreter's kernels inside the real round that
    a GPU would capture. Engine(profile, backend=KernelRunners(...)). capacity: each runner's cache
    positions (the interpreted attention kernel runs a program per 64 of them)."""

    def __init__(self, kernels: ResolvedKernels, capacity: int = 192):
        super().__init__(DEVICE)
        self.kernels = kernels
        self.capacity = capacity

    def runner(self, model, width: int, capacity: int, name: str, shapes: tuple[int, ...] = (), tap=None):
        return runner(model, kernels=self.kernels, width=width, capacity=self.capacity, name=name, tap=tap)


def copy_buffers(buffers):
    """A dataclass of a commit's buffers with every tensor cloned (the kernel's and the reference's
    own copies of the same inputs)."""
    return dataclasses.replace(buffers, **{f.name: getattr(buffers, f.name).clone() for f in dataclasses.fields(buffers)
                                           if isinstance(getattr(buffers, f.name), torch.Tensor)})


def assert_same_buffers(kernel, reference) -> None:
    """Every tensor field of two such dataclasses bitwise equal, named where it is not."""
    for field in dataclasses.fields(kernel):
        x, y = getattr(kernel, field.name), getattr(reference, field.name)
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), f"{field.name}: kernel {x.tolist()} reference {y.tolist()}"
