"""core/bench/run.py's warm-up: after it, the timed runs of a multi-proposer bench pay for nothing
that happens once. No cache grows, no round is built (and so none is captured) and Python's cycle
collector owes no walk of the heap when the first timed run starts.

The backend here is the torch backend with two spies: its runners re-allocate by the CUDA
runner's rule (gpu/runner.py GraphRunner.reserve: room for the request plus SLACK, a new
generation each time, which a captured round re-captures for), from an empty cache and in steps
of 64 positions rather than 512, so that the tiny pair's short prompts cross one; and it notes
every round program it builds."""

from __future__ import annotations

import gc
import json
from dataclasses import replace

import pytest
import torch

from decode_helpers import make_profile
from tiny_models import build_head, build_pair, tiny_head_config

from specgen.core.backend import TorchBackend
from specgen.core.bench.bench_plan import Plan
from specgen.core.bench.run import Bench
from specgen.core.drafters.head_formats import save_speculators
from specgen.core.engine import Engine
from specgen.core.runner import EagerRunner
from specgen.core.settings import ProposerSpec

SLACK, STEP = 64, 64  # gpu/runner.py's SLACK; its step is 512


class GrowingRunner(EagerRunner):
    """An eager runner whose reserve() re-allocates as the CUDA runner's does, into `log`."""

    def __init__(self, log: list, name: str, model, width: int, tap=None):
        super().__init__(model, width, 0, tap)  # empty: the first reserve() allocates
        self.log, self.name = log, name

    def reserve(self, positions: int) -> None:
        if positions + SLACK > self.capacity:
            self.capacity = -(-(positions + SLACK) // STEP) * STEP
            self.generation += 1
            self.log.append(("re-allocated", self.name))


class SpyBackend(TorchBackend):
    def __init__(self, device, log: list):
        super().__init__(device)
        self.log = log

    def runner(self, model, width, capacity, name, shapes=(), tap=None):
        return GrowingRunner(self.log, name, model, width, tap)

    def program(self, rnd, mode):
        self.log.append(("round built", rnd.shape.drafter, mode.value))
        return super().program(rnd, mode)


@pytest.fixture(scope="module")
def pair_and_head(tmp_path_factory):
    root = tmp_path_factory.mktemp("warmup")
    target, draft = build_pair(root, noisy=0.1)
    config = json.loads((target / "config.json").read_text())
    head = build_head(tiny_head_config(hidden_size=config["hidden_size"], target_hidden_size=config["hidden_size"],
                                       target_vocab_size=config["vocab_size"], draft_vocab_size=config["vocab_size"],
                                       aux_layer_ids=(0, 1, 1), max_position_embeddings=2048))
    head.identity_vocab()
    save_speculators(head, root / "head", "tiny-target")
    return target, draft, root / "head"


PROPOSERS = ("draft", "eagle", "ngram")


def _bench(pair_and_head, prompts: list[str], log: list, phase: list) -> Bench:
    """A bench of three proposers and target-only; `phase` turns "timed" with the last warm-up."""
    target, draft, head = pair_and_head
    profile = make_profile(target, draft, k=2, max_tokens=6, proposer=ProposerSpec(kind="draft", head=str(head)))
    engine = Engine(profile, proposers=PROPOSERS, backend=SpyBackend(torch.device("cpu"), log))

    def settings_for(k, temperature, proposer=None, tree=None):
        return replace(profile, proposer=replace(profile.proposer, kind=proposer or profile.proposer.kind),
                       speculation=replace(profile.speculation, k=k),
                       sampling=replace(profile.sampling, temperature=temperature))

    plan = Plan(proposers=PROPOSERS, ks=(2,), temperatures=(0.0,), baselines=("target-only",), warmup=1)
    warmups = [0]

    def progress(steps: int, label: str) -> None:
        if label.endswith("(warm-up)"):
            warmups[0] += 1
            if warmups[0] == 1 + len(PROPOSERS):  # target-only and each proposer, one warm-up each
                phase[0] = "timed"
                log.append(("timed runs begin",))

    return Bench(engine, prompts, settings_for, plan, progress=progress)


def _timed(log: list) -> list:
    return log[log.index(("timed runs begin",)) + 1:]


def test_a_longer_later_prompt_grows_no_cache_inside_a_timed_run(pair_and_head):
    """The warm-ups run the first prompt; the second is longer by more than a re-allocation step,
    so without room taken for it first, its first timed run (target-only's) re-allocates the
    target's cache, and every proposer's captured round would re-capture at its next launch."""
    log, phase = [], ["warm-up"]
    bench = _bench(pair_and_head, ["def f(x):", "def add(a, b):\n    return a + b\n" * 8], log, phase)
    short, long = map(len, bench.prompt_ids)
    assert long - short > STEP, "the second prompt must need another step of room"
    document = bench.run()
    assert not document["incomplete"] and len(document["prompts"]) == 2
    assert ("re-allocated", "target") in log and ("re-allocated", "draft") in log
    built = {entry[1:] for entry in log if entry[0] == "round built"}  # target-only, draft, eagle, ngram
    assert built == {("none", "model"), ("draft", "model"), ("eagle", "model"), ("none", "host")}
    assert _timed(log) == [], f"inside the timed runs: {_timed(log)}"  # no re-allocation, no round built


def test_the_timed_runs_start_with_the_collectors_walk_done(pair_and_head):
    """A full collection between the last warm-up and the first timed run: the start-up's deferred
    walks (cli/loading.py collector_paused) and the warm-ups' are done before the clock runs. The
    collector's own schedule is paused here, so the only collections are the ones asked for."""
    log, phase = [], ["warm-up"]
    bench = _bench(pair_and_head, ["def f(x):", "def add(a, b):"], log, phase)
    real = bench._ours

    def ours(profile, position):
        log.append(("run", phase[0]))
        return real(profile, position)

    def collected(stage: str, info: dict) -> None:
        if stage == "stop":
            log.append(("collection", info["generation"]))

    bench._ours = ours
    enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(collected)
    try:
        bench.run()
    finally:
        gc.callbacks.remove(collected)
        if enabled:
            gc.enable()
    first_timed = log.index(("run", "timed"))
    last_warmup = max(i for i, entry in enumerate(log) if entry == ("run", "warm-up"))
    assert ("collection", 2) in log[last_warmup:first_timed]
