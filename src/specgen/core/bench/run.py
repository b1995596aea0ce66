"""`specgen bench`: speculative decoding against baselines, in one process, on the same prompts.

For each temperature, every baseline and every (proposer, k) of the sweep generate for every
prompt: `warmup` untimed runs of the first prompt per method (so no method is timed cold: its first
run pays for lazy set-up, caches and allocator growth), then, prompt by prompt, `repeat` timed runs
of each method in turn; the median-time run stands for the prompt. Before the warm-ups every cache
takes room for the longest prompt, and after them Python's cycle collector walks the heap once, so
that no timed run pays for a cache re-allocated (and the rounds over it re-captured) or a
collection owed to the start-up (see _measure). Speed is core/stats.py's
generation rate (tokens over the whole generation, prefill included), beside its decode rate
(tokens after the first round over the seconds after it): the two rates `specgen generate`
reports, by the same functions. Ratios are taken per prompt and summarised as medians; the
recommended (proposer and) k is the one with the best median ratio, the statistic the table
shows. Sampled runs are seeded per prompt (profile seed, or 0, plus the prompt's index) so every
method and repeat draws alike.

Baselines: `target-only` is the target alone through specgen's own loop (k = 0); `hf` is Hugging
Face `generate` on the same target; `hf-static` is the same with a static KV cache (and without
Hugging Face's automatic compile); `hf-assisted` is `generate(assistant_model=draft)` with Hugging
Face's own assisted-generation defaults. The document returned by `Bench.run` is the
`--format json` output; docs/bench-schema.md describes every field. No terminal code here.

A prompt that does not fit the context at the sweep's largest k is skipped before anything is
timed, and reported. Ctrl-C ends the measuring early: `run` then summarises the prompts that every
method of the interrupted temperature finished, and marks the document incomplete.
"""

from __future__ import annotations

import functools
import gc
import math
import platform
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable

import torch

from specgen.core import measured
from specgen.core.bench import floors
from specgen.core.bench.bench_plan import BASELINES, HF_BASELINES, Plan  # noqa: F401 - BASELINES is part of this API
from specgen.core.engine import Engine, target_only, tree_shape
from specgen.core.errors import UsageError
from specgen.core.insight import RunRecord
from specgen.core.models.loading import load_model
from specgen.core.settings import Profile, SamplingSpec
from specgen.core import stats as rates  # the rates `generate` reports, one definition each
from specgen.core.stats import PHASES, AcceptanceStats
from specgen.core.step.model import OwnedModel

SCHEMA = "specgen.bench/1"


@dataclass
class Sample:
    """One prompt under one method: the run of median time among the repeats. specgen's runs are
    timed by the loop's own clock (AcceptanceStats), as `generate` reports them; Hugging Face's
    from the call to its return, the first tokens by a streamer."""

    token_ids: list[int]
    seconds: float  # the whole generation, prefill included
    first_token_seconds: float | None
    first_round_tokens: int = 1  # tokens that arrived with the first (what the decode rate leaves out)
    stats: AcceptanceStats | None = None  # speculative runs only
    record: RunRecord | None = None

    @property
    def tokens_per_second(self) -> float:
        return rates.generation_rate(len(self.token_ids), self.seconds)

    @property
    def decode_tokens_per_second(self) -> float | None:
        return rates.decode_rate(len(self.token_ids), self.first_round_tokens, self.first_token_seconds, self.seconds)


class Unavailable(Exception):
    """A baseline that cannot run with these settings; the reason goes into the report."""


Progress = Callable[[int, str], None]  # (steps done since the last call, what runs now)
# (k, temperature, proposer, tree shape (width, nodes)): None for the profile's own
SettingsFor = Callable[..., Profile]
Warn = Callable[[str], None]


@dataclass
class Sweep:
    """The methods of one temperature and what they measured so far (partial after Ctrl-C)."""

    temperature: float
    coupling: str | None  # None: greedy
    methods: dict  # method (baseline name, or (proposer, k)) -> run_one(prompt position) -> Sample
    unavailable: dict[str, str]
    samples: dict
    peaks: dict
    profiles: dict = field(default_factory=dict)  # method -> Profile, for those that run specgen's own loop

    @property
    def finished(self) -> int:
        """Prompts that every method has finished."""
        return min((len(s) for s in self.samples.values()), default=0)


class Bench:
    def __init__(self, engine: Engine, prompts: list[str], settings_for: SettingsFor,
                 plan: Plan, progress: Progress | None = None, warn: Warn | None = None,
                 startup_seconds: float | None = None, encode: Callable[[str], list[int]] | None = None):
        """encode(text) -> prompt ids (default: engine.encode; the CLI's adds --chat and --truncate-prompt).
        The engine must have loaded what every proposer of the plan needs."""
        self.engine = engine
        self.encode = encode or engine.encode
        self.settings_for = settings_for
        self.plan = plan
        self.progress = progress or (lambda steps, label: None)
        self.device = engine.pair.device
        self.startup_seconds = startup_seconds
        self.bandwidth: float | None = None  # copy bandwidth, measured when the run starts (CUDA)
        self.streamed: dict = {}  # bytes a step streams, target and drafters (_streamed), at run start
        self.skipped: list[dict] = []
        self.indices, self.prompts, self.prompt_ids = self._admit(prompts, warn or (lambda message: None))

    def _admit(self, prompts: list[str], warn: Warn) -> tuple[list[int], list[str], list[list[int]]]:
        """The prompts that fit the context at the largest k (their positions in `prompts`, texts and
        ids); the others are reported through `warn` and kept in `self.skipped`."""
        checker = self.engine.decoder(self.settings_for(max(self.plan.ks), self.plan.temperatures[0],
                                                        self.plan.proposers[0]))
        indices, texts, ids = [], [], []
        for i, text in enumerate(prompts):
            encoded = self.encode(text)
            try:
                checker.check_prompt(encoded)
            except UsageError as exc:
                self.skipped.append({"index": i, "tokens": len(encoded), "reason": exc.message})
                warn(f"skipping prompt {i + 1} of {len(prompts)}: {exc.message}")
                continue
            indices.append(i)
            texts.append(text)
            ids.append(encoded)
        if not ids:
            raise UsageError(f"no prompt fits: {self.skipped[0]['reason']}",
                             hint="use shorter prompts, lower --max-tokens or --k, or pass --truncate-prompt "
                                  "(keeps each prompt's end)")
        return indices, texts, ids

    @property
    def total_steps(self) -> int:
        ours = sum(len(self.plan.shapes(k)) for k in self.plan.ks)
        methods = len(self.plan.baselines) + len(self.plan.proposers) * ours
        return len(self.plan.sweeps()) * methods * (self.plan.warmup + len(self.prompts) * self.plan.repeat)

    def run(self) -> dict:
        """The whole sweep as the `--format json` document; `incomplete` is true after Ctrl-C."""
        baselines, results, incomplete = [], [], False
        self.bandwidth = floors.copy_bandwidth(self.device)  # before any timing: it empties torch's cache
        self.streamed = self._streamed()
        for temperature, coupling in self.plan.sweeps():
            sweep = self._sweep(temperature, coupling)
            try:
                self._measure(sweep)
            except KeyboardInterrupt:
                incomplete = True
            if sweep.finished:
                more_baselines, more_results = self._summarise(sweep)
                baselines += more_baselines
                results += more_results
            if incomplete:
                break
        return {
            "schema": SCHEMA,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "incomplete": incomplete,
            "environment": self._environment(),
            "startup_seconds": self.startup_seconds,
            "profile": self._profile_info(),
            "settings": self._settings(),
            "prompts": [{"index": i, "text": p, "tokens": len(ids)}
                        for i, p, ids in zip(self.indices, self.prompts, self.prompt_ids)],
            "skipped_prompts": self.skipped,
            "baselines": baselines,
            "results": results,
            "recommendation": recommend(results, self.plan.baselines),
            "recommendation_per_proposer": recommend(results, self.plan.baselines, per_proposer=True),
            "notes": notes(baselines),
            "fp32_check": None,
        }

    # -- measuring -------------------------------------------------------------------------

    def _settings_for(self, k: int, temperature: float, coupling: str | None, proposer: str,
                      tree: tuple | None = None) -> Profile:
        profile = self.settings_for(k, temperature, proposer, tree)
        if coupling is None:
            return profile
        return replace(profile, sampling=replace(profile.sampling, coupling=coupling))

    def _sweep(self, temperature: float, coupling: str | None) -> Sweep:
        profile = self._settings_for(self.plan.ks[0], temperature, coupling, self.plan.proposers[0])
        methods, unavailable, profiles = {}, {}, {}
        first = coupling is None or coupling == self.plan.couplings[0]
        for name in self.plan.baselines:
            try:
                if not first and name != "target-only":  # coupling changes specgen's tokens only
                    raise Unavailable(f"measured once per temperature, with {self.plan.couplings[0]} coupling")
                methods[name] = self._baseline_runner(name, profile)
                if name == "target-only":
                    profiles[name] = target_only(profile)
            except Unavailable as exc:
                unavailable[name] = str(exc)
                self.progress(self.plan.warmup + len(self.prompts) * self.plan.repeat, f"T={temperature:g} {name}")
        for proposer in self.plan.proposers:
            for k in self.plan.ks:
                for tree in self.plan.shapes(k):
                    profiles[proposer, k, tree] = self._settings_for(k, temperature, coupling, proposer, tree)
                    methods[proposer, k, tree] = functools.partial(self._ours, profiles[proposer, k, tree])
        return Sweep(temperature, coupling, methods, unavailable, {method: [] for method in methods},
                     dict.fromkeys(methods), profiles)

    def _measure(self, sweep: Sweep) -> None:
        """Every method at one temperature, into `sweep`. Methods take turns prompt by prompt, so a
        machine that speeds up or slows down during the bench shifts all of them alike, not one of them."""
        def label(method) -> str:
            coupling = f" {sweep.coupling}" if sweep.coupling else ""
            if isinstance(method, str):
                return f"T={sweep.temperature:g}{coupling} {method}"
            proposer, k, tree = method
            named = f"{proposer} " if len(self.plan.proposers) > 1 else ""
            shaped = f" w={tree[0]} n={tree[1]}" if tree and tree[0] > 1 else ""
            return f"T={sweep.temperature:g}{coupling} {named}k={k}{shaped}"

        self._reserve(sweep)
        for method, run_one in sweep.methods.items():
            for _ in range(self.plan.warmup):
                run_one(0)
                self.progress(1, label(method) + " (warm-up)")
        # Python's cycle collector walks the start-up's millions of objects (and the warm-ups'
        # captures and kernels) when allocation counts say, not when it suits the clock: once here,
        # so that no timed run pays for the walk (docs/benchmarks.md: 0.29 s inside an 8B bench's
        # first timed lookup run)
        gc.collect()
        for i in range(len(self.prompts)):
            for method, run_one in sweep.methods.items():
                repeats = []
                for _ in range(self.plan.repeat):
                    self._reset_peak()
                    repeats.append(run_one(i))
                    sweep.peaks[method] = self._peak(sweep.peaks[method])
                    self.progress(1, label(method))
                repeats.sort(key=lambda s: s.seconds)
                sweep.samples[method].append(repeats[len(repeats) // 2])

    def _reserve(self, sweep: Sweep) -> None:
        """Room in every cache for the longest prompt, before any warm-up. A cache that grows
        inside a timed run re-allocates there (the CUDA backend re-captures its runner's steps),
        and each captured round over it re-captures at its next launch, on that run's clock; the
        warm-ups, on the first prompt, reserve for that prompt only."""
        longest = max(len(ids) for ids in self.prompt_ids)
        for profile in sweep.profiles.values():
            self.engine.decoder(profile).reserve(longest)

    def _summarise(self, sweep: Sweep) -> tuple[list[dict], list[dict]]:
        done = sweep.finished
        samples = {method: runs[:done] for method, runs in sweep.samples.items()}
        base = {name: samples[name] for name in self.plan.baselines if name in samples}
        baselines = [self._baseline_entry(name, sweep.temperature, samples.get(name), sweep.peaks.get(name),
                                          sweep.unavailable.get(name)) for name in self.plan.baselines]
        ours = [method for method in samples if not isinstance(method, str)]
        results = [self._result(*method, sweep.temperature, samples[method], sweep.peaks[method], base,
                                coupling=sweep.coupling) for method in ours]
        for entry in baselines + results:
            entry["coupling"] = sweep.coupling
        return baselines, results

    def _reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def _peak(self, before: int | None) -> int | None:
        if self.device.type != "cuda":
            return None
        return max(before or 0, torch.cuda.max_memory_allocated(self.device))

    def _seeded(self, profile: Profile, position: int) -> Profile:
        seed = (profile.sampling.seed or 0) + self.indices[position]
        return replace(profile, sampling=replace(profile.sampling, seed=seed))

    def _ours(self, profile: Profile, position: int) -> Sample:
        decoder = self.engine.decoder(self._seeded(profile, position))
        events = list(decoder.run(self.prompt_ids[position]))
        finished = events.pop()
        record = None
        if self.plan.records:
            record = RunRecord.build(self.prompts[position], finished, events, self.engine.tokenizer)
        stats = finished.stats
        return Sample(finished.token_ids, stats.generation_seconds, stats.first_token_seconds, stats.first_round_tokens,
                      stats, record)

    def _hf(self, profile: Profile, position: int, assistant, static: bool = False) -> Sample:
        config = hf_generation_config(profile.sampling, self.engine.eos_ids, static=static)
        ids = torch.tensor([self.prompt_ids[position]], dtype=torch.long, device=self.device)
        streamer = _FirstToken()
        torch.manual_seed(self._seeded(profile, position).sampling.seed)
        streamer.start = time.perf_counter()
        with torch.inference_mode():
            out = self._hf_model("target").generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                                    streamer=streamer, assistant_model=assistant)
        tokens = out[0, ids.shape[1]:].tolist()  # .tolist() waits for the device
        seconds = time.perf_counter() - streamer.start
        return Sample(tokens, seconds, streamer.first, streamer.first_tokens)

    def _baseline_entry(self, name: str, temperature: float, samples: list[Sample] | None, peak: int | None,
                        reason: str | None) -> dict:
        entry = {"method": name, "temperature": temperature, "available": samples is not None, "reason": reason,
                 "tokens_per_second": None, "decode_tokens_per_second": None, "time_to_first_token_seconds": None,
                 "peak_gpu_memory_bytes": peak, "rounds": None, "round_ms": None,
                 "per_prompt": []}
        if samples is not None:
            entry.update(_speed(samples), per_prompt=[_prompt_row(self.indices[i], s) for i, s in enumerate(samples)])
            entry.update(_own_rounds(samples))
        return entry

    def _baseline_runner(self, name: str, profile: Profile) -> Callable[[int], Sample]:
        if name == "target-only":
            base = target_only(profile)
            return lambda i: self._ours(base, i)
        hf_generation_config(profile.sampling, self.engine.eos_ids)  # raises Unavailable early
        if self.engine.backend.describe().get("placement"):
            raise Unavailable("a model is spread over several GPUs: Hugging Face generate would need a second "
                              "copy of it, in transformers' classes")
        if name in HF_BASELINES:
            return lambda i: self._hf(profile, i, None, static=name == "hf-static")
        if self.engine.pair.draft is None:
            raise Unavailable("needs a draft model (no proposer of the bench uses one)")
        return lambda i: self._hf(profile, i, self._hf_model("draft"))

    def _hf_model(self, role: str):
        """The pair's `role` model in transformers' classes, which Hugging Face generate needs, loaded
        at the first HF baseline and kept: specgen's methods run on its own model step (a second
        copy of the weights only while the bench runs HF baselines)."""
        models = self.__dict__.setdefault("_hf_models", {})
        if role not in models:
            pair = self.engine.pair
            own = pair.target if role == "target" else pair.draft
            if not isinstance(own, OwnedModel):
                models[role] = own
            else:
                spec = self.engine.profile.target if role == "target" else self.engine.profile.draft
                spec = replace(spec, device=str(own.device))
                models[role] = load_model(spec, False, self.engine.profile.runtime.download, "transformers")
        return models[role]

    def _result(self, proposer: str, k: int, tree: tuple | None, temperature: float, samples: list[Sample],
                peak: int | None, available: dict[str, list[Sample]], coupling: str | None = None) -> dict:
        stats = AcceptanceStats()
        for sample in samples:
            stats.merge(sample.stats)
        rows = [_prompt_row(self.indices[i], s) for i, s in enumerate(samples)]
        for i, row in enumerate(rows):
            row["acceptance_rate"] = samples[i].stats.acceptance_rate
            row["mean_accepted_length"] = samples[i].stats.mean_accepted_length
            row["speedup"] = {name: _ratio(samples[i], available[name][i]) if name in available else None
                              for name in self.plan.baselines}
        settings = self._settings_for(k, temperature, coupling, proposer, tree)
        result = {
            "proposer": proposer,
            # the EAGLE-3 head it drafted with (eagle; hybrid with eagle), which keys its measured rows
            "head": measured.drafting_head(settings.proposer, proposer),
            "k": k,
            # the shape that ran: tree_width / tree_nodes auto as the engine resolved them, and why
            **self.engine.tree_report(settings),
            "temperature": temperature,
            **_speed(samples),
            "speedup": {name: (summarise([r["speedup"][name] for r in rows]) if name in available else None)
                        for name in self.plan.baselines},
            "acceptance_rate": stats.acceptance_rate,
            "mean_accepted_length": stats.mean_accepted_length,
            "per_position_acceptance": stats.per_position,
            "round_ms": _round_ms(stats),
            **self._floor(proposer, k, stats),
            "peak_gpu_memory_bytes": peak,
            "greedy_agreement": greedy_agreement(samples, available) if temperature == 0 else None,
            # same seed, same prompt: under Gumbel coupling the text must be target-only's
            "sampled_agreement": greedy_agreement(samples, {n: b for n, b in available.items() if n == "target-only"})
            if temperature > 0 else None,
            "counts": {key: stats.as_dict()[key] for key in
                       ("rounds", "drafted", "accepted", "recovered", "bonus", "generated_tokens",
                        "early_stops", "mean_k")},
            "per_prompt": rows,
        }
        if self.plan.records:
            result["records"] = [s.record.as_dict() for s in samples]
        return result

    def _drafter_bytes(self, proposer: str) -> int | None:
        """Bytes one call of the proposer's drafter streams: 0 for prompt lookup, None where a
        round's drafting has no one cost (hybrid rounds mix lookup and model; MTP layers are not
        captured and borrow the target's output projection)."""
        drafter = self.engine.profile.proposer.drafter(proposer)
        if proposer == "ngram" or drafter == "none":
            return 0
        if proposer == "draft" and self.engine.pair.draft is not None:
            return floors.streamed_bytes(self.engine.pair.draft)
        head = self.engine.heads.get("eagle") if proposer == "eagle" else None
        if head is not None:
            return floors.streamed_bytes(head.head)  # its embedding is the target's, gathered
        return None

    def _floor(self, proposer: str, k: int, stats: AcceptanceStats) -> dict:
        """round_floor_ms and round_over_floor (docs/bench-schema.md; core/bench/floors.py)."""
        drafter = 0 if proposer == "ngram" else self.streamed[proposer]
        if self.bandwidth is None or drafter is None or not stats.rounds:
            return {"round_floor_ms": None, "round_over_floor": None}
        floor = floors.floor_ms(self.streamed["target"], drafter, k if drafter else 0, self.bandwidth)
        return {"round_floor_ms": floor, "round_over_floor": _round_ms(stats)["total"] / floor}

    # -- describing the run ----------------------------------------------------------------

    def _environment(self) -> dict:
        import transformers

        from specgen import __version__

        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else platform.processor()
        return {
            "specgen": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": str(self.device),
            "device_name": name or platform.machine(),
            "dtype": str(self.engine.pair.target.dtype).removeprefix("torch."),
            "cpu_threads": torch.get_num_threads(),
            "copy_bandwidth_bytes_per_s": self.bandwidth,
            "streamed_bytes": self.streamed,
            "resolved": self.engine.describe(),  # backend, graphs, kernels as resolved
        }

    def _streamed(self) -> dict:
        """Bytes a step of each model streams (core/bench/floors.py), by proposer drafter."""
        out = {"target": floors.streamed_bytes(self.engine.pair.target)}
        for proposer in self.plan.proposers:
            if proposer != "ngram":
                out[proposer] = self._drafter_bytes(proposer)
        return out

    def _profile_info(self) -> dict:
        profile = self.engine.profile
        own = self.settings_for(self.plan.ks[0], self.plan.temperatures[0], None).proposer.kind
        return {"name": profile.name, "target": profile.target.path,
                "draft": profile.draft.path if profile.draft is not None else None, "proposer": own}

    def _settings(self) -> dict:
        profile = self.settings_for(self.plan.ks[0], self.plan.temperatures[0], self.plan.proposers[0])
        sampling = profile.sampling
        return {
            "proposers": list(self.plan.proposers),
            "k": list(self.plan.ks),
            "temperatures": list(self.plan.temperatures),
            "couplings": list(self.plan.couplings),
            "baselines": list(self.plan.baselines),
            "max_tokens": sampling.max_tokens,
            "ignore_eos": sampling.ignore_eos,
            "seed": sampling.seed or 0,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "repeat": self.plan.repeat,
            "warmup": self.plan.warmup,
            "pipeline": profile.speculation.pipeline,
        }


def fp32_check(engine: Engine, prompts: list[str], settings_for: SettingsFor,
               ks: tuple[int, ...], progress: Progress | None = None,
               encode: Callable[[str], list[int]] | None = None,
               sweeps: tuple[tuple[float, str | None], ...] = ((0.0, None),),
               proposers: tuple[str | None, ...] = (None,), shapes: Callable[[int], tuple] = lambda k: (None,)) -> dict:
    """Speculative output against target-only output, per sweep (greedy; sampled with Gumbel
    coupling, seeded per prompt), proposer (None: the profile's), k and tree shape (shapes(k): the
    plan's that fit k; None: the profile's own), on `engine` (loaded in
    float32 by the caller, with what every proposer needs). Untimed. In float32 the two must be
    identical; the bench's own dtype (bf16) can differ because a (k+1)-token verification rounds
    differently from a 1-token step."""
    progress = progress or (lambda steps, label: None)
    ids = [(encode or engine.encode)(p) for p in prompts]

    def outputs(profile: Profile) -> list[list[int]]:
        out = []
        for i, prompt in enumerate(ids):
            seeded = replace(profile, sampling=replace(profile.sampling, seed=(profile.sampling.seed or 0) + i))
            *_, finished = engine.decoder(seeded).run(prompt)
            out.append(finished.token_ids)
            progress(1, "float32 check")
        return out

    results = []
    for temperature, coupling in sweeps:
        def at(k: int, proposer: str | None, tree: tuple | None = None) -> Profile:
            profile = settings_for(k, temperature, proposer, tree)
            return profile if coupling is None else replace(profile, sampling=replace(profile.sampling,
                                                                                       coupling=coupling))

        reference = outputs(target_only(at(ks[0], proposers[0])))
        for proposer in proposers:
            for k in ks:
                for tree in shapes(k):
                    profile = at(k, proposer, tree)
                    where = [first_divergence(a, b) for a, b in zip(outputs(profile), reference)]
                    results.append({"temperature": temperature, "coupling": coupling,
                                    "proposer": profile.proposer.kind, "k": k,
                                    **tree_shape(engine.resolve(profile)[0].speculation),
                                    "identical_fraction": sum(w is None for w in where) / len(where),
                                    "first_divergence": where})
    # the float32 engine is built apart from the timed one: a step that fell back there (kernels
    # that do not fit float32, say) is said here, not in the timed engine's `fallbacks`
    return {"dtype": str(engine.pair.target.dtype).removeprefix("torch."), "device": str(engine.pair.device),
            "fallbacks": list(engine.describe().get("fallbacks") or []), "results": results}


class _FirstToken:
    """A transformers streamer that only notes when the first generated token arrives."""

    def __init__(self):
        self.start = 0.0
        self.first: float | None = None
        self.first_tokens = 1
        self.calls = 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first = time.perf_counter() - self.start
            self.first_tokens = value.numel()  # assisted generation hands over a round's tokens at once

    def end(self) -> None:
        pass


def hf_generation_config(spec: SamplingSpec, eos_ids: set[int], static: bool = False):
    """The GenerationConfig that samples like `spec`, or Unavailable where transformers has no
    equivalent. `static`: a static KV cache, without the compile transformers would add to it on a
    GPU (specgen's own compile is a separate, measured choice)."""
    from transformers import GenerationConfig

    if spec.presence_penalty or spec.frequency_penalty:
        raise Unavailable("transformers generate has no presence or frequency penalty")
    if spec.stop:
        raise Unavailable("stop strings are not passed to transformers generate")
    stops = set(spec.stop_token_ids) | (set() if spec.ignore_eos else eos_ids)
    greedy = spec.greedy
    return GenerationConfig(
        max_new_tokens=spec.max_tokens,
        min_new_tokens=spec.min_tokens or None,
        do_sample=not greedy,
        temperature=None if greedy else spec.temperature,
        top_k=None if greedy else max(spec.top_k, 0),  # 0 = off (transformers' own default is 50)
        top_p=None if greedy else spec.top_p,
        min_p=None if greedy or spec.min_p == 0 else spec.min_p,
        repetition_penalty=spec.repetition_penalty,
        eos_token_id=sorted(stops) or None,
        pad_token_id=min(eos_ids) if eos_ids else 0,
        **({"cache_implementation": "static", "disable_compile": True} if static else {}),
    )


# -- summaries (pure functions of the samples) -----------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    at = (len(ordered) - 1) * q
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def summarise(values: list[float | None]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": percentile(values, 0.5), "p25": percentile(values, 0.25), "p75": percentile(values, 0.75),
            "min": min(values), "max": max(values)}


def _speed(samples: list[Sample]) -> dict:
    return {"tokens_per_second": summarise([s.tokens_per_second for s in samples]),
            "decode_tokens_per_second": summarise([s.decode_tokens_per_second for s in samples]),
            "time_to_first_token_seconds": summarise([s.first_token_seconds for s in samples])}


def _prompt_row(index: int, sample: Sample) -> dict:
    return {"prompt": index, "generated_tokens": len(sample.token_ids), "seconds": sample.seconds,
            "tokens_per_second": sample.tokens_per_second, "decode_tokens_per_second": sample.decode_tokens_per_second,
            "time_to_first_token_seconds": sample.first_token_seconds}


def _ratio(ours: Sample, base: Sample) -> float | None:
    return ours.tokens_per_second / base.tokens_per_second if base.tokens_per_second > 0 else None


def _round_ms(stats: AcceptanceStats) -> dict:
    per_round = {phase: 1000 * stats.seconds.get(phase, 0.0) / stats.rounds if stats.rounds else 0.0
                 for phase in PHASES}
    per_round["total"] = sum(per_round.values())
    return per_round


def _own_rounds(samples: list[Sample]) -> dict:
    """A baseline that ran through specgen's loop (target-only): its rounds and their phases in ms,
    which `tree_width` auto weighs a speculative round against (core/measured.py); None for others."""
    if not samples or any(s.stats is None for s in samples):
        return {"rounds": None, "round_ms": None}
    stats = AcceptanceStats()
    for sample in samples:
        stats.merge(sample.stats)
    return {"rounds": stats.rounds, "round_ms": _round_ms(stats)}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or the shorter length); None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def greedy_agreement(samples: list[Sample], baselines: dict[str, list[Sample]]) -> dict:
    out = {}
    for name, base in baselines.items():
        where = [first_divergence(s.token_ids, b.token_ids) for s, b in zip(samples, base)]
        out[name] = {"identical_fraction": sum(w is None for w in where) / len(where), "first_divergence": where}
    return out


def recommend(results: list[dict], baselines: tuple[str, ...] = ("target-only",),
              per_proposer: bool = False) -> list[dict]:
    """Per temperature and coupling (and proposer, with per_proposer), the proposer and k of the
    sweep with the best median per-prompt speedup against the first baseline that ran (the table's
    first × column), or with the best median tokens/s when none ran: one statistic for the choice
    and the figure shown beside it."""
    def group(r: dict) -> tuple:
        return (r["temperature"], r.get("coupling"), r.get("proposer") if per_proposer else None)

    out = []
    for key in dict.fromkeys(map(group, results)):
        temperature, coupling, _ = key
        rows = [r for r in results if group(r) == key]
        against = next((name for name in baselines if rows[0]["speedup"].get(name)), None)
        if against is None:
            best = max(rows, key=lambda r: r["tokens_per_second"]["median"])
        else:
            best = max(rows, key=lambda r: r["speedup"][against]["median"])
        speedup = (best["speedup"].get("target-only") or {}).get("median")
        out.append({"temperature": temperature, "coupling": coupling, "proposer": best.get("proposer"), "k": best["k"],
                    "tree_width": best.get("tree_width", 1), "tree_nodes": best.get("tree_nodes", best["k"]),
                    "shape": recommended_shape(best, speedup),
                    "by": f"speedup.{against}" if against else "tokens_per_second",
                    "tokens_per_second": best["tokens_per_second"]["median"],
                    "speedup": best["speedup"][against]["median"] if against else None,
                    "speedup_vs_target_only": speedup,
                    "faster_than_target_only": None if speedup is None else speedup > 1.0})
    return out


def recommended_shape(best: dict, speedup: float | None) -> str:
    """What a recommendation asks for: "none" (no speculation: target-only was faster than every
    row of the sweep), "chain" (tree width 1) or "tree"."""
    if speedup is not None and speedup <= 1.0:
        return "none"
    return "chain" if best.get("tree_width", 1) == 1 else "tree"


def notes(baselines: list[dict]) -> list[str]:
    """Plain statements the table alone could hide: where Hugging Face generate without a draft
    beats specgen's own target-only loop (median tokens/s), the speedups against target-only
    flatter specgen."""
    out = []
    for own in (b for b in baselines if b["method"] == "target-only" and b["available"]):
        mine = own["tokens_per_second"]["median"]
        for other in baselines:
            if (other["method"] in HF_BASELINES and other["available"] and other["temperature"] == own["temperature"]
                    and other.get("coupling") == own.get("coupling")
                    and other["tokens_per_second"]["median"] > mine):
                out.append(f"{other['method']} is faster than target-only at temperature {own['temperature']:g} "
                           f"({other['tokens_per_second']['median']:.1f} vs {mine:.1f} tok/s): speedups against "
                           f"target-only overstate the gain over plain Hugging Face generate here")
    return out
