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
