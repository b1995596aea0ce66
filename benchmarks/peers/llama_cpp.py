"""llama.cpp's binaries over a specgen pair's prompts, for benchmarks/peers/llama_cpp.sh.

    python benchmarks/peers/llama_cpp.py tokens BIN PAIR [--num-prompts N]
    python benchmarks/peers/llama_cpp.py run BIN PAIR --k 2,4,6 -t 0,0.8 [-n 128] [--num-prompts 10] [--gpu] > out.json

BIN holds llama.cpp's built programs (llama-tokenize, llama-simple, llama-speculative-simple);
PAIR is a folder of benchmarks/make_pair.py with target.gguf and draft.gguf beside target/ and
draft/ (benchmarks/peers/convert_pair.py writes them). `tokens` checks that llama.cpp tokenizes
every prompt exactly as specgen does (exit 1 otherwise). `run` times llama.cpp's target-only
greedy decoding (llama-simple) and its speculative decoding (llama-speculative-simple, greedy and
sampled, each draft length) on the same prompts with the same number of new tokens, and prints
one JSON document: per configuration the median decode rate and the acceptance, per prompt the
rates and the greedy texts (for the comparison with specgen's).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) s(?:econds)?, speed:\s+([\d.]+) t/s")
COUNTS = re.compile(r"n_(drafted|accept)\s+=\s+(\d+)")


def prompts(pair: Path, count: int | None) -> list[str]:
    lines = [json.loads(line)["prompt"] for line in (pair / "prompts.jsonl").read_text().splitlines() if line.strip()]
    return lines[:count] if count else lines


def specgen_ids(pair: Path, texts: list[str]) -> list[list[int]]:
    from specgen.core.models import load_tokenizer
    from specgen.core.settings import ModelSpec

    tokenizer = load_tokenizer(ModelSpec(path=str(pair / "target"), device="cpu"))
    return [tokenizer(text)["input_ids"] for text in texts]


def llama_ids(binary: Path, model: Path, text: str) -> list[int]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        out = subprocess.run([str(binary), "-m", str(model), "-f", file.name, "--ids", "--log-disable"],
                             capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def tokens(args) -> int:
    texts = prompts(args.pair, args.num_prompts)
    mismatched = 0
    for i, (text, want) in enumerate(zip(texts, specgen_ids(args.pair, texts))):
        got = llama_ids(args.bin / "llama-tokenize", args.pair / "target.gguf", text)
        if got != want:
            mismatched += 1
            first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            print(f"prompt {i}: llama.cpp {len(got)} ids, specgen {len(want)}; first difference at {first}")
    print(f"{len(texts) - mismatched} of {len(texts)} prompts tokenized identically")
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
    command = [str(args.bin / "llama-simple"), "-m", str(args.pair / "target.gguf"), "-n", str(args.max_tokens)]
    out, err, match = _run(command + (["-ngl", "99"] if args.gpu else []) + [text])
    tokens_, seconds, rate = match.groups()
    return {"tokens": int(tokens_), "seconds": float(seconds), "tok_s": float(rate), "text": out}


def speculative(args, text: str, k: int, temperature: float) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        command = [str(args.bin / "llama-speculative-simple"), "-m", str(args.pair / "target.gguf"),
                   "-md", str(args.pair / "draft.gguf"), "-f", file.name, "-n", str(args.max_tokens),
                   "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--temp", str(temperature), "--top-p",
                   str(args.top_p if temperature > 0 else 1.0), "--seed", "0", "-c", "2048"]
        if args.gpu:
            command += ["-ngl", "99", "-ngld", "99", "-fa", "on"]
        out, err, match = _run(command)
    counts = dict((name, int(value)) for name, value in COUNTS.findall(err))
    return {"tokens": int(match.group(1)), "seconds": float(match.group(2)), "tok_s": float(match.group(3)),
            "drafted": counts.get("drafted"), "accepted": counts.get("accept"), "text": out}


def run(args) -> int:
    texts = prompts(args.pair, args.num_prompts)
    configs = {"target-only": [target_only(args, text) for text in texts]}
    for temperature in args.temperature:
        for k in args.k:
            configs[f"speculative k={k} t={temperature}"] = [speculative(args, text, k, temperature) for text in texts]
    summary = {}
    for name, runs in configs.items():
        drafted = sum(r.get("drafted") or 0 for r in runs)
        accepted = sum(r.get("accepted") or 0 for r in runs)
        summary[name] = {"median_tok_s": statistics.median(r["tok_s"] for r in runs),
                         "acceptance": accepted / drafted if drafted else None}
    json.dump({"summary": summary, "runs": configs}, sys.stdout, indent=1)
    print()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["tokens", "run"])
    parser.add_argument("bin", type=Path)
    parser.add_argument("pair", type=Path)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--k", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 6, 8])
    parser.add_argument("-t", "--temperature", type=lambda s: [float(x) for x in s.split(",")], default=[0.0])
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--gpu", action="store_true", help="every layer on the GPU, flash attention on")
    args = parser.parse_args()
    return tokens(args) if args.what == "tokens" else run(args)


if __name__ == "__main__":
    sys.exit(main())
