"""The Python-source corpus that benchmarks/make_pair.py trains its pairs on.

make_pair reads every `.py` file of the running Python's standard library (plus site-packages for
the `bench` preset), holds out a fixed hash-chosen subset of files for prompts and evaluation, and
trains on the rest. `specgen train-head` reads the same training files for a pair that make_pair
wrote, so a head never sees the pair's held-out files. The split depends on nothing but each
file's path relative to its root, so it is the same on every machine that has the same files.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_BYTES = 512_000  # larger .py files are mostly generated tables


@dataclass(frozen=True)
class CorpusSpec:
    """Which files a preset's corpus holds and which of them it holds out."""

    site_packages: bool
    holdout_mod: int  # a file is held out when sha1(path relative to its root) % this == 0
    train_bytes: int | None  # cap on training text (None = every training file)

    @property
    def holdout_rule(self) -> str:
        return f"sha1(path relative to root) % {self.holdout_mod} == 0"


# make_pair's presets, by name (their report.json's "preset")
PAIR_CORPORA = {
    "micro": CorpusSpec(site_packages=False, holdout_mod=100, train_bytes=500_000),
    "demo": CorpusSpec(site_packages=False, holdout_mod=25, train_bytes=None),
    "bench": CorpusSpec(site_packages=True, holdout_mod=100, train_bytes=200_000_000),
}


@dataclass(frozen=True)
class Data:
    """The texts a head trains on and is measured on, and how they were chosen (train-head)."""

    train: list[str]
    heldout: list[str]
    description: str


@dataclass(frozen=True)
class SourceFile:
    root: str  # "stdlib" | "site-packages"
    rel: str  # posix path relative to that root: what the held-out hash is taken of
    path: Path

    @property
    def source(self) -> str:
        return f"{self.root}/{self.rel}"

    @property
    def key(self) -> int:
        return int(hashlib.sha1(self.rel.encode("utf-8")).hexdigest(), 16)


def is_held_out(rel: str, mod: int) -> bool:
    """The same answer on any machine: the hash of the path relative to its corpus root."""
    return int(hashlib.sha1(rel.encode("utf-8")).hexdigest(), 16) % mod == 0


def split(files: list[SourceFile], mod: int) -> tuple[list[SourceFile], list[SourceFile]]:
    """(training files in hash order, held-out files in path order)."""
    held = [f for f in files if is_held_out(f.rel, mod)]
    train = [f for f in files if not is_held_out(f.rel, mod)]
    return sorted(train, key=lambda f: f.key), held


def corpus_roots(site_packages: bool, stdlib: Path | None) -> list[tuple[str, Path]]:
    paths = sysconfig.get_paths()
    roots = [("stdlib", stdlib or Path(paths["stdlib"]))]
    if site_packages:
        for site in dict.fromkeys([paths["purelib"], paths["platlib"]]):
            roots.append(("site-packages", Path(site)))
    return roots


def list_files(roots: list[tuple[str, Path]]) -> list[SourceFile]:
    """Every non-empty .py file under the roots, sorted; site-packages inside stdlib is skipped."""
    files = {}
    for label, root in roots:
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if label == "stdlib" and rel.parts[0] in ("site-packages", "dist-packages"):
                continue
            if "__pycache__" in rel.parts or not path.is_file():
                continue
            if 0 < path.stat().st_size <= MAX_FILE_BYTES:
                files.setdefault((label, rel.as_posix()), path)
    return [SourceFile(label, rel, path) for (label, rel), path in sorted(files.items())]


def read_texts(files: list[SourceFile], cap: int | None) -> list[tuple[SourceFile, str]]:
    """UTF-8 texts of the files in order, until `cap` bytes; undecodable files are skipped."""
    out, total = [], 0
    for file in files:
        if cap is not None and total >= cap:
            break
        try:
            text = file.path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append((file, text))
        total += len(text)
    return out


def pair_texts(spec: CorpusSpec, stdlib: Path | None = None) -> tuple[list[str], list[str], str]:
    """(training texts, held-out texts, description) of a make_pair preset's corpus on this
    machine: the training files in hash order up to the preset's cap, as make_pair trains on them."""
    roots = corpus_roots(spec.site_packages, stdlib)
    train_files, held = split(list_files(roots), spec.holdout_mod)
    train = [text for _, text in read_texts(train_files, spec.train_bytes)]
    heldout = [text for _, text in sorted(read_texts(held, None), key=lambda pair: pair[0].key)]
    where = " and ".join(str(root) for _, root in roots)
    return train, heldout, (f"{len(train)} training files of {where} (make_pair's split; "
                            f"{len(heldout)} held out by {spec.holdout_rule})")


# ---------------------------------------------------------------- a user's data (--data)

DATA_HOLDOUT_MOD = 20  # --data: a document is held out when the sha1 of its name % this == 0
DATA_TAIL = 0.05  # --data with too few documents for that: the end of the last one is held out
# A file of --data is read whole: larger ones are better split into a folder of files, and a
# stream without end (`--data /dev/zero`) stops here instead of filling memory.
DATA_FILE_LIMIT = 2**30


def read_data(path: Path, limit: int = DATA_FILE_LIMIT) -> tuple[list[str], list[str], str]:
    """(training texts, held-out texts, description) of --data: a text file, a folder of text
    files (every UTF-8 file under it; others are skipped), or JSONL (*.jsonl) with a "text" or
    "prompt" field per line. A document is held out by the hash of its name (the folder's
    relative path, or the JSONL line number), as make_pair holds out files; where that leaves
    either side empty (one file, a few documents), the last 5% of the last document is held out
    instead. A file over `limit` bytes is refused. Raises UsageError for what the user must fix."""
    from specgen.core.errors import UsageError

    if not path.exists():
        raise UsageError(f"--data {path} not found", hint="give a text file, a folder of text files, or JSONL")
    if path.is_dir():
        docs = _folder_documents(path, limit)
        kind = f"{len(docs)} text files under {path}"
    elif path.suffix.lower() == ".jsonl":
        docs = _jsonl_documents(path, limit)
        kind = f"{len(docs)} records of {path}"
    else:
        docs = [(path.name, _text_file(path, limit))]
        kind = f"text file {path}"
    docs = [(name, text) for name, text in docs if text.strip()]
    if not docs:
        raise UsageError(f"--data {path} holds no text", hint="give a text file, a folder of text files, or JSONL")
    train = [text for name, text in docs if not is_held_out(name, DATA_HOLDOUT_MOD)]
    held = [text for name, text in docs if is_held_out(name, DATA_HOLDOUT_MOD)]
    if train and held:
        return train, held, f"{kind} ({len(held)} held out by sha1(name) % {DATA_HOLDOUT_MOD} == 0)"
    texts = train or held  # too few documents for the hash to hold any out (or to leave any in)
    cut = int(len(texts[-1]) * (1 - DATA_TAIL))
    return texts[:-1] + [texts[-1][:cut]], [texts[-1][cut:]], f"{kind} (the last {DATA_TAIL:.0%} held out)"


def _text_file(path: Path, limit: int) -> str:
    from specgen.core.errors import UsageError

    try:
        return _read_bounded(path, limit).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--data {path} is not UTF-8 text (byte {exc.start})",
                         hint="convert it with iconv, or give a folder of text files") from None
    except OSError as exc:
        raise UsageError(f"cannot read --data {path}: {exc.strerror}") from None


def _read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes; UsageError past `limit` (checked by its size first where it has one)."""
    import os

    from specgen.core.errors import UsageError

    with path.open("rb") as file:
        too_large = os.fstat(file.fileno()).st_size > limit
        raw = b"" if too_large else file.read(limit + 1)
    if too_large or len(raw) > limit:
        raise UsageError(f"--data {path} holds more than {_size(limit)}, more than train-head reads from one file",
                         hint="give a part of it, or a folder of smaller files")
    return raw


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count} bytes"


def _folder_documents(folder: Path, limit: int) -> list[tuple[str, str]]:
    docs = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue
        try:
            docs.append((path.relative_to(folder).as_posix(), _read_bounded(path, limit).decode("utf-8")))
        except (UnicodeDecodeError, OSError):
            continue  # binary files of the folder
    return docs


def _jsonl_documents(path: Path, limit: int) -> list[tuple[str, str]]:
    import json

    from specgen.core.errors import UsageError

    docs = []
    for number, line in enumerate(_text_file(path, limit).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
        text = record.get("text", record.get("prompt")) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise UsageError(f"{path}:{number}: a JSON line needs a string field 'text' or 'prompt'")
        docs.append((str(number), text))
    return docs


def pair_corpus(target_path: str) -> tuple[CorpusSpec, Path | None] | None:
    """(corpus, stdlib folder) when the target is a pair that benchmarks/make_pair.py wrote: its
    folder's parent holds make_pair's report.json naming a preset. The stdlib folder is the one
    its command named (--stdlib), where it exists on this machine; else None (the running
    Python's). None when the target is no such pair."""
    import json
    import shlex

    report_path = Path(target_path).parent / "report.json"
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or report.get("preset") not in PAIR_CORPORA or "corpus" not in report:
        return None
    words = shlex.split(str(report.get("command", "")))
    stdlib = Path(words[words.index("--stdlib") + 1]) if "--stdlib" in words[:-1] else None
    return PAIR_CORPORA[report["preset"]], stdlib if stdlib is not None and stdlib.is_dir() else None
