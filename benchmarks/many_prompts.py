"""Many prompts through `generate --prompts-file --batch-size B --format jsonl`: memory held by B, not by the file.

Writes N short prompts to a JSONL file, runs specgen on it (the demo pair by default) as a child
process, samples the child's resident memory (VmRSS, /proc) while it runs, and checks every line of
its stdout: valid JSON, the prompts in the file's order. Run for several N, the peaks should not
grow with N.

    PYTHONPATH=src python benchmarks/many_prompts.py --prompts 1000,10000 --batch-size 16 --max-tokens 4 \\
        --out benchmarks/results/batches/many-prompts.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

WORDS = ("def", "class", "import", "return", "for", "while", "if", "else", "print", "self", "x", "y", "data",
         "value", "list", "dict", "open", "read", "write", "sum")


def write_prompts(path: Path, count: int) -> list[str]:
    rng = random.Random(count)
    prompts = [f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for i in range(count)]
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return prompts


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(count: int, args) -> dict:
    path = Path(args.workdir) / f"many-prompts-{count}.jsonl"
    prompts = write_prompts(path, count)
    command = [sys.executable, "-m", "specgen", "generate", "--prompts-file", str(path), "--batch-size",
               str(args.batch_size), "--format", "jsonl", "--max-tokens", str(args.max_tokens), "-q",
               "--threads", str(args.threads), *(["-p", args.profile] if args.profile else [])]
    began = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, encoding="utf-8")
    samples: list[tuple[float, int, float]] = []  # (seconds, lines written, RSS MiB)
    lines = [0]

    def sample():
        while child.poll() is None:
            mib = rss_mib(child.pid)
            if mib is not None:
                samples.append((time.perf_counter() - began, lines[0], mib))
            time.sleep(args.every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    valid = in_order = True
    for line in child.stdout:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            valid = False
            continue
        in_order &= lines[0] < count and record.get("prompt") == prompts[lines[0]]
        lines[0] += 1
    code = child.wait()
    sampler.join()
    seconds = time.perf_counter() - began
    path.unlink()
    # memory at each quarter of the output, once decoding runs (start-up excluded: the models load)
    quarters = {f"{q}%": max((m for _, n, m in samples if n <= count * q // 100), default=None) for q in (25, 50, 75, 100)}
    return {"prompts": count, "exit_code": code, "lines": lines[0], "every_line_valid_json": valid,
            "in_input_order": in_order and lines[0] == count, "seconds": round(seconds, 1),
            "peak_rss_mib": round(max(m for _, _, m in samples), 1),
            "peak_rss_mib_by_output": {q: round(m, 1) if m is not None else None for q, m in quarters.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="1000,10000")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", default=None, help="default: the demo pair")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between memory samples")
    parser.add_argument("--workdir", default="/tmp")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = [run(int(n), args) for n in args.prompts.split(",")]
    document = {"date": time.strftime("%Y-%m-%d"), "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(), "batch_size": args.batch_size, "max_tokens": args.max_tokens,
                "threads": args.threads, "profile": args.profile or "demo", "results": results}
    text = json.dumps(document, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
