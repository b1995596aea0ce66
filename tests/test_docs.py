"""The docs stay true to the repository.

Every repository path a doc names exists (README.md, docs/, benchmarks/*.md, the profiles'
comments, and the comments and docstrings under src/specgen/), every Markdown link's target and
anchor resolve, every section of docs/benchmarks.md a doc cites by its heading is one of that
file's headings (or, cited as `git show REV:docs/benchmarks.md`, of that past version),
benchmarks/README.md names exactly the scripts in benchmarks/, and docs/architecture.md's table
names every module of src/specgen/. Text only (no specgen import, no model), so that it belongs in
the quick subset.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "specgen"
BENCHMARKS_DOC = "docs/benchmarks.md"
# Paths written relative to src/specgen/, as the docs and docstrings write module paths.
PACKAGE_DIRS = ("core", "gpu", "cli", "builtin")
TOP_DIRS = ("src", "docs", "tests", "benchmarks", "profiles")

# A path starts a word (not inside a URL, `.pairs/bench/...`, `/tmp/...` or `~/...`); it may hold
# glob characters and one {a,b} alternation, and a #fragment.
PATH = re.compile(
    r"(?<![\w./~$-])((?:%s)/[\w.*{},/-]*)(#[\w-]+)?" % "|".join(TOP_DIRS + PACKAGE_DIRS)
)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
# docs/benchmarks.md, "Heading" | docs/benchmarks.md "Heading" | docs/benchmarks.md ("Heading")
# | docs/benchmarks.md, section "Heading"; with `git show REV:` in front, a past version.
SECTION = re.compile(
    r"(?:git show ([\w^~]+):)?(?<![\w/])docs/benchmarks\.md`?,?\s*\(?\s*(?:section\s+)?\"([^\"]+)\""
)
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def doc_files() -> list[Path]:
    return sorted(
        [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("benchmarks/*.md"),
         *REPO.glob("profiles/*.toml"), *PACKAGE.rglob("*.toml"), *PACKAGE.rglob("*.py")]
    )


def headings(markdown: str) -> list[str]:
    """The headings of a Markdown text, outside code fences."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            found.append(match.group(2))
    return found


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings: lower case, punctuation dropped, spaces as hyphens,
    and -1, -2 ... after repeats."""
    seen: dict[str, int] = {}
    result = set()
    for heading in headings(markdown):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def _alternatives(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if match is None:
        return [path]
    return [alt for choice in match.group(1).split(",")
            for alt in _alternatives(path[: match.start()] + choice + path[match.end():])]


def _module_attribute(root: Path, path: str) -> bool:
    """`core/engine.make_backend`: the module exists and defines that name."""
    module, _, name = path.rpartition(".")
    source = root / f"{module}.py"
    if not name.isidentifier() or not source.is_file():
        return False
    return re.search(rf"^(?:def|class)\s+{name}\b|^{name}\s*[:=]", source.read_text(), re.M) is not None


def path_exists(path: str) -> bool:
    root = PACKAGE if path.split("/")[0] in PACKAGE_DIRS else REPO
    if all(any(root.glob(alt)) if "*" in alt else (root / alt).exists() for alt in _alternatives(path)):
        return True
    return "/" in path and "{" not in path and _module_attribute(root, path)


def missing_paths(text: str) -> list[str]:
    """Repository paths named in `text` that do not exist (or whose #anchor is not a heading)."""
    missing = []
    for match in PATH.finditer(text):
        path, fragment = match.group(1).rstrip(".,:;"), match.group(2)
        if not path_exists(path):
            missing.append(path)
        elif fragment and path.endswith(".md") and fragment[1:] not in anchors((REPO / path).read_text()):
            missing.append(path + fragment)
    return missing


def broken_links(text: str, source: Path) -> list[str]:
    """Markdown links whose file does not exist, or whose #anchor is not one of its headings."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, fragment = target.partition("#")
        resolved = (source.parent / file).resolve() if file else source
        if not resolved.exists():
            broken.append(target)
        elif fragment and (resolved.suffix != ".md" or fragment not in anchors(resolved.read_text())):
            broken.append(target)
    return broken


def _flat(text: str) -> str:
    """One line: a citation may wrap, in Markdown or in `#` comments."""
    return re.sub(r"\s*\n\s*#*\s*", " ", text)


def cited_sections(text: str) -> list[tuple[str | None, str]]:
    """(revision or None for the current file, heading) for each docs/benchmarks.md section cited."""
    return [(match.group(1), match.group(2)) for match in SECTION.finditer(_flat(text))]


def past_headings(revision: str) -> list[str] | None:
    """docs/benchmarks.md's headings at `revision`; None when git has no such revision or file."""
    shown = subprocess.run(["git", "show", f"{revision}:{BENCHMARKS_DOC}"], cwd=REPO,
                           capture_output=True, text=True, timeout=30)
    return headings(shown.stdout) if shown.returncode == 0 else None


def _has_git_history() -> bool:
    try:
        inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO,
                                capture_output=True, text=True, timeout=30)
    except OSError:  # no git
        return False
    return inside.returncode == 0 and (REPO / ".git").exists()


def _where(file: Path) -> str:
    return str(file.relative_to(REPO))


# ---------------------------------------------------------------- the repository's docs


def test_paths_named_in_docs_exist():
    missing = [f"{_where(file)}: {path}" for file in doc_files()
               for path in missing_paths(file.read_text())]
    assert not missing, "paths named in docs that do not exist:\n" + "\n".join(missing)


def test_markdown_links_resolve():
    broken = [f"{_where(file)}: {link}" for file in doc_files() if file.suffix == ".md"
              for link in broken_links(file.read_text(), file)]
    assert not broken, "links whose file or heading does not exist:\n" + "\n".join(broken)


def test_cited_benchmark_sections_are_headings():
    current = set(headings((REPO / BENCHMARKS_DOC).read_text()))
    cited = [(file, revision, section) for file in doc_files()
             for revision, section in cited_sections(file.read_text())]
    assert any(revision is None for _, revision, _ in cited)  # the pattern still matches how docs cite
    stale = [f"{_where(file)}: \"{section}\"" for file, revision, section in cited
             if revision is None and section not in current]
    assert not stale, f"sections of {BENCHMARKS_DOC} cited but not among its headings:\n" + "\n".join(stale)


def test_cited_past_benchmark_sections_exist_at_their_revision():
    cited = [(file, revision, section) for file in doc_files()
             for revision, section in cited_sections(file.read_text()) if revision is not None]
    if not _has_git_history():
        pytest.skip("needs the project's git history (a git checkout)")
    assert past_headings("ec511de")[:2] == ["Benchmarks", "GPU fast path"]  # the file before issue 20
    assert past_headings("0000000") is None
    past = {revision: past_headings(revision) for _, revision, _ in cited}
    stale = [f"{_where(file)}: {revision}: \"{section}\"" for file, revision, section in cited
             if past[revision] is None or section not in past[revision]]
    assert not stale, "sections cited from past versions that those versions lack:\n" + "\n".join(stale)


def test_benchmarks_readme_names_exactly_the_scripts_in_benchmarks():
    """Each script with its command (`python benchmarks/x.py ...`), and no script that is gone: a
    bare name (`x.py`) must be one of them too; names under other folders are paths, checked above."""
    scripts = {path.name for path in (REPO / "benchmarks").iterdir() if path.suffix in (".py", ".sh")}
    text = (REPO / "benchmarks" / "README.md").read_text()
    with_command = set(re.findall(r"(?<![\w/.-])(?:python|bash) benchmarks/([\w-]+\.(?:py|sh))\b", text))
    named = set(re.findall(r"(?<![\w/.-])(?:benchmarks/)?([\w-]+\.(?:py|sh))\b", text))
    assert scripts and with_command == scripts and named == scripts


def unlisted_modules(text: str) -> list[str]:
    """Modules of src/specgen/ that `text` does not name by their path in the package; a folder's
    __init__.py is left to the sentence that covers them all."""
    modules = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                     if path.name != "__init__.py" or path.parent == PACKAGE)
    return [module for module in modules if not re.search(rf"(?<![\w/]){re.escape(module)}(?!\w)", text)]


def test_architecture_lists_every_module():
    missing = unlisted_modules((REPO / "docs" / "architecture.md").read_text())
    assert not missing, "modules missing from docs/architecture.md's table:\n" + "\n".join(missing)


# ---------------------------------------------------------------- the checks themselves


def test_the_checks_catch_what_they_are_for(tmp_path):
    assert missing_paths("see gpu/loop.py and `benchmarks/bench_e2e.py`, src/specgen/core/round/round.py") == \
        ["gpu/loop.py", "benchmarks/bench_e2e.py"]
    assert missing_paths("core/engine.make_backend, core/engine.nothing") == ["core/engine.nothing"]
    assert missing_paths("benchmarks/results/proposers-cpu/bench_draft_{1,2,9}.json") != []
    assert missing_paths("docs/benchmarks.md#claims docs/benchmarks.md#split-k") == \
        ["docs/benchmarks.md#split-k"]
    assert missing_paths("https://example.org/docs/x.md .pairs/bench/pair.toml /tmp/docs/x") == []
    doc = tmp_path / "x.md"
    doc.write_text("# Split-K (H200)\n```sh\n# not a heading\n```\n"
                   "[a](#split-k-h200) [b](#not-a-heading) [c](y.md)")
    assert broken_links(doc.read_text(), doc) == ["#not-a-heading", "y.md"]
    (tmp_path / "y.md").write_text("# Y\n")
    assert broken_links(doc.read_text(), doc) == ["#not-a-heading"]
    assert cited_sections('docs/benchmarks.md, "Split-K"; docs/benchmarks.md\n    # ("Proposers")') == \
        [(None, "Split-K"), (None, "Proposers")]
    assert cited_sections('(`git show ec511de:docs/benchmarks.md`, "Fused round")') == \
        [("ec511de", "Fused round")]
    listed = "| x | core/round/round.py, gpu/kernels/warp.py, `__main__.py`, `__init__.py` |"
    assert "core/round/ops.py" in unlisted_modules(listed)
    assert "__init__.py" in unlisted_modules("core/round/__init__.py")  # a folder's is not the package's
    assert not {"core/round/round.py", "gpu/kernels/warp.py", "__main__.py", "__init__.py"} & set(unlisted_modules(listed))
