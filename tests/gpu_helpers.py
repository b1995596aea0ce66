"""Builders shared by the gpu/ tests: runners with explicit kernel settings.

Import tests/triton_cpu.py first (it sets TRITON_INTERPRET before Triton is imported).
"""

from __future__ import annotations

from triton_cpu import DEVICE

from specgen.core.settings import KernelSpec
from specgen.gpu.kernels import ResolvedKernels, resolve
from specgen.gpu.workspace import Workspace


def kernels(attention: bool = False, linear: bool = False, rope: bool = False, split_k: bool = False,
            warp: bool = False, norm: bool = False, head: bool = False) -> ResolvedKernels:
    return ResolvedKernels(attention=attention, linear=linear, rope=rope, split_k=split_k, warp=warp, norm=norm,
                           head=head)


def runner(model, *, kernels: ResolvedKernels, shapes=(), use_graphs: bool = False, workspace=None, width: int = 96,
           capacity: int = 600, **options):
    """A GraphRunner of `capacity` positions on DEVICE, handing out `width` logits columns (96: most
    tiny test models' vocabulary). The attention kernel launches a program per split of 64 cache
    positions: a smaller capacity makes interpreted runner tests cheaper."""
    from specgen.gpu.runner import GraphRunner

    return GraphRunner(model, width, capacity, kernels=kernels, workspace=workspace or Workspace(DEVICE), shapes=shapes,
                       use_graphs=use_graphs, **options)


def resolved(model, **values) -> ResolvedKernels:
    """resolve() of a KernelSpec with these values (the rest `auto`) for model on DEVICE."""
    return resolve(KernelSpec(**values), DEVICE, model)
