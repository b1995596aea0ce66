"""Warm up, then capture: the one sequence every CUDA graph of the run is made by (the round's
program and pieces of it in gpu/backend.py, the runners' steps in gpu/runner.py, the tuner's timing
in gpu/tuning/tune.py). Each caller keeps its own specifics: what its warm-ups write (scratch positions, a
state restored after), and what to do when capture fails.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Callable, Iterable

import torch

from specgen.gpu import stages


def capturing(graph: torch.cuda.CUDAGraph, device: torch.device):
    """torch.cuda.graph on a capture stream of `device`. torch's own default capture stream is one
    per process, made on whichever GPU was current at its first capture: a later capture for
    another GPU would switch to that one and record its kernels there, where the round's events
    never wait for them (a pair on GPU 0 after a capture on GPU 1 read its tokens unfinished)."""
    return torch.cuda.graph(graph, stream=torch.cuda.Stream(device))


def capture(fn: Callable[[], object], device: torch.device, warmups: int, *, warm_up: Callable[[], None] | None = None,
            settle: Callable[[], None] | None = None, segmented: Iterable[stages.Stages] = ()) -> tuple:
    """(graph, what fn returned while captured): `warm_up` (fn unless given) run `warmups` times on a
    side stream of `device` (Triton's JIT, cuBLAS handles, lazy allocations; they run for real, so
    callers point them at scratch state), then `settle` on the current stream, then fn captured on
    a stream of `device`, all in inference mode. segmented: the Stages of models over several
    devices that fn steps, recorded as one stages.SegmentedGraph; else one CUDA graph. Raises what
    capture raises: the caller falls back."""
    warm_up = warm_up or fn
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(warmups):
            warm_up()
    torch.cuda.current_stream(device).wait_stream(stream)
    if settle is not None:
        settle()
    segmented = list(segmented)
    with contextlib.ExitStack() as stack:
        # No automatic collection while capturing (torch.cuda.graph collects once before it begins):
        # a collected cycle that holds an earlier graph (a freed round's, a replaced decoder's)
        # resets that graph mid-capture, which CUDA refuses ("operation not permitted when stream
        # is capturing"), and the capture fails: a batch tree round's CUDA test ran eagerly so once,
        # among other test files on the same GPU (2026-11-29). Unwound after the capture ends.
        if gc.isenabled():
            gc.disable()
            stack.callback(gc.enable)
        if segmented:
            graph = stages.SegmentedGraph()
            stack.enter_context(graph.capturing(device))
            for spread in segmented:
                stack.enter_context(spread.recording(graph))
        else:
            graph = torch.cuda.CUDAGraph()
            stack.enter_context(capturing(graph, device))
        stack.enter_context(torch.inference_mode())
        result = fn()
    return graph, result
