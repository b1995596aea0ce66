"""`batch_size` auto: the batch size with the most tokens per second that `specgen bench
--batch-size` measured on this machine (core/measured.py), capped by memory and by the prompts,
never from guesses.

Facts: the batch bench's rows, one per (batch size B, k, tree shape) it ran at a sampling regime, k
0 being target-only (a chain of k: tree_width 1), each labelled by the proposer that drafted it
(draft, eagle, ngram, hybrid; none target-only: a run reads its own proposer's rows and
target-only's), each with its total tokens per second
(every prompt's tokens over the run's wall seconds). Per B the bench's recommendation
(`recommend`, the one `specgen bench --batch-size` prints) says whether speculation pays there (its
best run's tokens/s is not below target-only's) and at which k and tree shape; B's rate is the
recommended method's tokens/s.

The choice is the measured B with the highest rate among those whose rows fit in memory
(`memory_rows`, what the engine computes from the free device memory; None: not capped), then
never more rows than prompts: with fewer prompts than the best B, B is the number of prompts (the
rows a larger batch would add would only run masked), speculating or not as the bench recommends
at the measured B nearest to it. Where no measured B fits in memory, B is the rows that fit (at
least 1), with the smallest measured B's recommendation.

With nothing measured for the request's regime (the pair, device and dtype, and greedy or its
sampled coupling, as tree_width auto reads its rows: tree_cost.regime), auto is batch 1: the size
every run can take, which costs nothing to try; the reason says how to measure batches. A single
prompt is batch 1 (its live view).

Pure Python: no torch, so that it is tested with synthetic numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from specgen.core.bench.bench_plan import shape_label

MEMORY_SHARE = 0.8  # of the free device memory a batch's caches and buffers may take
BENCH_HINT = "specgen bench --batch-size 1,4,8,16 measures batches"


def bench_hint(proposer: str) -> str:
    """How to measure the batches a run of `proposer` reads (an EAGLE-3 head's: with --proposer eagle)."""
    return BENCH_HINT.replace(" measures", " --proposer eagle measures") if proposer == "eagle" else BENCH_HINT


@dataclass(frozen=True)
class BatchChoice:
    """What batch_size resolved to, and why (generate -v). measured: from the bench's rows, so the
    run takes their speculate / k; otherwise the profile's proposer and k stand."""

    batch: int
    speculate: bool = True
    k: int | None = None
    reason: str | None = None  # None: batch_size was given, not auto
    measured: bool = False
    tree_width: int = 1  # the measured choice's tree (1: a chain of k)
    tree_nodes: int = 0


def recommend(results: list[dict]) -> tuple[list[dict], int | None]:
    """(per batch size: the best speculative run by tokens/s against target-only there, and the
    choice; the smallest batch size at which speculation stops paying, None when it pays at every
    one measured). Speculation pays at B when its best tokens/s is not below target-only's.
    results: rows with batch_size, k (0: target-only) and tokens_per_second."""
    out, stops = [], None
    for batch in dict.fromkeys(r["batch_size"] for r in results):
        rows = [r for r in results if r["batch_size"] == batch]
        base = next((r for r in rows if r["k"] == 0), None)
        spec = [r for r in rows if r["k"] > 0]
        best = max(spec, key=lambda r: r["tokens_per_second"]) if spec else None
        if base is None or best is None:
            continue
        ratio = best["tokens_per_second"] / base["tokens_per_second"] if base["tokens_per_second"] > 0 else None
        pays = best["tokens_per_second"] >= base["tokens_per_second"]
        if not pays and stops is None:
            stops = batch
        width, nodes = best.get("tree_width", 1), best.get("tree_nodes", best["k"])
        out.append({"batch_size": batch, "choice": shape_label(best) if pays else "target-only",
                    "k": best["k"] if pays else 0, "best_k": best["k"], "best": shape_label(best),
                    "tree_width": width if pays else 1, "tree_nodes": (nodes if pays else 0),
                    "speculation_pays": pays,
                    "speculative_tokens_per_second": best["tokens_per_second"],
                    "target_only_tokens_per_second": base["tokens_per_second"], "speedup": ratio})
    return out, stops


def shape_at(rows: list[dict], batch: int, where: str = "") -> BatchChoice:
    """A set batch size's speculation shape where tree_width or tree_nodes is auto: the fastest
    speculative run of `rows` (one regime's, of the shapes the settings choose among) at the
    measured batch size nearest `batch` (the smaller on a tie), its k and tree; where none was
    measured, the profile's chain (not `measured`: Engine.batch_profile leaves the profile, and
    the batch decodes an unresolved shape as a chain). The batch size stands either way."""
    runs = [r for r in rows if r["k"]]
    if not runs:
        return BatchChoice(batch, reason=f"tree shape auto at batch {batch}: nothing measured{where}: a chain "
                                         f"({BENCH_HINT} --tree-width 1,2,4 --tree-nodes 8,16)")
    at = min(dict.fromkeys(r["batch_size"] for r in runs), key=lambda b: (abs(b - batch), b))
    best = max((r for r in runs if r["batch_size"] == at), key=lambda r: r["tokens_per_second"])
    width = best.get("tree_width", 1)
    return BatchChoice(batch, True, best["k"], measured=True, tree_width=width,
                       tree_nodes=best.get("tree_nodes", best["k"]) if width > 1 else 0,
                       reason=f"batch {batch}, {shape_label(best)}{where}: the fastest shape measured at batch {at}, "
                              f"{best['tokens_per_second']:,.0f} tok/s")


def memory_rows(free_bytes: int, row_bytes: int, share: float = MEMORY_SHARE) -> int:
    """The rows whose caches and buffers fit in `share` of the free memory."""
    return int(share * free_bytes) // row_bytes if row_bytes > 0 else 0


def choose(rows: list[dict], proposer: str, prompts: int, rows_fit: int | None, where: str = "",
           memory: str = "") -> BatchChoice:
    """B for `prompts` prompts from `rows` (one regime's batch rows: tree_cost.regime). proposer:
    the profile's (a proposer: its rows and target-only's; none: target-only rows only).
    rows_fit: the rows memory holds (None: not capped); where, memory: the facts' and the memory
    cap's descriptions, for the reason."""
    if prompts <= 1:
        return BatchChoice(1, reason="a single prompt: batch 1")
    sizes = _rates(rows, proposer)
    if not sizes:
        return BatchChoice(1, reason=f"nothing measured{where}: batch 1 ({bench_hint(proposer)})")
    fits = [b for b in sizes if rows_fit is None or b <= rows_fit]
    notes = [memory] if memory else []
    if fits:
        best = max(fits, key=lambda b: (sizes[b][0], -b))
        batch = min(best, prompts)
        if len(fits) < len(sizes):
            notes.append(f"batch {', '.join(str(b) for b in sorted(set(sizes) - set(fits)))} would not fit")
        if batch < best:
            notes.append(f"{prompts} prompts: {batch} rows, not batch {best}'s {best}")
        at = min(sizes, key=lambda b: (abs(b - batch), b))  # whose recommendation the run takes
    else:
        batch = max(1, min(rows_fit or 0, prompts))
        at = min(sizes)
        notes.append(f"no measured batch fits, {batch} {'row does' if batch == 1 else 'rows do'}")
    rate, speculate, k, width, nodes = sizes[at]
    what = _named(sizes[at])
    if not speculate and proposer != "none":
        notes.insert(0, f"speculation does not pay at batch {at}: target-only was measured faster")
    summary = ", ".join(f"batch {b} {_named(sizes[b])} {sizes[b][0]:,.0f} tok/s" for b in sorted(sizes))
    return BatchChoice(batch, speculate, k, measured=True, tree_width=width, tree_nodes=nodes,
                       reason=f"batch {batch}, {what}{where}: {summary}" + "".join(f"; {n}" for n in notes))


def _rates(rows: list[dict], proposer: str) -> dict[int, tuple[float, bool, int, int, int]]:
    """Per measured B: (the recommended method's tokens/s, speculate, k, tree_width, tree_nodes)."""
    if proposer == "none":
        return {r["batch_size"]: (r["tokens_per_second"], False, 0, 1, 0) for r in rows if r["k"] == 0}
    recommendations, _ = recommend(rows)
    return {rec["batch_size"]: (max(rec["speculative_tokens_per_second"], rec["target_only_tokens_per_second"]),
                                rec["speculation_pays"], rec["k"], rec["tree_width"], rec["tree_nodes"])
            for rec in recommendations}


def _named(rate: tuple) -> str:
    _, speculate, k, width, nodes = rate
    return shape_label({"k": k, "tree_width": width, "tree_nodes": nodes}) if speculate else "target-only"
