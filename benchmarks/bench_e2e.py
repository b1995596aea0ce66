"""End-to-end tokens/s on one GPU, batch 1, every contender in ONE process on the same prompts.

    python benchmarks/bench_e2e.py --pair .pairs/bench --prompts 20 --max-new 128 --compile --out e2e.json
    python benchmarks/bench_e2e.py --random --prompts 4   # bench-shaped random weights (smoke test)

Contenders, greedy and temperature 0.8 / top-p 0.95: specgen speculative and specgen target-only
(both on the CUDA fast path), Hugging Face `generate` with its dynamic cache and with a static
cache, and Hugging Face assisted generation with the same draft. Every contender is warmed up on
one extra prompt first; tokens/s is new tokens over wall time, prefill included. The Hugging Face
contenders run on the first --hf-prompts prompts (they are 30-100x slower), and every ratio is
taken on those same prompts. Before timing, greedy speculative output is checked against greedy
target-only output (float32: must be identical; bfloat16: fraction identical, first divergences).

--startup-only measures one Engine start (load + capture [+ compile]) and prints it as JSON; the
main run calls it in subprocesses: without compile, with compile on an empty inductor cache, and
again on the cache the previous start left.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from specgen.core.engine import Engine, target_only
from specgen.core.settings import ModelSpec, Profile, SamplingSpec, SpeculationSpec

MODES = {"greedy": dict(temperature=0.0), "t0.8/p0.95": dict(temperature=0.8, top_p=0.95)}


DEVICE = "cuda"  # --device cpu runs the same script as a smoke test of its own logic


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_profile(pair: Path, k: int, max_new: int, compile: bool, dtype: str = "bfloat16", **sampling) -> Profile:
    models = [ModelSpec(str(pair / name), dtype=dtype, device=DEVICE) for name in ("target", "draft")]
    return Profile("bench", "<bench>", *models, speculation=SpeculationSpec(k=k, compile=compile),
                   sampling=SamplingSpec(max_tokens=max_new, ignore_eos=True, seed=0, **sampling))


def load_prompts(pair: Path, engine: Engine, count: int, length: int) -> list[list[int]]:
    path = pair / "prompts.jsonl"
    if path.exists():
        texts = [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
        prompts = [engine.encode(t)[:length] for t in texts]
    else:  # random weights: random prompts
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, engine.pair.vocab_size, (length,), generator=g).tolist() for _ in range(count + 1)]
    if len(prompts) < count + 1:
        raise SystemExit(f"{path} has {len(prompts)} prompts; {count + 1} needed (one is the warm-up)")
    return prompts[: count + 1]


def timed(fn, prompts):
    """Per-prompt (output ids, seconds), after one untimed warm-up on prompts[0]."""
    fn(prompts[0])
    results = []
    for prompt in prompts[1:]:
        sync()
        start = time.perf_counter()
        ids = fn(prompt)
        sync()
        results.append((ids, time.perf_counter() - start))
    return results


def specgen_runner(engine: Engine, profile: Profile, keep: list):
    def run(prompt):
        *_, finished = engine.decoder(profile).run(prompt)
        keep.append(finished.stats)
        return finished.token_ids
    return run


def hf_runner(model, max_new: int, sampling: dict, **kwargs):
    def run(prompt):
        ids = torch.tensor([prompt], device=DEVICE)
        options = dict(do_sample=True, temperature=sampling["temperature"], top_p=sampling.get("top_p", 1.0)) \
            if sampling.get("temperature") else dict(do_sample=False)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, min_new_tokens=max_new,
                             pad_token_id=0, **options, **kwargs)
        return out[0, ids.shape[1]:].tolist()
    return run


def summary(results, stats=None) -> dict:
    tokens = sum(len(ids) for ids, _ in results)
    seconds = sum(s for _, s in results)
    row = {"prompts": len(results), "tokens": tokens, "seconds": round(seconds, 3), "tok_s": tokens / seconds}
    if stats:
        rounds = sum(s.rounds for s in stats)
        drafted, accepted, emitted = (sum(getattr(s, f) for s in stats) for f in ("drafted", "accepted", "emitted"))
        row.update(acceptance=accepted / drafted if drafted else 0.0, mean_accepted_length=emitted / rounds,
                   rounds=rounds,
                   round_ms={p: 1e3 * sum(s.seconds[p] for s in stats) / rounds for p in ("draft", "verify", "sample", "other")})
    return row


def divergence(a: list[list[int]], b: list[list[int]]) -> dict:
    firsts = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), None) for p, q in zip(a, b)]
    return {"identical": sum(f is None for f in firsts) / len(firsts), "first_divergence": [f for f in firsts if f is not None]}


def equality_check(pair: Path, prompts, args, dtype: str) -> dict:
    """Greedy speculative vs greedy target-only, same fast path, `dtype` weights."""
    engine = Engine(make_profile(pair, args.k, args.max_new, compile=False, dtype=dtype))
    spec = [list(engine.decoder().run(p))[-1].token_ids for p in prompts]
    base = [list(engine.decoder(target_only(engine.profile)).run(p))[-1].token_ids for p in prompts]
    del engine
    return divergence(spec, base)


def startup(args) -> dict:
    start = time.perf_counter()
    engine = Engine(make_profile(args.pair, args.k, args.max_new, compile=args.compile))
    sync()
    total = time.perf_counter() - start
    capture = engine.target_runner.setup_seconds + (engine.draft_runner.setup_seconds if engine.draft_runner else 0)
    return {"compile": args.compile, "seconds": round(total, 2), "capture_seconds": round(capture, 2)}


def startups(args) -> list[dict]:
    """Fresh processes: no compile; compile on an empty cache; compile on the cache just filled.
    This process then uses that cache too."""
    cache = str(args.inductor_cache or tempfile.mkdtemp(prefix="specgen-inductor-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    env = dict(os.environ)
    rows = []
    for compile, label in ((False, "graphs"), (True, "compile+graphs, cold cache"), (True, "compile+graphs, warm cache")):
        command = [sys.executable, __file__, "--startup-only", "--device", DEVICE, "--pair", str(args.pair), "--k", str(args.k),
                   "--max-new", str(args.max_new)] + (["--compile"] if compile else [])
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
        rows.append({"start": label, **json.loads(out.strip().splitlines()[-1])})
        print(f"start-up {label}: {rows[-1]['seconds']:.1f} s", flush=True)
    return rows


def contenders(engine: Engine, draft, prompts, args, mode: str, sampling: dict) -> dict:
    rows = {}
    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, **sampling))
    for name, prof in (("specgen speculative", profile), ("specgen target-only", target_only(profile))):
        stats: list = []
        results = timed(specgen_runner(engine, prof, stats), prompts)
        rows[name] = summary(results, stats[1:])
        rows[name]["outputs"] = [ids for ids, _ in results]
        rows[name]["hf_subset_tok_s"] = summary(results[: args.hf_prompts])["tok_s"]
        print(f"[{mode}] {name}: {rows[name]['tok_s']:.0f} tok/s", flush=True)
    variants = [(f"specgen speculative k={k}", replace(profile, speculation=replace(profile.speculation, k=k)), True)
                for k in args.extra_k]
    if args.argmax_drafts and sampling.get("temperature", 0) > 0:  # drafts = the draft's argmax, q one-hot
        for k in [args.k] + args.extra_k:
            variants.append((f"specgen speculative k={k}, argmax drafts",
                             replace(profile, speculation=replace(profile.speculation, k=k, draft_sampling="argmax")), True))
    if args.temperature_drafts and sampling.get("temperature", 0) > 0 and (
            sampling.get("top_p", 1.0) < 1.0 or sampling.get("top_k", -1) > 0):  # q without the cut
        for k in [args.k] + args.extra_k:
            variants.append((f"specgen speculative k={k}, temperature drafts", replace(
                profile, speculation=replace(profile.speculation, k=k, draft_sampling="temperature")), True))
    if args.sample_drafts and sampling.get("temperature", 0) > 0:  # q with the request's cut
        for k in [args.k] + args.extra_k:
            variants.append((f"specgen speculative k={k}, sampled drafts with the cut", replace(
                profile, speculation=replace(profile.speculation, k=k, draft_sampling="sample")), True))
    if args.phased:  # the same round launched phase by phase (gpu/loop.py without gpu/fused.py)
        variants.append(("specgen speculative, per-phase rounds", profile, False))
    from specgen.gpu import loop

    for name, prof, fused in variants:
        stats = []
        loop.FUSED = fused
        try:
            results = timed(specgen_runner(engine, prof, stats), prompts)
        finally:
            loop.FUSED = True
        rows[name] = summary(results, stats[1:])
        rows[name]["hf_subset_tok_s"] = summary(results[: args.hf_prompts])["tok_s"]
        print(f"[{mode}] {name}: {rows[name]['tok_s']:.0f} tok/s", flush=True)
    target = engine.pair.target
    hf = {"HF generate (dynamic cache)": {}, "HF generate (static cache)": dict(cache_implementation="static", disable_compile=True),
          "HF assisted (same draft)": dict(assistant_model=draft)}
    for name, kwargs in (hf.items() if args.hf else ()):
        results = timed(hf_runner(target, args.max_new, sampling, **kwargs), prompts[: args.hf_prompts + 1])
        rows[name] = summary(results)
        print(f"[{mode}] {name}: {rows[name]['tok_s']:.1f} tok/s", flush=True)
    return rows


def ratios(rows: dict) -> dict:
    spec = rows["specgen speculative"]
    out = {"speculative / target-only": spec["tok_s"] / rows["specgen target-only"]["tok_s"]}
    for name in rows:
        if name.startswith("specgen speculative") and name != "specgen speculative":
            out[f"{name} / target-only"] = rows[name]["tok_s"] / rows["specgen target-only"]["tok_s"]
        if name.startswith("HF"):
            out[f"speculative / {name}"] = spec["hf_subset_tok_s"] / rows[name]["tok_s"]
    return out


def table(report: dict) -> str:
    lines = ["| mode | contender | tok/s | acceptance | mean accepted length | round ms: draft / verify / sample / other |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for mode, rows in report["modes"].items():
        for name, row in rows["rows"].items():
            extra = ("", "", "")
            if "acceptance" in row:
                split = " / ".join(f"{row['round_ms'][p]:.3f}" for p in ("draft", "verify", "sample", "other"))
                extra = (f"{row['acceptance']:.3f}", f"{row['mean_accepted_length']:.2f}", split)
            lines.append(f"| {mode} | {name} ({row['prompts']} prompts) | {row['tok_s']:.1f} | " + " | ".join(extra) + " |")
    lines.append("")
    for mode, rows in report["modes"].items():
        lines.append(f"{mode}: " + ", ".join(f"{k} {v:.2f}x" for k, v in rows["ratios"].items()))
    return "\n".join(lines)


def random_pair(folder: Path) -> Path:
    """make_pair.py's bench shapes with random weights and a small byte-level tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sys.path.insert(0, str(Path(__file__).parent))
    from make_pair import EOS, PRESETS, build_model, save_tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [p.read_text(errors="ignore") for p in sorted(Path(json.__file__).parent.parent.glob("*.py"))[:200]]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=16384, special_tokens=[EOS],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    preset = PRESETS["bench"]
    for seed, (name, arch) in enumerate((("target", preset.target), ("draft", preset.draft))):
        build_model(arch, preset, tok.token_to_id(EOS), seed).to(torch.bfloat16).save_pretrained(folder / name)
        save_tokenizer(tok, folder / name, preset.seq_len)
    return folder


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", type=Path, help="folder made by make_pair.py (target/, draft/, prompts.jsonl)")
    parser.add_argument("--random", action="store_true", help="bench-shaped random weights instead of --pair")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--hf-prompts", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--extra-k", type=lambda v: [int(x) for x in v.split(",") if x], default=[],
                        help="more speculative rows with these k (comma-separated)")
    parser.add_argument("--phased", action="store_true", help="also run speculative rounds phase by phase (no fused graph)")
    parser.add_argument("--hf", type=int, default=1, help="0 skips the Hugging Face contenders")
    parser.add_argument("--t1", action="store_true", help="also a temperature 1.0 mode (no top-p)")
    parser.add_argument("--argmax-drafts", action="store_true",
                        help="sampled modes: also draft with the draft's argmax (speculation.draft_sampling = argmax)")
    parser.add_argument("--temperature-drafts", action="store_true",
                        help="modes with top-p / top-k: also draft without them (speculation.draft_sampling = temperature)")
    parser.add_argument("--sample-drafts", action="store_true",
                        help="sampled modes: also draft from q with the request's cut (speculation.draft_sampling = sample)")
    parser.add_argument("--attention", choices=("kernel", "sdpa"), default="kernel",
                        help="captured steps attend through gpu/attention.py's kernel or through SDPA")
    parser.add_argument("--linear", choices=("kernel", "torch"), default="kernel",
                        help="linear layers of steps through gpu/linear.py's kernel or F.linear (cuBLAS)")
    parser.add_argument("--no-startups", action="store_true", help="skip the start-up subprocesses")
    parser.add_argument("--startup-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--inductor-cache", type=Path, help="empty folder for the start-up runs' compile cache")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    global DEVICE
    args = parse_args(argv)
    DEVICE = args.device
    os.environ["SPECGEN_ATTENTION"] = args.attention  # start-up subprocesses too
    os.environ["SPECGEN_LINEAR"] = args.linear
    from specgen.gpu import runner

    runner.DECODE_ATTENTION = args.attention == "kernel"
    runner.LINEAR_KERNEL = args.linear == "kernel"
    if args.startup_only:
        print(json.dumps(startup(args)))
        return
    if args.random:
        args.pair = random_pair(Path(tempfile.mkdtemp(prefix="specgen-random-pair-")))
    report = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()}}
    report["startups"] = [] if args.no_startups else startups(args)
    start = time.perf_counter()
    engine = Engine(make_profile(args.pair, args.k, args.max_new, compile=args.compile))
    report["startup_seconds_this_process"] = round(time.perf_counter() - start, 2)
    report["attention_kernel"] = {name: getattr(getattr(engine, f"{name}_runner", None), "attention", False)
                                  for name in ("target", "draft")}
    report["linear_kernel"] = {name: getattr(getattr(engine, f"{name}_runner", None), "linear", False)
                               for name in ("target", "draft")}
    print(f"attention kernel in use: {report['attention_kernel']}; linear kernel: {report['linear_kernel']}", flush=True)
    prompts = load_prompts(args.pair, engine, args.prompts, args.prompt_tokens)
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(args.pair / "draft", dtype=torch.bfloat16).to(DEVICE).eval()
    report["modes"] = {}
    modes = dict(MODES, **({"t1.0": dict(temperature=1.0)} if args.t1 else {}))
    for mode, sampling in modes.items():
        rows = contenders(engine, draft, prompts, args, mode, sampling)
        report["modes"][mode] = {"rows": rows, "ratios": ratios(rows)}
    greedy = report["modes"]["greedy"]["rows"]
    report["bf16_greedy_speculative_vs_target_only"] = divergence(greedy["specgen speculative"].pop("outputs"),
                                                                  greedy["specgen target-only"].pop("outputs"))
    for rows in report["modes"].values():
        for row in rows["rows"].values():
            row.pop("outputs", None)
    del engine
    report["fp32_greedy_speculative_vs_target_only"] = equality_check(args.pair, prompts[1:], args, "float32")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("startups", "bf16_greedy_speculative_vs_target_only",
                                             "fp32_greedy_speculative_vs_target_only")}, indent=1))
    print(table(report))


if __name__ == "__main__":
    main()
