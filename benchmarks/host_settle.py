"""The batch loop's host work per round, on the CPU, without a model.

BatchDecoder.run is driven over a stub round and program: the program's launch writes each live
row's staged ids (out, k + 1 padded with -1 | drafts, k | n) as a draft with per-draft acceptance
--accept would emit them, from real text (the demo pair's prompts, tokenized by the tokenizer the
CLI loads for it); start, stop, draw and follow do nothing. Prompts end on max_tokens (drawn from
--max-tokens LO,HI, about one refill a round at B = 32) or on a stop string (--stop), so settling,
refills and launches run as they do on a device, and only the host's code is timed (the stub's own
time is taken out): each round's settling (its sync's read of the staged ids, every live row's
stop ids, detokenizing, stop strings, statistics, the rows that end), each refill (seed, generator,
detokenizer, statistics) and each launch's host part.

    PYTHONPATH=src python benchmarks/host_settle.py [--batch 32] [--k 2] [--prompts 2000] [--profile]

Prints one JSON line: µs per round (settle, launch, all) and per refill, in CPU time (each the
least of --repeats runs: the CPU may be shared; the clock's reads add ~1 µs a call), and a digest
of every result (ids, text, reason, fates, counts), which must not change when only the host's
code does.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import random
import time
from dataclasses import replace
from types import SimpleNamespace

import torch

from specgen.core.batch_decode import BatchDecoder

# the thread's CPU time, not the wall's: on a shared CPU the time another process takes is not counted
clock = time.thread_time


class StubRound:
    """What BatchDecoder reads of a BatchRound; each launch (by StubProgram) stages every live
    row's next tokens from its text, capped where the device caps them (max_tokens)."""

    def __init__(self, k: int, batch: int, texts: list[list[int]], accept: float, seed: int = 0):
        self.k, self.batch, self.device, self.host_drafts = k, batch, torch.device("cpu"), False
        self.stage_ids = torch.full((batch, 2 * k + 2), -1, dtype=torch.long)
        self.backend = SimpleNamespace(check=lambda first: None)
        self.texts, self.accept, self.rng = texts, accept, random.Random(seed)
        self.rows: list[list | None] = [None] * batch  # [text, tokens made, max_tokens]
        self.taken, self.spent = 0, 0.0

    def start(self, b, ids, spec, seed, cut=True) -> None:
        began = clock()
        self.rows[b] = [self.texts[self.taken % len(self.texts)], 0, spec.max_tokens]
        self.taken += 1
        self.spent += clock() - began

    def stop(self, b) -> None:
        self.rows[b] = None

    def draw(self, b, generator) -> None:
        pass

    def follow(self, b, committed) -> None:
        pass

    def set_budgets(self, budgets) -> None:
        pass

    def launch(self) -> None:
        began = clock()
        k, rng, stage = self.k, self.rng, []
        for row in self.rows:
            if row is None:
                stage.append([-1] * (2 * k + 1) + [0])
                continue
            text, made, most = row
            budget = max(0, min(k, most - made - 1))
            accepted = 0
            while accepted < budget and rng.random() < self.accept:
                accepted += 1
            out = [text[(made + i) % len(text)] for i in range(accepted + 1)]
            drafts = out[:accepted] + [text[(made + accepted + 1) % len(text)]] * (k - accepted)
            stage.append(out + [-1] * (k - accepted) + drafts + [budget])
            row[1] = made + accepted + 1
        self.stage_ids.copy_(torch.tensor(stage))
        self.spent += clock() - began


class StubProgram:
    asynchronous = True  # two rounds in flight, as a captured round runs

    def __init__(self, rnd: StubRound):
        self.launch = rnd.launch


class Timed:
    """Wraps a decoder's method: its seconds and calls, less the stub's time inside it."""

    def __init__(self, rnd: StubRound, method):
        self.rnd, self.method, self.seconds, self.calls = rnd, method, 0.0, 0

    def __call__(self, *args):
        spent, began = self.rnd.spent, clock()
        result = self.method(*args)
        self.seconds += clock() - began - (self.rnd.spent - spent)
        self.calls += 1
        return result


def digest(results) -> str:
    """Every result's ids, text, reason, fates and counts (no times), hashed."""
    h = hashlib.sha256()
    for index, done in results:
        counts = {key: value for key, value in done.stats.as_dict().items()
                  if "second" not in key and key not in ("tokens_per_second", "decode_tokens_per_second")}
        h.update(json.dumps([index, done.token_ids, done.text, done.reason, [str(f) for f in done.fates], counts],
                            sort_keys=True).encode())
    return h.hexdigest()[:16]


def measure(tokenizer, prompts, texts, args, sampling) -> dict:
    rng = random.Random(1)
    lo, hi = map(int, args.max_tokens.split(","))
    jobs = []
    for i in range(args.prompts):
        sampled = rng.random() < args.sampled
        spec = replace(sampling, max_tokens=rng.randint(lo, hi), min_tokens=0, stop=tuple(args.stop),
                       stop_token_ids=(), ignore_eos=False, temperature=0.8 if sampled else 0.0,
                       seed=1000 + i if sampled or args.seeded else None)
        jobs.append((prompts[i % len(prompts)], spec))
    rnd = StubRound(args.k, args.batch, texts, args.accept)
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()  # the texts hold none
    dec = BatchDecoder(rnd, StubProgram(rnd), tokenizer, eos, lambda spec: True, pipeline="on")
    settle, refill, launch = (Timed(rnd, getattr(dec, name)) for name in ("_settle_round", "_refill", "_launch"))
    dec._settle_round, dec._refill, dec._launch = settle, refill, launch
    began, spent = clock(), rnd.spent
    results = list(dec.run(jobs))
    wall = clock() - began - (rnd.spent - spent)
    rounds = settle.calls
    return {"settle_us_round": 1e6 * settle.seconds / rounds, "launch_us_round": 1e6 * launch.seconds / rounds,
            "refill_us": 1e6 * refill.seconds / refill.calls, "refills_per_round": refill.calls / rounds,
            "host_us_round": 1e6 * wall / rounds, "rounds": rounds, "digest": digest(results)}


def main() -> None:
    from specgen.core.models.loading import load_tokenizer
    from specgen.core.profile import load_profile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--max-tokens", default="40,120", help="LO,HI: each prompt's max_tokens, drawn uniformly")
    parser.add_argument("--accept", type=float, default=0.7, help="each draft's chance to be accepted")
    parser.add_argument("--sampled", type=float, default=0.0, help="the share of prompts sampled (seeded)")
    parser.add_argument("--seeded", action="store_true", help="greedy prompts carry a seed too")
    parser.add_argument("--stop", action="append", default=[], help="a stop string every prompt carries")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions of one run")
    args = parser.parse_args()
    profile = load_profile()
    tokenizer = load_tokenizer(profile.target)
    with open(profile.target.path + "/../prompts.jsonl", encoding="utf-8") as file:
        lines = [json.loads(line)["prompt"] for line in file]
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in lines]
    prompts = [ids[:32] for ids in encoded]
    texts = [ids[32:] for ids in encoded if len(ids) > 64]
    torch.set_num_threads(1)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        measure(tokenizer, prompts, texts, args, profile.sampling)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    runs = [measure(tokenizer, prompts, texts, args, profile.sampling) for _ in range(args.repeats)]
    assert len({run["digest"] for run in runs}) == 1
    out = {"batch": args.batch, "k": args.k, "stop": args.stop, "sampled": args.sampled,
           "rounds": runs[0]["rounds"], "refills_per_round": round(runs[0]["refills_per_round"], 2)}
    for key in ("settle_us_round", "launch_us_round", "refill_us", "host_us_round"):
        out[key] = round(min(run[key] for run in runs), 1)  # the least disturbed run (a shared CPU)
    out["digest"] = runs[0]["digest"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
