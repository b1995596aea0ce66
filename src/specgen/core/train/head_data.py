"""The texts an EAGLE-3 head trains on, as token windows, and what it is measured on.

core/train/train_head.py trains; this module turns texts into token streams and windows (tokenized as
the steps need them), picks the draft vocabulary, and cuts the held-out prompts.
"""

from __future__ import annotations

import numpy as np
import torch

EVAL_PROMPT_TOKENS = 64


def encode(tokenizer, texts: list[str], eos_id: int, limit: int | None = None, group: int = 64) -> np.ndarray:
    """The texts' tokens, each document followed by EOS, as one stream (stops past `limit`).
    Texts go to the tokenizer `group` at a time: a fast tokenizer encodes a list in parallel."""
    parts, total = [], 0
    eos = np.array([eos_id], dtype=np.int64)
    for start in range(0, len(texts), group):
        for ids in tokenizer(texts[start:start + group], add_special_tokens=False)["input_ids"]:
            parts += [np.asarray(ids, dtype=np.int64), eos]
            total += len(ids) + 1
        if limit is not None and total >= limit:
            break
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class Windows:
    """Token windows [B, T] of the training texts: documents in a seeded order, tokenized as they
    are needed (a large corpus costs only what the steps read) and packed with EOS between them;
    the windows of `pool` batches at a time are shuffled, so that a batch does not hold the
    consecutive pieces of one long file."""

    def __init__(self, tokenizer, texts: list[str], eos_id: int, seq_len: int, batch: int, seed: int,
                 pool: int = 32):
        self.tokenizer, self.texts, self.eos_id = tokenizer, texts, eos_id
        self.seq_len, self.batch, self.pool = seq_len, batch, pool
        self.rng = np.random.default_rng(seed)
        self.order: list[int] = []
        self.carry = np.zeros(0, dtype=np.int64)  # the tokens after the last whole window
        self.windows = np.zeros((0, seq_len), dtype=np.int64)
        self.epochs = 0

    def next(self) -> torch.Tensor:
        while len(self.windows) < self.batch:
            self._read()
        block, self.windows = self.windows[:self.batch], self.windows[self.batch:]
        return torch.from_numpy(block.copy())  # [B, T]

    def _read(self) -> None:
        want, chunk = self.pool * self.batch * self.seq_len, []
        while sum(len(t) for t in chunk) < 3 * want:  # at least ~3 characters a token
            if not self.order:
                self.order = self.rng.permutation(len(self.texts)).tolist()
                self.epochs += 1
            chunk.append(self.texts[self.order.pop()])
        stream = np.concatenate([self.carry, encode(self.tokenizer, chunk, self.eos_id)])
        whole = len(stream) // self.seq_len * self.seq_len
        self.carry = stream[whole:]
        fresh = stream[:whole].reshape(-1, self.seq_len)
        self.windows = np.concatenate([self.windows, fresh[self.rng.permutation(len(fresh))]])


def draft_vocabulary(tokenizer, texts: list[str], eos_id: int, size: int, vocab: int,
                     sample_tokens: int = 4_000_000) -> torch.Tensor:
    """The `size` most frequent target ids in (a seeded-order sample of) the training texts, in id
    order, as EAGLE-3 chooses its draft vocabulary; ids never seen fill the rest by id."""
    if size >= vocab:
        return torch.arange(vocab)
    stream = encode(tokenizer, texts, eos_id, limit=sample_tokens)
    counts = np.bincount(stream, minlength=vocab)[:vocab].astype(np.float64)
    counts -= np.arange(vocab) * 1e-9  # ties (unseen ids): the lower id first
    return torch.from_numpy(np.sort(np.argsort(-counts, kind="stable")[:size]))


def eval_prompts(tokenizer, heldout: list[str], eos_id: int, count: int) -> torch.Tensor:
    """[N, EVAL_PROMPT_TOKENS]: windows spread evenly over the held-out texts' token stream
    (overlapping where it is short)."""
    from specgen.core.errors import UsageError

    stream = encode(tokenizer, heldout, eos_id, limit=count * EVAL_PROMPT_TOKENS * 8)
    if len(stream) < EVAL_PROMPT_TOKENS:
        raise UsageError(f"the held-out data has {len(stream)} tokens; measuring acceptance needs at least "
                         f"{EVAL_PROMPT_TOKENS}", hint="give more text with --data")
    starts = np.linspace(0, len(stream) - EVAL_PROMPT_TOKENS, count).round().astype(np.int64)
    return torch.from_numpy(np.stack([stream[s:s + EVAL_PROMPT_TOKENS] for s in starts]))
