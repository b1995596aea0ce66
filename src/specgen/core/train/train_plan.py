"""What `specgen train-head` is asked to do, checked before torch is imported.

core/train/train_head.py does the training; this module holds its options as one frozen object and the
checks a user's mistake fails (UsageError: one line, exit code 2), so that the command answers a
bad option at once. The checks that need the target's config (layer ids, vocabulary size) run in
`check_against_target` on its config.json, also before torch where the target is a local folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from specgen.core.errors import UsageError

# EAGLE-3's draft vocabulary for Llama-3's 128k-token one; a smaller target keeps its whole vocabulary.
DEFAULT_DRAFT_VOCAB = 32000
EVAL_K = 8  # report.json's simulated acceptance is given at k = 1..EVAL_K
SHOWN_K = 4  # the progress bar's


@dataclass(frozen=True)
class TrainPlan:
    minutes: float  # wall-time cap of the whole command
    steps: int  # 0 = as many as fit in `minutes`
    batch_size: int | None  # sequences per step; None = by device (`for_device`)
    seq_len: int | None  # tokens per sequence; None = by device, at most the target's context
    lr: float  # peak learning rate (AdamW; warmup, then cosine to 10%)
    warmup_steps: int  # steps of linear warmup to the peak, whatever the run's length
    ttt_steps: int  # training-time-test unroll depth: the head's drafting steps trained per position
    layers: tuple[int, int, int] | None  # aux layer ids; None = EAGLE-3's default, made valid for the target
    draft_vocab: int | None  # None = DEFAULT_DRAFT_VOCAB capped at the target's vocabulary
    seed: int
    regenerate: bool  # train on the target's own continuations of prompts cut from the data
    init_from_target: bool  # lm_head rows and final norm from the target's
    eval_prompts: int  # held-out prompts whose greedy continuations measure acceptance

    def __post_init__(self):
        _check(self.minutes > 0 and math.isfinite(self.minutes), f"--minutes {self.minutes:g}", "must be > 0")
        _check(self.steps >= 0, f"--steps {self.steps}", "must be >= 0 (0 = until --minutes)")
        if self.batch_size is not None:
            _check(1 <= self.batch_size <= 4096, f"--batch-size {self.batch_size}", "must be from 1 to 4096")
        if self.seq_len is not None:
            _check(8 <= self.seq_len <= 1 << 20, f"--seq-len {self.seq_len}", "must be from 8 to 1048576")
        _check(0 < self.lr < 1 and math.isfinite(self.lr), f"--lr {self.lr:g}", "must be in (0, 1)")
        _check(0 <= self.warmup_steps <= 1_000_000, f"--warmup-steps {self.warmup_steps}",
               "must be from 0 (none) to 1000000")
        _check(1 <= self.ttt_steps <= 16, f"--ttt-steps {self.ttt_steps}", "must be from 1 to 16")
        if self.seq_len is not None:
            _check(self.seq_len > self.ttt_steps + 1, f"--seq-len {self.seq_len}",
                   f"must exceed --ttt-steps + 1 ({self.ttt_steps + 1})")
        if self.draft_vocab is not None:
            _check(self.draft_vocab >= 1, f"--draft-vocab {self.draft_vocab}", "must be >= 1")
        _check(0 <= self.seed < 2**63, f"--seed {self.seed}", "must be from 0 to 2**63 - 1")
        _check(1 <= self.eval_prompts <= 1024, f"--eval-prompts {self.eval_prompts}", "must be from 1 to 1024")

    def for_device(self, cuda: bool, context: int | None) -> TrainPlan:
        """Batch size and sequence length resolved: on CUDA 16 × 1024 tokens a step, on the CPU
        4 × 256 (more, smaller steps learn more in the minutes a CPU has); the sequence at most
        the target's context (`context`: its max_position_embeddings, None if unknown)."""
        import dataclasses

        batch, seq = (16, 1024) if cuda else (4, 256)
        seq = self.seq_len or (min(seq, context) if context else seq)
        return dataclasses.replace(self, batch_size=self.batch_size or batch, seq_len=max(seq, self.ttt_steps + 2))

    def resolved_layers(self, target_layers: int) -> tuple[int, int, int]:
        """--layers, else default_layers()."""
        return self.layers if self.layers is not None else default_layers(target_layers)

    def resolved_draft_vocab(self, target_vocab: int) -> int:
        return self.draft_vocab if self.draft_vocab is not None else min(DEFAULT_DRAFT_VOCAB, target_vocab)

    def check_against_target(self, layers: int, vocab: int, context: int | None) -> None:
        """The options that depend on the target: layer ids, the draft vocabulary's size and the
        sequence length (`context`: its max_position_embeddings, None if unknown)."""
        if self.seq_len is not None and context and self.seq_len > context:
            raise UsageError(f"--seq-len {self.seq_len} is longer than the target's context ({context} tokens)",
                             hint=f"give at most {context}, or leave it out")
        if self.layers is not None and any(i >= layers for i in self.layers):
            raise UsageError(f"--layers {','.join(map(str, self.layers))}: the target has {layers} layers "
                             f"(ids 0 to {layers - 1}; id i is the input of layer i)",
                             hint="leave --layers out for EAGLE-3's default")
        if self.draft_vocab is not None and self.draft_vocab > vocab:
            raise UsageError(f"--draft-vocab {self.draft_vocab} is larger than the target's vocabulary ({vocab})",
                             hint=f"give at most {vocab}, or leave it out")


def _check(ok: bool, subject: str, rule: str) -> None:
    if not ok:
        raise UsageError(f"{subject} is not allowed: {rule}")


def default_layers(n: int) -> tuple[int, int, int]:
    """EAGLE-3's aux layer ids (2, N // 2, N - 3) for a target of N layers where those are three
    increasing ids, else (0, N // 2, N - 1): low, middle, high of a shallow target."""
    ids = (2, n // 2, n - 3)
    if not (0 <= ids[0] < ids[1] < ids[2] < n):
        ids = (0, n // 2, n - 1)
    return tuple(min(max(i, 0), n - 1) for i in ids)


def parse_layers(text: str | None) -> tuple[int, int, int] | None:
    """--layers "2,6,9": three layer ids >= 0 (the input of each layer; 0 = the embeddings)."""
    if text is None:
        return None
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        ids = ()
    if len(ids) != 3 or any(i < 0 for i in ids):
        raise UsageError(f"--layers takes three comma-separated layer ids >= 0, got {text!r}",
                         hint="e.g. --layers 2,6,9 (low, middle, high), or leave it out for EAGLE-3's default")
    return ids


def local_target_config(path: str) -> dict | None:
    """The target's config.json where the profile names a local folder that has one, else None
    (a hub id: checked once the model has loaded)."""
    file = Path(path) / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the loader says what is wrong with it
    return config if isinstance(config, dict) else None

