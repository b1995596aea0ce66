"""One line per result of `specgen bench --format json` files: the device scripts' summary.

    python benchmarks/bench_summary.py OUT/on.json OUT/off.json ...

Per file: the resolved dependent launch and start-up; per baseline its median tok/s; per result
the proposer, k, temperature, median tok/s, mean accepted length, speed-up over target-only, the
fraction of greedy tokens identical to target-only's, and the round's phases in ms.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def summary(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"{path.stem} unreadable {exc}"]
    kernels = data["environment"]["resolved"].get("kernels", {}).get("target", {}).get("dependent_launch")  # CPU: none
    lines = [f"== {path.stem} dependent {kernels} startup {data.get('startup_seconds')}"]
    for b in data["baselines"]:
        lines.append(f" target-only {b['temperature']} tok/s {b['tokens_per_second']['median']:.0f}")
    for r in data["results"]:
        agreement = ((r.get("greedy_agreement") or {}).get("target-only") or {}).get("identical_fraction")
        phases = {k: round(v, 3) for k, v in r["round_ms"].items()}
        shape = f"w{r['tree_width']}n{r['tree_nodes']}" if r.get("tree_width", 1) > 1 else "chain"
        coupling = r.get("coupling") or "-"
        lines.append(f"{r['proposer']} {r['k']} {shape} {r['temperature']} {coupling} tok/s {r['tokens_per_second']['median']:.0f} "
                     f"mal {r['mean_accepted_length']:.2f} x {r['speedup']['target-only']['median']:.2f} "
                     f"identical {agreement} {phases}")
    return lines


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print("\n".join(summary(Path(name))))
