"""The weight-streaming floor: the least time a step or round can take on a device.

At batch 1 a decode step reads every weight it multiplies by once, so its time cannot fall below
those bytes over the device's memory bandwidth; how near a step or round comes to that floor says
how much of its time is anything else (launches, latency, small kernels). `specgen bench` reports
it beside each round's time (docs/bench-schema.md).

The bytes are the model's parameters as a step reads them: each stored tensor once (tied weights
once), less the input embedding unless the output projection is that same tensor, since a step
gathers one row of it. The bandwidth is a device-to-device copy's, bytes read plus bytes written,
measured in the same process, as docs/benchmarks.md's floors are.

A batch step (core/round/batch_round.py) streams the weights once for all its rows, and each row
reads its own keys and values: the cached positions before the step, times the cache's bytes per
position (layers x kv heads x head dim x 2 x the element's bytes). That is the batch floor
(`batch_bytes`); what it leaves out is small beside it, so it stays a floor: the keys and values
a step writes (k + 1 positions a row), the activations and the logits. An EAGLE-3 head drafting
the batch (core/round/batch_head.py) is its own drafter (`head_batch_bytes`): its one layer's cache
per position, and its weights less `fc`, which only a round's first call reads (it fuses the
target's states; the later calls step the head's own).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

COPY_BYTES = 2**30  # each of the copy's two buffers: far past any L2, small beside a model
COPY_RUNS = 10  # timed copies; the first two are left out of the median


def streamed_bytes(model: torch.nn.Module, gathered: torch.Tensor | None = None) -> int:
    """Bytes of weights one decode step of `model` reads. gathered: a weight the step only gathers
    rows of (default: the model's input embedding, unless it is tied to the output projection)."""
    if gathered is None:
        gathered = _untied_input_embedding(model)
    total = 0
    for parameter in model.parameters():  # each shared parameter once
        if parameter is gathered:  # identity, not data_ptr: offloaded (meta) weights all have 0
            continue
        total += parameter.numel() * parameter.element_size()
    return total


def _untied_input_embedding(model) -> torch.Tensor | None:
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    embedding = get_in() if get_in is not None else None
    if not isinstance(embedding, torch.nn.Module) or not isinstance(getattr(embedding, "weight", None), torch.Tensor):
        return None
    output = get_out() if get_out is not None else None
    weight = getattr(output, "weight", None)
    if weight is embedding.weight:  # transformers ties by sharing the parameter
        return None  # tied: the LM head streams it
    return embedding.weight


def copy_bandwidth(device: torch.device, nbytes: int = COPY_BYTES) -> float | None:
    """Bytes per second of a device-to-device copy on a CUDA `device` (read plus written): the
    median of COPY_RUNS - 2 timed copies. None on other devices, or where two buffers of `nbytes`
    do not fit beside what the device holds."""
    if device.type != "cuda":
        return None
    try:
        source = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
        target = torch.empty_like(source)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()  # hand back what the first buffer took, for the models' caches
        return None
    times = []
    with torch.cuda.device(device):
        for _ in range(COPY_RUNS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    del source, target
    torch.cuda.empty_cache()
    return 2 * (nbytes // 4) * 4 / statistics.median(times[2:])


def floor_ms(target_bytes: int, drafter_bytes: int, calls: int, bandwidth: float) -> float:
    """A round's floor in ms: one target step, and `calls` drafter calls (k for a draft model or a
    head: a round's first call extends over two or more rows, the rest step one)."""
    return (target_bytes + calls * drafter_bytes) / bandwidth * 1e3


@dataclass(frozen=True)
class StepBytes:
    """What one step of a model reads in a batch: its weights once (`streamed_bytes`), and per row
    `per_position` bytes of keys and values for each position it has cached (None where that is
    not one number: a model with sliding windows reads at most a window)."""

    weights: int
    per_position: int | None
    first: int = 0  # weights only a round's first drafter call reads (a head's fc), not in `weights`


def cache_bytes_per_position(config, element_size: int) -> int | None:
    """Bytes of keys and values one row holds for one position, over every layer: layers x kv
    heads x head dim x 2 (keys, values) x element_size (core/step/cache.py's SlotCache). None for
    sliding windows (StepConfig.windows), or a config that does not say its heads."""
    if any(w is not None for w in getattr(config, "windows", ())):
        return None
    heads = getattr(config, "num_key_value_heads", None)
    dim = getattr(config, "head_dim", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not (heads and dim and layers):
        return None
    return layers * heads * dim * 2 * element_size


def head_step_bytes(head) -> StepBytes:
    """StepBytes of an EAGLE-3 head (core/drafters/eagle.py's Eagle3Head) as a batch drafts with it:
    its parameters (its layer, norms and lm_head over the draft vocabulary; the embedding is the
    target's, a buffer a step gathers rows of) less `fc`, which `first` holds; per position its one
    layer's keys and values (kv heads x head dim x 2 x the cache's element, fc's dtype:
    core/round/batch_head.py's cache)."""
    fc = head.fc.weight
    fused = fc.numel() * fc.element_size()
    per_position = head.config.num_key_value_heads * head.config.head_dim * 2 * fc.element_size()
    return StepBytes(streamed_bytes(head) - fused, per_position, first=fused)


def batch_bytes(target: StepBytes, draft: StepBytes | None, k: int, rounds: int, rows: int,
                target_positions: int, draft_positions: int = 0) -> dict[str, int | None]:
    """The least bytes `rounds` rounds of a batch read, by model: {"target": ..., "draft": ...}
    (draft None at k 0). rows: the rows that held a prompt, summed over the rounds;
    *_positions: their cached positions in each model before each round, summed likewise.

    target: one step a round (k + 1 ids a row), its weights once and each row's cached keys.
    draft: k steps a round; step 0 steps a row's two pending ids at its position P, step i >= 1
    one id at P + i + 1 (core/round/batch_round.py), so a row's k steps read k P + (k - 1)(k + 2) / 2
    positions. A part is None where its model's per-position bytes are."""
    out: dict[str, int | None] = {"target": None, "draft": None}
    if target.per_position is not None:
        out["target"] = rounds * target.weights + target.per_position * target_positions
    if k and draft is not None and draft.per_position is not None:
        read = k * draft_positions + rows * (k - 1) * (k + 2) // 2
        out["draft"] = k * rounds * draft.weights + draft.per_position * read
    return out


def head_batch_bytes(head: StepBytes, k: int, rounds: int, rows: int, target_positions: int,
                     origins: int) -> int | None:
    """The least bytes an EAGLE-3 head's k calls read over `rounds` rounds of a batch (None where
    its per-position bytes are not known). rows, target_positions: as batch_bytes's; origins: each
    row's P - e before each round (e the tokens its last round emitted, 0 at least), summed likewise.

    Call 0 extends the head over the last round's k + 1 target rows from P - e, reading the P - e
    positions cached before them, and fuses their states (`first`); call i >= 1 steps one id at
    P + i - 1 (core/round/batch_head.py), so a row's k calls read P - e + (k - 1) P + (k - 1)(k - 2) / 2
    positions."""
    if head.per_position is None:
        return None
    read = origins + (k - 1) * target_positions + rows * (k - 1) * (k - 2) // 2
    return k * rounds * head.weights + rounds * head.first + head.per_position * read
