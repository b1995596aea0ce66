"""The facts `specgen bench` measured on this machine, kept for `tree_width` / `tree_nodes` auto
and `batch_size` auto.

After a complete sweep, bench writes its rows here (cli/bench.py): per pair (target, draft, device,
dtype), one row per method it ran, target-only included (k 0), each with its sampling regime
(temperature, coupling), its shape (k, tree_width, tree_nodes), the round's phases in ms per round,
its wall ms per round (tokens per round over the decode rate), tokens per round, per-position
acceptance and the rounds these came from, and `positions`, the mean position its generations
reached (prompt tokens and max_tokens: tree_width auto leaves out trees measured far shorter than
a run's prompts, core/tree_cost.py); a row whose proposer drafts with an EAGLE-3 head
(eagle, or hybrid with hybrid_with eagle) carries the head's folder in `head` (null otherwise),
which identifies it as its proposer does: a head's rows stand for that head only. A later bench of
the same pair replaces the rows of the methods it ran again and keeps the others. core/tree_cost.py
chooses a shape from them; a run with nothing measured for its pair resolves auto to a chain.
Rows kept before rows carried a head have none: the draft model's, prompt lookup's and
target-only's read as before (they never had one), a head's (eagle, or hybrid: which model it
drafted with is unknown) are another head's for all a run can tell, so a run whose proposer
drafts with a head reads none of them (`tree_rows`); a bench of that head measures its own.

After a complete batch bench (`specgen bench --batch-size`) its rows go into the same file, under
`batches` beside `pairs`, keyed by the same pair: one row per (batch size, k) at its sampling
regime (k 0: target-only, proposer none), labelled by the proposer that drafted it (draft, or
eagle with the head's folder in `head`: a head's rows stand for that head only), with its total
tokens per second and its rows' median ms per token (core/batch_cost.py chooses from the run's
proposer's rows and target-only's). A later batch bench replaces the rows it ran again. Rows kept
before eagle could batch carry proposer draft (or none); a row without one reads as the draft
model's (k > 0) or target-only (k 0), which is what every such bench measured. `batches` is an
addition within format 1: a reader that knows only `pairs` ignores it.

The file is `measured.json` in `[runtime] measured` (default: specgen's folder in the user cache,
beside `tune-kernels`' tables). A file that cannot be read or is of another format counts as nothing
measured. Imports no torch.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

FILE = "measured.json"
FORMAT = 1
SHAPE = ("proposer", "head", "temperature", "coupling", "k", "tree_width", "tree_nodes")  # what identifies a row
# what identifies a batch row (rows kept before batches measured trees have no tree fields: chains)
BATCH_SHAPE = ("proposer", "head", "temperature", "coupling", "batch_size", "k", "tree_width", "tree_nodes")


def measured_dir(folder: str = "") -> Path:
    """The profile's [runtime] measured folder, else specgen's folder in the user's cache directory."""
    return Path(folder).expanduser() if folder else user_cache()


def user_cache() -> Path:
    """specgen's folder in the user's cache directory ($XDG_CACHE_HOME/specgen, else
    ~/.cache/specgen): where measured facts and tuned tables go unless the profile names a
    folder. The standard's location, not a switch: the profile's fields choose."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specgen"


def pair_key(target: str, draft: str | None, device_name: str, dtype: str) -> str:
    """Whose facts: the two checkpoints, the device by name and the weights' dtype."""
    return json.dumps([target, draft, device_name, dtype])


def describe_head(head: str) -> str:
    return Path(head).name


def describe_key(key: str) -> str:
    target, draft, device, dtype = json.loads(key)
    return f"{Path(target).name} + {Path(draft).name if draft else 'no draft'} on {device} ({dtype})"


def rows_from_bench(document: dict) -> tuple[str, list[dict]]:
    """(pair key, rows) of a bench document (docs/bench-schema.md): its results, and its target-only
    baselines that carry their round's phases."""
    env, profile = document["environment"], document["profile"]
    key = pair_key(profile["target"], profile.get("draft"), env["device_name"], env["dtype"])
    when = document.get("created")
    reach = _positions(document)
    rows = []
    for result in document["results"]:
        rows.append({"proposer": result["proposer"], "head": result.get("head"), "temperature": result["temperature"],
                     "coupling": result.get("coupling"), "k": result["k"],
                     "tree_width": result.get("tree_width", 1), "tree_nodes": result.get("tree_nodes", result["k"]),
                     "tokens_per_round": result["mean_accepted_length"], "round_ms": result["round_ms"],
                     "per_position_acceptance": result["per_position_acceptance"],
                     "rounds": result["counts"]["rounds"], "created": when, "positions": reach,
                     "wall_ms": _wall_ms(result["mean_accepted_length"], result.get("decode_tokens_per_second"))})
    for base in document["baselines"]:
        if base["method"] == "target-only" and base.get("available") and base.get("round_ms"):
            rows.append({"proposer": "none", "head": None, "temperature": base["temperature"],
                         "coupling": base.get("coupling"),
                         "k": 0, "tree_width": 1, "tree_nodes": 0, "tokens_per_round": 1.0,
                         "round_ms": base["round_ms"], "per_position_acceptance": [],
                         "rounds": base.get("rounds"), "created": when, "positions": reach,
                         "wall_ms": _wall_ms(1.0, base.get("decode_tokens_per_second"))})
    return key, rows


def _positions(document: dict) -> int | None:
    """The mean position a bench's generations reached: its prompts' tokens and max_tokens (what a
    tree's verification cost grows with, core/tree_cost.py); None where the document lacks them."""
    prompts = [p["tokens"] for p in document.get("prompts") or [] if p.get("tokens") is not None]
    most = (document.get("settings") or {}).get("max_tokens")
    if not prompts or most is None:
        return None
    return round(sum(prompts) / len(prompts) + most)


def _wall_ms(tokens_per_round: float, decode: dict | None) -> float | None:
    """A round's wall ms: its tokens over the median decode rate (what the table's decode tok/s
    shows); None without one (a single round per prompt)."""
    rate = (decode or {}).get("median")
    return 1000.0 * tokens_per_round / rate if rate else None


def batch_rows_from_bench(document: dict) -> tuple[str, list[dict]]:
    """(pair key, rows) of a batch bench document (docs/bench-schema.md, "Batches"): each run's
    batch size, k (0: target-only), tokens/s and median row ms per token, at its regime, and its
    proposer (none target-only; a document without one is the draft model's), with the folder of
    the head it drafts with (eagle, hybrid with hybrid_with eagle: drafting_head)."""
    pair, when = document["pair"], document.get("created")
    key = pair_key(pair["target"], pair.get("draft"), pair["device_name"], pair["dtype"])
    proposer = document.get("proposer", "draft")
    head = pair.get("head")  # the document names one only where a head drafts
    rows = [{"proposer": proposer if r["k"] else "none", "head": head if r["k"] else None,
             "temperature": document["temperature"],
             "coupling": document.get("coupling"), "batch_size": r["batch_size"], "k": r["k"],
             "tree_width": r.get("tree_width", 1), "tree_nodes": r.get("tree_nodes", r["k"]),
             "tokens_per_second": r["tokens_per_second"],
             "row_ms_per_token": (r.get("row_ms_per_token") or {}).get("median"),
             "prompts": r.get("prompts"), "max_tokens": document.get("max_tokens"), "created": when}
            for r in document["results"]]
    return key, rows


def merge(old: list[dict], new: list[dict], shape: tuple[str, ...] = SHAPE) -> list[dict]:
    """`old` without the rows `new` measures again (the same `shape` fields), then `new`."""
    again = {_identity(row, shape) for row in new}
    return [row for row in old if _identity(row, shape) not in again] + new


def _identity(row: dict, shape: tuple[str, ...]) -> tuple:
    """A row's `shape` fields; a row without tree fields is a chain (width 1, k nodes)."""
    chain = {"tree_width": 1, "tree_nodes": row.get("k")}
    return tuple(row.get(name, chain.get(name)) for name in shape)


def _read(folder: str) -> dict:
    """The file's content: {} where nothing was written, it cannot be read or is of another format."""
    path = measured_dir(folder) / FILE
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("pairs"), dict):
        return {}
    return data


def load(folder: str = "") -> dict[str, list[dict]]:
    """Rows by pair key; {} where nothing was written or the file cannot be read."""
    return _read(folder).get("pairs", {})


def load_batches(folder: str = "") -> dict[str, list[dict]]:
    """Batch rows by pair key; {} where no batch bench was kept (or the file cannot be read). A row
    without a proposer (none was written before eagle could batch) is the draft model's, or
    target-only at k 0."""
    batches = _read(folder).get("batches")
    if not isinstance(batches, dict):
        return {}
    return {key: [row if "proposer" in row else {**row, "proposer": "draft" if row.get("k") else "none"}
                  for row in rows] for key, rows in batches.items()}


def batch_rows(rows: list[dict], proposer: str, head: str | None = None) -> list[dict]:
    """The batch rows a run of `proposer` drafting with `head` (drafting_head) reads: its
    proposer's and target-only's (tree_cost.regime keeps those), a head's (eagle's, or hybrid's
    with one) only where they are this `head`'s, so hybrid's rows with the draft model and with a
    head stay apart."""
    return [row for row in rows if row["proposer"] not in ("eagle", "hybrid") or row.get("head") == head]


def drafting_head(proposer, kind: str) -> str | None:
    """The EAGLE-3 head folder a run of `kind` drafts with (proposer: the profile's ProposerSpec):
    its `head` where kind drafts with one (eagle, or hybrid with hybrid_with eagle), else None.
    Bench writes it into each result (`head`), auto reads the rows of it (tree_rows)."""
    return proposer.head if proposer.drafter(kind) == "eagle" else None


def tree_rows(rows: list[dict], head: str | None) -> list[dict]:
    """The rows (`pairs`) a run drafting with `head` (drafting_head; None: no head) reads:
    target-only's, and those measured with that head, or with none where it drafts with none. A
    row kept without a head (before rows carried one) has head None: a head's run reads none of
    them, another proposer's reads them as before."""
    return [row for row in rows if row["proposer"] == "none" or row.get("head") == head]


def save(folder: str, document: dict) -> tuple[Path, int]:
    """Merge a bench document's rows into the file (written whole, then renamed into place, so a
    reader never sees half of it); (its path, the rows written)."""
    key, rows = rows_from_bench(document)
    return _write(folder, "pairs", key, rows, SHAPE)


def save_batches(folder: str, document: dict) -> tuple[Path, int]:
    """Merge a batch bench document's rows into the file, as save() does; (its path, the rows written)."""
    key, rows = batch_rows_from_bench(document)
    return _write(folder, "batches", key, rows, BATCH_SHAPE)


def _write(folder: str, table: str, key: str, rows: list[dict], shape: tuple[str, ...]) -> tuple[Path, int]:
    data = _read(folder)
    batches = data.get("batches")
    tables = {"pairs": data.get("pairs", {}), "batches": batches if isinstance(batches, dict) else {}}
    tables[table][key] = merge(tables[table].get(key, []), rows, shape)
    path = measured_dir(folder) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    temporary.write_text(json.dumps({"format": FORMAT, "updated": stamp, **tables}, indent=1), "utf-8")
    temporary.replace(path)
    return path, len(rows)


def auto_from_bench(document: dict) -> list[dict]:
    """What `tree_width` / `tree_nodes` auto would choose from this bench's own rows alone, per
    sweep at its recommended k (the draft proposer's: auto reads the draft model's trees from a bench)."""
    from specgen.core.tree_cost import choose, regime

    _, rows = rows_from_bench(document)
    out = []
    for rec in document["recommendation_per_proposer"]:
        if rec.get("proposer") != "draft":
            continue
        ours = regime(rows, rec["temperature"], rec.get("coupling") or "rejection")
        choice = choose(rec["k"], "auto", "auto", ours, f" (this bench, T={rec['temperature']:g})")
        out.append({"temperature": rec["temperature"], "coupling": rec.get("coupling"), "k": rec["k"],
                    "speculate": choice.speculate, "tree_width": choice.width, "tree_nodes": choice.nodes,
                    "reason": choice.reason})
    return out
