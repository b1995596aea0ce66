"""The batch loop's host work per row and round, on the CPU, without a model.

BatchDecoder._settle_round is driven over synthetic staged rows: each row's output is real text
(the demo pair's held-out prompts, tokenized by its tokenizer), cut into rounds of accepted + 1
tokens as a draft of k=4 with acceptance ~0.6 would emit them. Nothing runs on a device, so what
is timed is what the host adds to every round of a batch (its sync excluded): each row's stop ids,
max_tokens, detokenizing, stop strings, statistics.

    PYTHONPATH=src python benchmarks/host_settle.py [--batch 32] [--rounds 200] [--stop "\n\n\n\n"]

Prints µs per row per round (median of --repeats runs).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import replace
from types import SimpleNamespace

import torch

from specgen.core.batch_decode import BatchDecoder, _Launched, _Row
from specgen.core.models.detok import IncrementalDetokenizer, TextTracker


def staged_rounds(ids: list[int], k: int, rounds: int, rng: random.Random) -> list[list[int]]:
    """Rows of the round's stage (out | drafts | n) that emit `ids` in order, accepted + 1 a round."""
    out, at = [], 0
    for _ in range(rounds):
        accepted = sum(1 for _ in range(k) if rng.random() < 0.6)
        emitted = ids[at: at + accepted + 1]
        at += len(emitted)
        n = k
        drafted = emitted[:accepted] + [0] * (n - accepted)
        out.append(emitted + [-1] * (k + 1 - len(emitted)) + drafted + [n])
    return out


def decoder(tokenizer, batch: int, k: int) -> BatchDecoder:
    """A BatchDecoder whose round is only what settling reads: k, stop(b) and the error check."""
    rnd = SimpleNamespace(k=k, batch=batch, stop=lambda b: None, backend=SimpleNamespace(check=lambda first: None))
    dec = object.__new__(BatchDecoder)
    dec.round, dec.tokenizer, dec.eos_ids, dec.adaptive_k = rnd, tokenizer, set(), False
    dec.rows, dec.events, dec.depth = [None] * batch, [None], 1
    dec.host = [torch.zeros(batch, 2 * k + 2, dtype=torch.long)]
    return dec


def measure(tokenizer, texts: list[str], batch: int, rounds: int, k: int, stop: tuple[str, ...],
            sampling) -> float:
    """Seconds per row and round of _settle_round over `rounds` rounds of `batch` rows."""
    rng = random.Random(0)
    dec = decoder(tokenizer, batch, k)
    spec = replace(sampling, max_tokens=10**6, min_tokens=0, stop=stop, stop_token_ids=(), ignore_eos=True)
    stages = []
    for b in range(batch):
        ids = tokenizer.encode(texts[b % len(texts)], add_special_tokens=False)
        prompt, rest = ids[:16], ids[16:]
        dec.rows[b] = _Row(b, spec, None, TextTracker(IncrementalDetokenizer(tokenizer, prompt), stop), 0.0, frozenset())
        stages.append(staged_rounds(rest * 8, k, rounds, rng))
    tensors = [torch.tensor([stages[b][r] for b in range(batch)]) for r in range(rounds)]
    launched = _Launched(list(dec.rows), 0)
    done: dict = {}
    dec.fetched = time.perf_counter()
    elapsed = 0.0
    for r in range(rounds):
        dec.host[0].copy_(tensors[r])
        began = time.perf_counter()
        dec._settle_round(launched, done)
        elapsed += time.perf_counter() - began
    assert not done, "a row ended: the staged rows ran out of text"
    return elapsed / (rounds * batch)


def main() -> None:
    from specgen.core.profile import load_profile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stop", action="append", default=[], help="a stop string every row carries")
    args = parser.parse_args()
    profile = load_profile()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(profile.target.path)
    with open(profile.target.path + "/../prompts.jsonl", encoding="utf-8") as file:
        texts = [json.loads(line)["prompt"] for line in file][:64]
    times = [measure(tokenizer, texts, args.batch, args.rounds, args.k, tuple(args.stop), profile.sampling)
             for _ in range(args.repeats)]
    print(json.dumps({"batch": args.batch, "rounds": args.rounds, "k": args.k, "stop": args.stop,
                      "us_per_row_round": round(1e6 * statistics.median(times), 2),
                      "all_us": [round(1e6 * t, 2) for t in times]}))


if __name__ == "__main__":
    main()
