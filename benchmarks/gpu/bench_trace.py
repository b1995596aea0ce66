"""`specgen bench` with a trace of what runs once: which run (method, prompt, warm-up or timed)
each cycle collection, CUDA-graph capture, cache re-allocation, round construction and Triton
compile fell in, and how long it took.

    PYTHONPATH=TREE/src python3 benchmarks/gpu/bench_trace.py TRACE.txt bench -p pair.toml ...

The bench's own output goes to stdout as usual; the trace to TRACE.txt (and TRACE.txt.json). It
hooks the tree on PYTHONPATH from outside (module attributes, a gc callback, Triton's JIT hooks),
after the engine is loaded, so the start-up keeps its own order of imports and collections; the
cycle collector's callback is in from the first line. Written for the 0.29 s in an 8B bench's first
timed lookup run (docs/benchmarks.md; benchmarks/gpu/first_lookup.sh runs it before and after).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

TRACE, ARGS = sys.argv[1], sys.argv[2:]
events: list[dict] = []  # {"at": label, "what", "detail", "ms"}
runs: list[dict] = []
state = {"at": "start-up", "rounds": None}


def note(what: str, detail: str, ms: float) -> None:
    events.append({"at": state["at"], "what": what, "detail": detail, "ms": round(ms, 3)})


# -- the cycle collector, from the first line on ---------------------------------------------------

_gc_start = [0.0]


def _collected(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_start[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _gc_start[0]) * 1e3
    if ms >= 1.0:  # the young generation's collections take microseconds: only the walks that cost
        note("gc", f"generation {info['generation']}", ms)


gc.callbacks.append(_collected)


# -- the rest, hooked once the engine is loaded ----------------------------------------------------

def _timed(owner, name: str, what: str, detail=lambda *a, **k: "", when=lambda before, after: True) -> None:
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        before = _size(args)
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            if when(before, _size(args)):
                note(what, detail(*args, **kwargs), (time.perf_counter() - start) * 1e3)

    setattr(owner, name, wrapper)


def _size(args) -> int:
    rounds = getattr(args[0], "_rounds", None) if args else None
    return len(rounds) if isinstance(rounds, dict) else 0


def _install() -> None:
    from specgen.core.bench import run as bench_run
    from specgen.core.decode import Decoder
    from specgen.core.engine import Engine

    # a round built (and, on CUDA, captured): Engine._round on a key it has not seen
    _timed(Engine, "_round", "round built", lambda self, shape, *a: f"drafter {shape.drafter} k={shape.k}",
           when=lambda before, after: after > before)
    try:
        from specgen.gpu import backend, runner
        from specgen.core.drafters.heads import EagleDrafter

        for module in (backend, runner):  # every CUDA graph of the run goes through capture()
            _timed(module, "capture", "capture", lambda fn, *a, **k: getattr(fn, "__qualname__", ""))
        _timed(runner.GraphRunner, "_allocate", "re-allocation", lambda self, capacity: f"{self.name} {capacity}")
        _timed(EagleDrafter, "_allocate", "re-allocation", lambda self, capacity: f"eagle head {capacity}")
    except ImportError:  # a CPU run: no CUDA backend
        pass
    _hook_triton()

    real_settle = Decoder.settle

    def settle(self, launched):  # each round's host time outside its device phases
        event = real_settle(self, launched)
        if state["rounds"] is not None:
            state["rounds"].append(1e3 * event.timings.get("other", 0.0))
        return event

    Decoder.settle = settle
    real_ours = bench_run.Bench._ours

    def ours(self, profile, position):
        phase = "timed" if "i" in _measure_locals() else "warm-up"
        label = f"{phase} {profile.proposer.kind} k={profile.speculation.k} prompt {position}"
        state["at"], state["rounds"], first = label, [], len(events)
        try:
            sample = real_ours(self, profile, position)
        finally:
            rounds, state["at"], state["rounds"] = state["rounds"], "between runs", None
        worst = max(range(len(rounds)), key=rounds.__getitem__) if rounds else None
        runs.append({"run": label, "seconds": round(sample.seconds, 4),
                     "first_token_seconds": round(sample.first_token_seconds or 0.0, 4), "rounds": len(rounds),
                     "other_ms_max": round(rounds[worst], 3) if rounds else None, "at_round": worst,
                     "events": events[first:]})
        return sample

    bench_run.Bench._ours = ours


def _measure_locals() -> dict:
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name != "_measure":
        frame = frame.f_back
    return frame.f_locals if frame is not None else {}


def _hook_triton() -> None:
    try:
        import triton
    except ImportError:
        return
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    started: dict = {}

    def before(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        started[id(key)] = time.perf_counter()
        return False  # compile as usual

    def after(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        start = started.pop(id(key), None)
        note("triton compile", getattr(fn, "name", str(fn)), (time.perf_counter() - start) * 1e3 if start else 0.0)

    if knobs is not None and hasattr(knobs, "jit_post_compile_hook"):
        knobs.jit_cache_hook, knobs.jit_post_compile_hook = before, after
    else:  # older Triton: a cache hook only (called before each compile)
        from triton.runtime.jit import JITFunction

        JITFunction.cache_hook = lambda **kw: (note("triton compile", str(kw.get("repr", ""))[:80], 0.0), False)[1]


def _wrap_loading() -> None:
    """Hook the rest right after the engine is loaded (cli/bench.py imports load_engine at call time)."""
    from specgen.cli import loading

    real = loading.load_engine

    def load_engine(*args, **kwargs):
        engine = real(*args, **kwargs)
        if not getattr(load_engine, "done", False):
            load_engine.done = True
            state["at"] = "after start-up"
            _install()
        return engine

    loading.load_engine = load_engine


# -- the report ------------------------------------------------------------------------------------

def _summary(items: list[dict]) -> str:
    groups: dict = {}
    for e in items:
        key = e["what"] + (f" ({e['detail']})" if e["what"] == "gc" else "")
        count, ms = groups.get(key, (0, 0.0))
        groups[key] = (count + 1, ms + e["ms"])
    return ", ".join(f"{key} x{count} {ms:.0f} ms" for key, (count, ms) in groups.items()) or "-"


def _report() -> None:
    lines = [f"bench {' '.join(ARGS)}", "", "runs (seconds, time to first token, rounds, the round with the most host "
             "time outside its device phases, what happened inside):"]
    for r in runs:
        lines.append(f"  {r['run']:<34} {r['seconds']:.4f} s  ttft {r['first_token_seconds']:.4f}  "
                     f"{r['rounds']:>3} rounds  other max {r['other_ms_max']} ms @ {r['at_round']}  "
                     f"{_summary(r['events'])}")
    lines += ["", "outside the runs:"]
    for at in dict.fromkeys(e["at"] for e in events):
        if not at.startswith(("timed", "warm-up")):
            lines.append(f"  {at:<16} {_summary([e for e in events if e['at'] == at])}")
    timed = [r for r in runs if r["run"].startswith("timed") and r["events"]]
    lines += ["", f"timed runs with a one-time cost inside: {len(timed)}"]
    lines += [f"  {r['run']}: " + "; ".join(f"{e['what']} {e['detail']} {e['ms']:.1f} ms" for e in r["events"])
              for r in timed]
    text = "\n".join(lines) + "\n"
    with open(TRACE, "w") as out:
        out.write(text)
    with open(TRACE + ".json", "w") as out:
        json.dump({"runs": runs, "events": events}, out, indent=1)


_wrap_loading()
sys.argv = ["specgen", *ARGS]
real_exit = os._exit


def _exit(code: int) -> None:  # cli/main.py ends with os._exit: the report first
    try:
        _report()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        real_exit(code)


os._exit = _exit
from specgen.cli.main import main  # noqa: E402 (after the hooks: it imports only light modules)

main()
