"""llama.cpp's binaries over a specgen pair's prompts, for benchmarks/peers/llama_cpp.sh.

    python benchmarks/peers/llama_cpp.py tokens BIN PAIR [--num-prompts N]
    python benchmarks/peers/llama_cpp.py run BIN PAIR --k 2,4,6 -t 0,0.8 [-n 128] [--num-prompts 10] [--gpu] --out out.json
    python benchmarks/peers/llama_cpp.py compare PAIR out.json specgen-greedy.jsonl [-n 128]
    python benchmarks/peers/llama_cpp.py table out.json specgen-bench.json

BIN holds llama.cpp's built programs (llama-tokenize, llama-simple, llama-speculative-simple,
llama-bench); PAIR is a folder of benchmarks/make_pair.py with target.gguf and draft.gguf beside
target/ and draft/ (benchmarks/peers/convert_pair.py writes them). `tokens` checks that llama.cpp
tokenizes every prompt exactly as specgen does (exit 1 otherwise). `run` times llama.cpp's
target-only greedy decoding (llama-bench's warm tg at the prompts' length, and llama-simple once a
prompt, for its text) and its speculative decoding (llama-speculative-simple, greedy and sampled,
each draft length, draft lengths in turn with temperatures inside) on the same prompts with the same number of new tokens, and writes one JSON
document (rewritten after each configuration): per configuration the median decode rate (after the
first token), the median rate with the prompt's prefill (specgen bench's `tok/s`), the acceptance; per prompt the rates and the texts. `compare` says, per
prompt, where llama.cpp's greedy texts first differ from specgen's (`specgen generate --format
jsonl`), in specgen's tokens. `table` prints one Markdown table of both engines' target-only step and
speculative round (`run`'s JSON and `specgen bench --format json`'s), for pairs whose acceptance
means nothing (random weights): what a step and a round cost, against specgen's floor.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) s(?:econds)?, speed:\s+([\d.]+) t/s")
ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
EVAL = re.compile(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs")
COUNTS = re.compile(r"n_(drafted|accept)\s+=\s+(\d+)")
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # tokenizing needs no device, and starts faster without


def prompts(pair: Path, count: int | None) -> list[str]:
    lines = [json.loads(line)["prompt"] for line in (pair / "prompts.jsonl").read_text().splitlines() if line.strip()]
    return lines[:count] if count else lines


def specgen_tokenizer(pair: Path):
    from specgen.core.models.loading import load_tokenizer
    from specgen.core.settings import ModelSpec

    return load_tokenizer(ModelSpec(path=str(pair / "target"), device="cpu"))


def llama_ids(binary: Path, model: Path, text: str) -> list[int]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        out = subprocess.run([str(binary), "-m", str(model), "-f", file.name, "--ids", "--no-escape", "--log-disable"],
                             capture_output=True, text=True, check=True, env=NO_GPU).stdout
    return json.loads(out.strip().splitlines()[-1])


def tokens(args) -> int:
    texts = prompts(args.pair, args.num_prompts)
    tokenizer = specgen_tokenizer(args.pair)
    wants = [tokenizer(text)["input_ids"] for text in texts]
    with ThreadPoolExecutor(8) as pool:
        gots = list(pool.map(lambda text: llama_ids(args.bin / "llama-tokenize", args.pair / "target.gguf", text), texts))
    mismatched = 0
    for i, (got, want) in enumerate(zip(gots, wants)):
        if got != want:
            mismatched += 1
            first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            print(f"prompt {i}: llama.cpp {len(got)} ids, specgen {len(want)}; first difference at {first}")
    lengths = sorted(len(w) for w in wants)
    print(f"{len(texts) - mismatched} of {len(texts)} prompts tokenized identically "
          f"(prompt tokens {lengths[0]}-{lengths[-1]}, median {statistics.median(lengths):g})")
    return 1 if mismatched else 0


ATTEMPTS = 5


def _run(command: list[str]) -> tuple[str, str, re.Match]:
    """(stdout, stderr, the rate line). llama.cpp's examples log through a worker thread that the
    process may end before it writes the last lines (its common/log.cpp says so): a run whose
    output stops short is run again, at most ATTEMPTS times."""
    for _ in range(ATTEMPTS):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:3])} ... exited {done.returncode}: {done.stderr.strip()[-400:]}")
        match = DECODED.search(done.stderr)
        if match:
            return done.stdout, done.stderr, match
    raise RuntimeError(f"{' '.join(command[:3])} ... printed no rate in {ATTEMPTS} runs")


def target_only(args, text: str) -> dict:
    """llama-simple: greedy, one process a prompt, no warm-up run. Its `decoded` rate counts the
    prompt's prefill and every token after it (specgen bench's `tok/s`); its context's `eval time`
    the 1-token steps after the first token (the decode rate)."""
    command = [str(args.bin / "llama-simple"), "-m", str(args.pair / "target.gguf"), "-n", str(args.max_tokens)]
    out, err, match = _run(command + (["-ngl", "99"] if args.gpu else []) + [text])
    evals = EVAL.search(err)
    return {"tokens": int(match.group(1)), "tok_s_with_prefill": float(match.group(3)),
            "decode_tok_s": int(evals.group(2)) / float(evals.group(1)) * 1000 if evals else None, "text": out}


def target_bench(args, depth: int) -> dict:
    """llama-bench: warm (one untimed run), `-r` timed runs of -n tokens after `depth` tokens of
    context, one token a step: llama.cpp's own figure of its decode rate."""
    command = [str(args.bin / "llama-bench"), "-m", str(args.pair / "target.gguf"), "-p", "0",
               "-n", str(args.max_tokens), "-d", str(depth), "-r", str(args.repetitions), "-o", "json"]
    if args.gpu:
        command += ["-ngl", "99", "-fa", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench exited {done.returncode}: {done.stderr.strip()[-400:]}")
    row = json.loads(done.stdout)[0]
    return {"depth": depth, "tok_s": row["avg_ts"], "stddev_tok_s": row["stddev_ts"], "samples_ts": row.get("samples_ts"),
            "build": row.get("build_commit"), "backends": row.get("backends"), "gpu": row.get("gpu_info"),
            "flash_attn": row.get("flash_attn"), "n_gpu_layers": row.get("n_gpu_layers")}


def speculative(args, text: str, k: int, temperature: float) -> dict:
    """llama-speculative-simple: its `decoded` rate is the decode after the prompt's prefill;
    `tok_s_with_prefill` adds the prefill (target and draft) back, as specgen bench's `tok/s` counts it.
    The prompt goes verbatim: by default llama.cpp's common options turn backslash escapes in it
    into the characters they name, and its -f drops a file's last newline."""
    command = [str(args.bin / "llama-speculative-simple"), "-m", str(args.pair / "target.gguf"),
               "-md", str(args.pair / "draft.gguf"), "-p", text, "--no-escape", "-n", str(args.max_tokens),
               "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
               "--temp", str(temperature), "--top-p", str(args.top_p if temperature > 0 else 1.0),
               "--seed", "0", "-c", "2048"]
    if args.gpu:
        command += ["-ngl", "99", "-ngld", "99", "-fa", "on"]
    if args.ignore_eos:
        command.append("--ignore-eos")
    out, err, match = _run(command)
    counts = dict((name, int(value)) for name, value in COUNTS.findall(err))
    tokens_, rate = int(match.group(1)), float(match.group(3))
    encoded = ENCODED.search(err)
    prefill_s = int(encoded.group(1)) / float(encoded.group(3)) if encoded and float(encoded.group(3)) > 0 else None
    decode_s = tokens_ / rate
    return {"tokens": tokens_, "seconds": decode_s, "decode_tok_s": rate, "prefill_s": prefill_s,
            "tok_s_with_prefill": tokens_ / (decode_s + prefill_s) if prefill_s is not None else None,
            "drafted": counts.get("drafted"), "accepted": counts.get("accept"), "text": out}


def summarize(runs: list[dict]) -> dict:
    drafted = sum(r.get("drafted") or 0 for r in runs)
    accepted = sum(r.get("accepted") or 0 for r in runs)
    decode = [r["decode_tok_s"] for r in runs if r.get("decode_tok_s")]
    with_prefill = [r["tok_s_with_prefill"] for r in runs if r.get("tok_s_with_prefill")]
    return {"median_decode_tok_s": statistics.median(decode) if decode else None,
            "median_tok_s_with_prefill": statistics.median(with_prefill) if with_prefill else None,
            "acceptance": accepted / drafted if drafted else None, "prompts": len(runs), **rounds(runs)}


def rounds(runs: list[dict]) -> dict:
    """Speculative runs' rounds, pooled over prompts (none for target-only runs). Each round of
    llama-speculative-simple adds its accepted drafts and one target token to the tokens it counts,
    so a run's rounds are its tokens less its accepted drafts; a round's cost is the decode seconds
    over them, and its last rounds draft fewer tokens (no more than -n leaves room for)."""
    spec = [r for r in runs if r.get("drafted") is not None and r.get("accepted") is not None]
    count = sum(r["tokens"] - r["accepted"] for r in spec)
    if not count:
        return {}
    return {"rounds": count, "round_ms": sum(r["seconds"] for r in spec) / count * 1000,
            "drafted_per_round": sum(r["drafted"] for r in spec) / count}


def round_fit(summary: dict, temperature: float) -> dict | None:
    """Least squares of the round's ms over its drafted tokens, across the draft lengths swept at
    one temperature: ms a drafted token (the slope) and ms a round besides (the intercept, the
    verification and sampling). None with fewer than two draft lengths."""
    points = [(s["drafted_per_round"], s["round_ms"]) for s in summary.values()
              if s.get("round_ms") is not None and s.get("temperature") == temperature]
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points))
    return {"ms_per_drafted_token": slope, "ms_per_round_besides": mean_y - slope * mean_x, "draft_lengths": len(points)}


def run(args) -> int:
    start = time.monotonic()
    texts = prompts(args.pair, args.num_prompts)
    depth = args.depth if args.depth is not None else round(statistics.median(
        len(ids) for ids in (specgen_tokenizer(args.pair)(text)["input_ids"] for text in texts)))
    document = {"summary": {}, "runs": {}, "llama_bench": None}

    def write() -> None:
        args.out.write_text(json.dumps(document, indent=1) + "\n")

    try:
        document["llama_bench"] = target_bench(args, depth)
    except (RuntimeError, ValueError, IndexError, KeyError) as exc:  # llama-bench is extra: go on without it
        document["llama_bench"] = {"error": str(exc)}
    write()
    configs = [] if args.no_simple else [("target-only", None, None)]
    configs += [(f"speculative k={k} t={t}", k, t) for k in args.k for t in args.temperature]
    for name, k, t in configs:
        if args.deadline is not None and time.monotonic() - start > args.deadline:
            document["skipped"] = document.get("skipped", []) + [name]
            write()
            continue
        try:
            runs = [target_only(args, text) if k is None else speculative(args, text, k, t) for text in texts]
        except RuntimeError as exc:  # one configuration's failure is recorded, the others still run
            document["errors"] = document.get("errors", []) + [f"{name}: {exc}"]
            write()
            continue
        document["runs"][name] = runs
        document["summary"][name] = {**summarize(runs), "k": k, "temperature": t}
        write()
        print(name, json.dumps(document["summary"][name]), file=sys.stderr, flush=True)
    return 0


def generated(llama_out: str, prompt: str) -> str | None:
    """The text after the prompt in a llama.cpp example's standard output (None: prompt not found)."""
    at = llama_out.find(prompt)
    return None if at < 0 else llama_out[at + len(prompt):]


def compare(args) -> int:
    document = json.loads(args.llama.read_text())
    ours = [json.loads(line) for line in args.specgen.read_text().splitlines() if line.strip()]
    tokenizer = specgen_tokenizer(args.pair)
    for name, runs in document["runs"].items():
        if not (name == "target-only" or name.endswith("t=0.0")):
            continue
        same, notes = 0, []
        for i, (run_, mine) in enumerate(zip(runs, ours)):
            theirs = generated(run_["text"], mine["prompt"])
            want = mine["text"]
            if theirs is not None and theirs.startswith(want):
                same += 1
                continue
            theirs = theirs or ""
            if run_["tokens"] < args.max_tokens and want.startswith(theirs.rstrip("\n")):
                same += 1
                notes.append(f"prompt {i}: llama.cpp ends after {run_['tokens']} tokens at the end-of-text token, "
                             "identical up to there (specgen ignores it)")
                continue
            char = next((j for j, (a, b) in enumerate(zip(theirs, want)) if a != b), min(len(theirs), len(want)))
            ids = mine["token_ids"]
            token = next((j for j in range(len(ids) + 1) if len(tokenizer.decode(ids[:j + 1])) > char), len(ids))
            notes.append(f"prompt {i} from token {token}")
        print(f"{name}: greedy text identical to specgen's on {same} of {len(ours)} prompts"
              + (f" ({'; '.join(notes)})" if notes else ""))
    return 0


def _cells(engine: str, what: str, tok_s: float | None, ms: float | None, floor_ms: float | None, notes: str) -> str:
    over = f"{ms / floor_ms:.2f}×" if ms and floor_ms else "–"
    numbers = [f"{tok_s:,.1f}" if tok_s else "–", f"{ms:.3f}" if ms else "–", f"{floor_ms:.3f}" if floor_ms else "–", over]
    return "| " + " | ".join([engine, what, *numbers, notes]) + " |"


def table_rows(llama: dict, bench: dict) -> list[str]:
    """Markdown rows: each engine's greedy target-only step and speculative rounds, with the floor
    of the weight bytes each streams: specgen bench's streamed bytes over its copy bandwidth, the
    target's for a step; specgen's own round floor; for a llama.cpp round the target's once and
    the draft model's once a drafted token."""
    environment = bench["environment"]
    streamed, bandwidth = environment.get("streamed_bytes") or {}, environment.get("copy_bandwidth_bytes_per_s")

    def floor(drafted: float) -> float | None:
        if not bandwidth or "target" not in streamed or (drafted and "draft" not in streamed):
            return None
        return (streamed["target"] + drafted * streamed.get("draft", 0)) / bandwidth * 1000

    rows = ["| engine | step or round | decode tok/s | ms | floor ms | × floor | notes |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    measured = llama.get("llama_bench") or {}
    if measured.get("tok_s"):
        rows.append(_cells("llama.cpp", f"target-only step (llama-bench, depth {measured['depth']})", measured["tok_s"],
                           1000 / measured["tok_s"], floor(0), f"± {measured['stddev_tok_s']:.1f} tok/s over its runs"))
    for baseline in bench["baselines"]:
        rate = (baseline.get("decode_tokens_per_second") or {}).get("median")
        if baseline["method"] == "target-only" and baseline["temperature"] == 0 and rate:
            rows.append(_cells("specgen", "target-only step", rate, 1000 / rate, floor(0),
                               f"{baseline['tokens_per_second']['median']:,.1f} tok/s with the prefill"))
    for summary in sorted(llama.get("summary", {}).values(), key=lambda summary: summary.get("k") or 0):
        if summary.get("round_ms") is None or summary.get("temperature") != 0:
            continue
        notes = f"{summary['drafted_per_round']:.2f} drafted a round, acceptance {summary['acceptance']:.3f}"
        rows.append(_cells("llama.cpp", f"k = {summary['k']} greedy round (llama-speculative-simple)",
                           summary["median_decode_tok_s"], summary["round_ms"], floor(summary["drafted_per_round"]), notes))
    for result in bench["results"]:
        if result["temperature"] != 0:
            continue
        phases = result["round_ms"]
        rows.append(_cells("specgen", f"k = {result['k']} greedy round, {result['proposer']}",
                           result["decode_tokens_per_second"]["median"], phases["total"], result.get("round_floor_ms"),
                           f"draft {phases['draft']:.3f} / verify {phases['verify']:.3f} ms, "
                           f"acceptance {result['acceptance_rate']:.3f}"))
    return rows


def table(args) -> int:
    llama = json.loads(args.llama.read_text())
    rows = table_rows(llama, json.loads(args.specgen.read_text()))
    print("\n".join(rows))
    fit = round_fit(llama.get("summary", {}), 0.0)
    if fit:
        print(f"llama.cpp's greedy rounds over {fit['draft_lengths']} draft lengths: {fit['ms_per_drafted_token']:.3f} ms "
              f"a drafted token, {fit['ms_per_round_besides']:.3f} ms a round besides (least squares)")
    for key in ("skipped", "errors"):
        if llama.get(key):
            print(f"llama.cpp {key}: {'; '.join(llama[key])}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["tokens", "run", "compare", "table"])
    parser.add_argument("bin", type=Path, help="BIN (tokens, run), PAIR (compare) or llama.cpp's JSON (table)")
    parser.add_argument("pair", type=Path, help="PAIR (tokens, run), llama.cpp's JSON (compare) or specgen bench's JSON (table)")
    parser.add_argument("specgen", type=Path, nargs="?", help="compare: specgen generate's JSONL")
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--k", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 6, 8])
    parser.add_argument("-t", "--temperature", type=lambda s: [float(x) for x in s.split(",")], default=[0.0])
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--depth", type=int, help="llama-bench's context before the timed tokens (default: the median prompt length)")
    parser.add_argument("--repetitions", type=int, default=5, help="llama-bench's timed runs")
    parser.add_argument("--deadline", type=float, help="run: seconds after which no new configuration starts (the rest are listed as skipped)")
    parser.add_argument("--out", type=Path, help="run: the JSON document")
    parser.add_argument("--gpu", action="store_true", help="every layer on the GPU, flash attention on")
    parser.add_argument("--no-simple", action="store_true",
                        help="run: no llama-simple target-only runs (llama-bench's rate alone)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="run: llama-speculative-simple goes on past end-of-text tokens, as specgen bench does")
    args = parser.parse_args()
    if args.what == "table":
        args.llama, args.specgen = args.bin, args.pair
        return table(args)
    if args.what == "compare":
        args.pair, args.llama = args.bin, args.pair
        return compare(args)
    if args.what == "run" and args.out is None:
        parser.error("run needs --out")
    return tokens(args) if args.what == "tokens" else run(args)


if __name__ == "__main__":
    sys.exit(main())
