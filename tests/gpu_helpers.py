"""Builders shared by the gpu/ tests: runners with explicit kernel settings.

Import tests/triton_cpu.py first (it sets TRITON_INTERPRET before Triton is imported).
"""

from __future__ import annotations

from triton_cpu import DEVICE

from specgen.core.settings import KernelSpec
from specgen.gpu.kernels import ResolvedKernels, resolve
from specgen.gpu.workspace import Workspace


def kernels(attention: bool = False, linear: bool = False, rope: bool = False, split_k: bool = False,
            warp: bool = False, norm: bool = False, head: bool = False, step_io: bool = False) -> ResolvedKernels:
    return ResolvedKernels(attention=attention, linear=linear, rope=rope, split_k=split_k, warp=warp, norm=norm,
                           head=head, step_io=step_io)


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


def kernel_decoder(engine, kernels: ResolvedKernels, capacity: int = 192):
    """A greedy draft-model decoder for engine's profile (its k and sampling) whose round is the
    real one (core/round.py, the torch backend's verifier) over runners with these kernels on
    DEVICE: on the CPU, the Triton interpreter's kernels inside the round that a GPU would capture.
    The runners rewire engine's models: run the engine's own decoders first."""
    from specgen.core.backend import TorchBackend
    from specgen.core.decode import Decoder, DecodeSetup
    from specgen.core.round import Mode, Round, RoundShape

    profile, pair = engine.profile, engine.pair
    assert profile.sampling.greedy and profile.proposer.kind == "draft"
    shape = RoundShape(k=profile.speculation.k, width=engine.width, vocab_size=pair.vocab_size, has_draft=True,
                       sample_draft=False, cut=False, penalties=False, min_tokens=False, p_min=0.0, insight=False)
    target, draft = (runner(model, kernels=kernels, width=engine.width, capacity=capacity)
                     for model in (pair.target, pair.draft))
    backend = TorchBackend(DEVICE)
    sampling = profile.sampling
    stop_ids = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else engine.eos_ids)
    rnd = Round(shape, sampling, backend, target, draft, sorted(stop_ids))
    setup = DecodeSetup(sampling=sampling, k=shape.k, eos_ids=engine.eos_ids, max_context=engine.max_context)
    return Decoder(rnd, {Mode.MODEL: backend.program(rnd, Mode.MODEL)}, engine.tokenizer, setup)
