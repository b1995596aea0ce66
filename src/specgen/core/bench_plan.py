"""What `specgen bench` measures: the sweep and the baselines, without torch, so that the command
can check its options before it imports torch (core/bench.py measures)."""

from __future__ import annotations

from dataclasses import dataclass

BASELINES = ("target-only", "hf", "hf-static", "hf-assisted")
HF_BASELINES = ("hf", "hf-static")  # plain Hugging Face generate, without a draft


@dataclass(frozen=True)
class Plan:
    ks: tuple[int, ...]
    temperatures: tuple[float, ...]
    baselines: tuple[str, ...] = ("target-only",)
    repeat: int = 1
    warmup: int = 1
    records: bool = False  # keep per-round records of every speculative run (for inspect-acceptance)
