"""llama.cpp's binaries over a specgen pair's prompts, for benchmarks/peers/llama_cpp.sh.

    python benchmarks/peers/llama_cpp.py tokens BIN PAIR [--num-prompts N]
    python benchmarks/peers/llama_cpp.py run BIN PAIR --k 2,4,6 -t 0,0.8 [-n 128] [--num-prompts 10] [--gpu] --out out.json
    python benchmarks/peers/llama_cpp.py compare PAIR out.json specgen-greedy.jsonl [-n 128]

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
jsonl`), in specgen's tokens.
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
            "acceptance": accepted / drafted if drafted else None, "prompts": len(runs)}


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
    configs = [("target-only", None, None)] + [(f"speculative k={k} t={t}", k, t) for k in args.k for t in args.temperature]
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
        document["summary"][name] = summarize(runs)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["tokens", "run", "compare"])
    parser.add_argument("bin", type=Path, help="BIN (tokens, run) or PAIR (compare)")
    parser.add_argument("pair", type=Path, help="PAIR (tokens, run) or llama.cpp's JSON (compare)")
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
    args = parser.parse_args()
    if args.what == "compare":
        args.pair, args.llama = args.bin, args.pair
        return compare(args)
    if args.what == "run" and args.out is None:
        parser.error("run needs --out")
    return tokens(args) if args.what == "tokens" else run(args)


if __name__ == "__main__":
    sys.exit(main())
