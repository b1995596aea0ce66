"""The linear kernel's configurations as data: which configuration each weight shape takes.

A configuration is (DOT, BLOCK_N, BLOCK_K, num_warps, num_stages) with an optional 6th entry, the
number of K chunks (split-K, tensor-core configurations only; matrix-vector ones, DOT false, read
the whole of K per program, in BLOCK_K pieces, with num_stages 1). It is picked by (N, K, gated)
and by nothing else: never by the row count (each row must be computed the same way in a 1-row
and a (k+1)-row call, gpu/kernels/linear.py; a draft model's table is the one exception,
LinearTable.for_drafts) and never by the GPU's name (a table tuned on a GPU lives on that machine,
not in the code).

Where a shape's configuration comes from, first match wins:
1. the table `specgen tune-kernels` wrote on this machine (tables_dir()/linear.json), when the
   run's [kernels] tables folder holds one;
2. the package's table (linear_configs.json beside this file: every projection of the real pairs
   benchmarks/family_pairs.py builds and of the bench pair, tuned on an H200 with
   `benchmarks/bench_kernels.py table`, `git show 1b54921:docs/benchmarks.md`, "Step inputs and
   draft-shaped tables (H200)";
   the drafts' one-row picks then chosen inside each draft's captured step with `bench_kernels.py
   step-table`, "Draft picks chosen inside the step (H200)");
3. rule() for shapes no table lists (draft_rule() in a draft's runner): the same measurements as
   rules of thumb.

Each entry holds two configurations: `plain` (split-K off) and `split` (split-K allowed: the
split-K resolved on: gpu/policy.py), as gpu/policy.py decides split-K per device, both the best
over one row and a verification's rows; and it may hold a third, `draft`, the best at one row,
which a draft model's runner takes instead (LinearTable.for_drafts).

Launches: how a tall call (more than TALL_FROM rows: a batch's verification, a tree's nodes) runs a
tensor-core configuration. A configuration fixes what a row's sums are: tensor-core products over
K in order, in the K chunks `chunk_width` cuts; its tile (BLOCK_N, BLOCK_K, warps, stages) only
fixes how the work is spread and loaded. A launch (tile rows, BLOCK_N, BLOCK_K, warps, stages)
replaces that spread for calls of a row class (ROW_CLASSES: up to 64, 128 or BATCH_ROWS rows)
while it keeps the sums: the same chunk boundaries, so every row keeps the bits of the one-row
call (on an H200 every launch timed for Llama-3-8B's projections at 33 to 160 rows gave each row
bitwise the one-row call's, and every BLOCK_K that moved a split-K chunk's boundary did not:
docs/benchmarks.md, "Launches for tall calls (H200)"; tests/gpu/kernels/test_exact.py checks the
package's launches on each GPU). A launch
is listed with the configuration it was measured for and applies to calls of that configuration
only, so a table tuned later that changes a shape's pick leaves the old launches unused.

Imports no torch and no Triton: gpu/policy.py loads tables, and reads a model's shapes
(model_shapes), while resolving a run's settings.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1
FILE = "linear.json"
PACKAGED = Path(__file__).with_name("linear_configs.json")

# The rules' configurations. One tensor-core configuration is within 5% of the best for 1 and for 5
# rows on every Llama-3-8B shape with N > 2048; narrower outputs want narrower tiles.
WIDE = (True, 32, 256, 4, 4)
NARROW = (True, 16, 256, 4, 4)
# Split-K, measured on an H200: the long-K down projection (4096 x 14336: 128 column blocks), the
# gate/up pair and a 4096-wide projection with 128 column blocks gain; q+k+v fused (6144 wide) not.
SPLIT_LONG_K = (True, 32, 128, 4, 4, 3)  # K >= 3 N
SPLIT_GATED = (True, 32, 128, 4, 3, 4)  # gate_up
SPLIT_FEW_COLUMNS = (True, 32, 128, 4, 5, 2)  # at most 128 column blocks of 32
# Narrow outputs over a long K (small drafts' down projections; the package's table, tuned on an
# H200, picks 4 to 8 chunks for every such shape of the real pairs).
SPLIT_NARROW = (True, 32, 128, 4, 3, 8)  # N <= 2048, K >= 2 N


# Row classes of the launches: a call of r rows (r > TALL_FROM) takes its shape's launch for the
# least class >= r. 64: a 33-node tree, a batch of 8 at k = 4 or 16 at k = 3; 128: 16 rows at
# k = 4 (80 rows) to 32 at k = 3; 512: the longest call (core/step/ops.py's BATCH_ROWS).
TALL_FROM = 32
ROW_CLASSES = (64, 128, 512)
TILES = (16, 32, 64, 128)


def chunk_width(k: int, config: tuple) -> int:
    """The K columns of one split-K chunk of a tensor-core configuration (all of K without split-K):
    whole BLOCK_K tiles, so the chunks' boundaries, and with them a row's sums, are the
    configuration's whatever the launch."""
    block_k, chunks = config[2], (config[5] if len(config) > 5 else 1)
    per_chunk = -(-k // chunks)
    return block_k * -(-per_chunk // block_k)


def keeps_sums(k: int, config: tuple, launch: tuple) -> bool:
    """Whether `launch` computes each row's sums as `config` does: a tensor-core configuration, a
    BLOCK_K that tiles the configuration's chunks exactly (and K itself, where it differs from the
    configuration's, so no masked tail moves)."""
    block_k = launch[2]
    return bool(config[0]) and chunk_width(k, config) % block_k == 0 and (block_k == config[2] or k % block_k == 0)


DRAFT_ROWS = 1  # calls of at most this many rows take a draft's picks (LinearTable.for_drafts)
# A draft's calls of at least this many rows (a batch's steps) take tensor-core tiles where its
# table's pick is a matrix-vector one: that kernel computes rows one after another, and at 8 rows
# a tile is faster on every such projection of the bench pair and of Llama-3.2-1B (H200: 1B down
# projection 18.4 against 34.8 µs; the bench pair's o projection 3.6 against 5.7), at 32 up to 5x.
DRAFT_TILE_ROWS = 8


def draft_rule(n: int, k: int, gated: bool) -> tuple:
    """The configuration of a draft's shape no table lists: a matrix-vector one of about 4K weights
    per program (2K per weight when gated), K in pieces of at most 2048. Every draft shape the
    H200 tuning of 2026-11-25 timed was fastest at one row in a matrix-vector configuration of 2K to
    8K weights (`git show 1b54921:docs/benchmarks.md`, "Matrix-vector projections (H200)")."""
    piece = min(2048, 1 << max(0, k - 1).bit_length())
    return (False, max(1, min(16, max(2, 4096 // piece) // (2 if gated else 1))), piece, 4, 1)


def model_shapes(config) -> list[tuple[int, int, bool]]:
    """(N, K, gated) of a transformers config's projections as gpu/ops.py's table calls them: q+k+v fused,
    o, gate+up fused (gated), down, lm_head."""
    text = config.get_text_config(decoder=True)
    hidden, heads = text.hidden_size, text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    return [((heads + 2 * kv) * head_dim, hidden, False), (hidden, heads * head_dim, False),
            (text.intermediate_size, hidden, True), (hidden, text.intermediate_size, False),
            (text.vocab_size, hidden, False)]


def head_shapes(config) -> list[tuple[int, int, bool]]:
    """(N, K, gated) of an EAGLE-3 head's calls (core/drafters/eagle.py's Eagle3Config) as gpu/ops.py's
    table makes them: fc over the target's three features, q+k+v fused over the embedding and feature
    side by side, o, gate+up fused (gated), down, lm_head over the draft vocabulary."""
    hidden, q, kv = config.hidden_size, config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    return [(hidden, 3 * config.target_hidden_size, False), (q + 2 * kv, 2 * hidden, False), (hidden, q, False),
            (config.intermediate_size, hidden, True), (hidden, config.intermediate_size, False),
            (config.draft_vocab_size, hidden, False)]


class TableError(ValueError):
    """A table file that cannot be read as a table: the message names the file and what is wrong."""


def rule(n: int, k: int, gated: bool, split_k: bool) -> tuple:
    """The configuration of a shape no table lists."""
    if n > 2048:
        if split_k and k >= 2048:
            if gated:
                return SPLIT_GATED
            if k >= 3 * n:
                return SPLIT_LONG_K
            if n <= 128 * 32:
                return SPLIT_FEW_COLUMNS
        return WIDE
    if split_k and k >= 2 * n and k >= 2048:
        return SPLIT_NARROW
    return NARROW


@dataclass(frozen=True)
class LinearTable:
    """Configurations by shape: entries ((n, k, gated), plain, split), sorted; `source` says where
    they came from (a path, or "package"), for reports; drafts ((n, k, gated), config), sorted: the
    best configuration at one row, for draft models (for_drafts)."""

    entries: tuple = ()
    source: str = "rules"
    drafts: tuple = ()
    for_draft: bool = False  # for_drafts()'s: unlisted shapes take draft_rule
    launches: tuple = ()  # ((n, k, gated), configuration, row class, launch), sorted

    def launch(self, n: int, k: int, gated: bool, config: tuple, rows: int) -> tuple | None:
        """The launch (tile rows, BLOCK_N, BLOCK_K, warps, stages) of a call of `rows` rows that
        runs `config` on shape (n, k, gated), where the table lists one for its row class (module
        docstring: it keeps the configuration's sums); None: the configuration's own tile."""
        if rows <= TALL_FROM or not config[0]:
            return None
        row_class = next((c for c in ROW_CLASSES if rows <= c), ROW_CLASSES[-1])
        key = (n, k, bool(gated))
        for shape, measured, listed, launch in self.launches:
            if shape == key and listed == row_class and measured == tuple(config):
                return launch
        return None

    def coverage(self, shapes, split_k: bool) -> tuple[int, int]:
        """(how many (shape, row class) pairs of `shapes` have a launch here, how many pairs run a
        tensor-core configuration, the ones a launch can serve): whether this table covers a model's
        tall calls (gpu/policy.py reports it). Each pair's configuration is pick()'s at its class's
        rows, as a draft's table picks by rows."""
        pairs = [(shape, rows, self.pick(*shape, split_k, rows)) for shape in shapes for rows in ROW_CLASSES]
        tensor_core = [(shape, rows, config) for shape, rows, config in pairs if config[0]]
        provided = sum(self.launch(*shape, config, rows) is not None for shape, rows, config in tensor_core)
        return provided, len(tensor_core)

    def pick(self, n: int, k: int, gated: bool, split_k: bool, rows: int = 1) -> tuple:
        """The configuration of a call of `rows` rows: the same for every row count, except in a
        draft's table (for_drafts), where calls of DRAFT_ROWS rows take the draft picks and calls of
        DRAFT_TILE_ROWS rows or more tensor-core tiles (rule()'s) instead of a matrix-vector pick."""
        key = (n, k, bool(gated))
        if self.for_draft and rows <= DRAFT_ROWS:
            for shape, config in self.drafts:
                if shape == key and (split_k or len(config) == 5):
                    return config
            if all(shape != key for shape, _, _ in self.entries):
                return draft_rule(n, k, gated)
        for shape, plain, split in self.entries:
            if shape == key:
                config = split if split_k else plain
                if self.for_draft and rows >= DRAFT_TILE_ROWS and not config[0]:
                    return rule(n, k, gated, split_k)
                return config
        return rule(n, k, gated, split_k)

    def over(self, base: LinearTable) -> LinearTable:
        """This table's entries, and base's for the shapes this one does not list."""
        mine = {shape for shape, _, _ in self.entries}
        entries = self.entries + tuple(e for e in base.entries if e[0] not in mine)
        drafts = self.drafts + tuple(d for d in base.drafts if d[0] not in mine)
        # base's launches stay where this table lists none for a (shape, configuration, row
        # class): each applies to the configuration it was measured for only
        listed = {launch[:3] for launch in self.launches}
        launches = self.launches + tuple(a for a in base.launches if a[:3] not in listed)
        return LinearTable(tuple(sorted(entries)), f"{self.source} over {base.source}", tuple(sorted(drafts)),
                           launches=tuple(sorted(launches)))

    def for_drafts(self) -> LinearTable:
        """The table a draft model's runner uses: its one-row calls take each shape's draft
        configuration (a split-K one only where split-K is on; draft_rule for shapes no table
        lists), its other calls (a round's first step over two ids, prefill chunks) the same as a
        target's. Why: a draft's steps are one row but for the first of a round, and the
        configuration fastest at one row, for a 1B-class draft a matrix-vector one, is the one the
        objective of `plain` and `split` (one row plus a verification's) passes over; at two rows
        and more it is slower (`git show 1b54921:docs/benchmarks.md`, "Matrix-vector projections (H200)").
        Choosing by row count here costs nothing exact: a draft's numerics never decide the output, and its
        cache need not match what a one-row step would have written."""
        return LinearTable(self.entries, f"{self.source}, draft picks", self.drafts, for_draft=True,
                           launches=self.launches)

    def to_json(self, **notes) -> str:
        drafts = dict(self.drafts)
        launches = {}
        for shape, config, row_class, launch in self.launches:
            launches.setdefault(shape, []).append({"config": list(config), "rows": row_class, "launch": list(launch)})
        shapes = [{"n": n, "k": k, "gated": gated, "plain": list(plain), "split": list(split),
                   **({"draft": list(drafts[(n, k, gated)])} if (n, k, gated) in drafts else {}),
                   **({"launches": launches[(n, k, gated)]} if (n, k, gated) in launches else {})}
                  for (n, k, gated), plain, split in self.entries]
        return json.dumps({"format": FORMAT, **notes, "shapes": shapes}, indent=1) + "\n"


def load(path: Path) -> LinearTable:
    """The table in `path`; TableError when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise TableError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("shapes"), list):
        raise TableError(f"{path}: not a linear-kernel table of format {FORMAT}")
    entries, drafts, launches = [], [], []
    for i, item in enumerate(data["shapes"]):
        try:
            shape = (int(item["n"]), int(item["k"]), bool(item["gated"]))
            entries.append((shape, _config(item["plain"], split=False), _config(item["split"], split=True)))
            if "draft" in item:
                drafts.append((shape, _config(item["draft"], split=True)))
            for j, listed in enumerate(item.get("launches", [])):
                try:
                    launches.append(_launch(shape, listed))
                except (KeyError, TypeError, ValueError) as exc:
                    raise ValueError(f"launches[{j}]: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise TableError(f"{path}: shapes[{i}]: {exc}") from None
    return LinearTable(tuple(sorted(entries)), str(path), tuple(sorted(drafts)), launches=tuple(sorted(launches)))


def _launch(shape: tuple, item) -> tuple:
    """A launch from JSON, checked: a tile the kernel compiles, for a row class, that keeps its
    configuration's sums (keeps_sums)."""
    if not isinstance(item, dict):
        raise TypeError(f"a launch is {{config, rows, launch}}, not {item!r}")
    config, row_class, launch = _config(item["config"], split=True), item["rows"], item["launch"]
    if row_class not in ROW_CLASSES:
        raise ValueError(f"rows {row_class!r}: a row class is one of {', '.join(map(str, ROW_CLASSES))}")
    if not isinstance(launch, list) or len(launch) != 5 or not all(isinstance(v, int) and v > 0 for v in launch):
        raise ValueError(f"a launch is [tile rows, block_n, block_k, warps, stages], not {launch!r}")
    tile, block_n, block_k, warps, stages = launch
    if tile not in TILES or any(v < 16 or v & (v - 1) for v in (block_n, block_k)) or warps not in (1, 2, 4, 8) \
            or not 1 <= stages <= 8:
        raise ValueError(f"{launch!r}: tile rows one of {TILES}; block_n, block_k powers of 2 >= 16; warps 1 to 8, "
                         "a power of 2; stages 1 to 8")
    if not keeps_sums(shape[1], config, tuple(launch)):
        raise ValueError(f"{launch!r} does not keep the sums of {config!r} (a tensor-core configuration whose "
                         "split-K chunks its block_k tiles)")
    return shape, config, row_class, tuple(launch)


def _config(value, split: bool) -> tuple:
    """A configuration from JSON, checked: what the kernel can compile."""
    if not isinstance(value, list) or len(value) not in ((5, 6) if split else (5,)):
        raise ValueError(f"a configuration is [dot, block_n, block_k, warps, stages{', chunks' if split else ''}], "
                         f"not {value!r}")
    dot, block_n, block_k, warps, stages, *chunks = value
    powers = (block_n, block_k, warps)
    if not isinstance(dot, bool) or not all(isinstance(v, int) and v > 0 and v & (v - 1) == 0 for v in powers):
        raise ValueError(f"{value!r}: dot is true or false; block_n, block_k and warps are powers of 2")
    if (dot and (block_n < 16 or block_k < 16)) or not 1 <= stages <= 8 or any(c < 1 for c in chunks):
        raise ValueError(f"{value!r}: tensor-core tiles need block_n, block_k >= 16; 1 <= stages <= 8; chunks >= 1")
    if not dot and (stages != 1 or any(c > 1 for c in chunks)):
        raise ValueError(f"{value!r}: matrix-vector configurations (dot false) take stages 1 and no split-K chunks")
    return tuple(value)


@functools.cache
def packaged() -> LinearTable:
    """The package's table (over the rules)."""
    table = load(PACKAGED)
    return LinearTable(table.entries, "package", table.drafts, launches=table.launches)


def tables_dir(folder: str = "") -> Path:
    """Where `specgen tune-kernels` writes and runs read tuned tables: the profile's [kernels]
    tables, else specgen's folder in the user's cache directory."""
    if folder:
        return Path(folder).expanduser()
    from specgen.core.measured import user_cache

    return user_cache() / "kernels"


def for_run(folder: str = "") -> LinearTable:
    """The table a run uses: the tuned one in tables_dir(folder) over the package's, or the package's."""
    path = tables_dir(folder) / FILE
    if not path.is_file():
        return packaged()
    return load(path).over(packaged())
