"""`specgen inspect-acceptance` and the insight decoder on tiny random models."""

from __future__ import annotations

import json
import re
import sys
from html import escape
from html.parser import HTMLParser

import pytest

from specgen.core.events import Finished
from specgen.core.engine import Engine
from specgen.core.profile import load_profile
from tiny_models import build_pair, write_profile

PROMPTS = ["def add(a, b):", "import os"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    target, draft = build_pair(root, noisy=0.1)
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    return write_profile(root / "tiny.toml", target, draft, sampling={"ignore_eos": True})


@pytest.fixture(scope="module")
def engine(tiny):
    return Engine(load_profile(str(tiny), {"sampling.max_tokens": 20}))


def run(decoder, ids):
    events = list(decoder.run(ids))
    assert isinstance(events[-1], Finished)
    return events[:-1], events[-1]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_insight_changes_nothing_but_adds_p_q_entropy(engine, temperature):
    from dataclasses import replace

    profile = replace(engine.profile, sampling=replace(engine.profile.sampling, temperature=temperature, seed=3))
    ids = engine.encode(PROMPTS[0])
    plain_rounds, plain = run(engine.decoder(profile), ids)
    rounds, finished = run(engine.decoder(profile, insight=True), ids)
    assert finished.token_ids == plain.token_ids  # insight draws no randomness and changes no decision
    for event in plain_rounds:
        assert event.target_entropy is None
        if temperature == 0:
            assert event.target_p is None and event.draft_q is None  # the normal greedy path computes none
    for event in [e for e in rounds if e.num_drafted]:  # the last round may draft none (max_tokens)
        n = event.num_drafted
        assert len(event.target_p) == len(event.draft_q) == len(event.target_entropy) == n
        assert all(0.0 <= v <= 1.0 for v in event.target_p + event.draft_q)
        assert all(e >= -1e-6 for e in event.target_entropy)


def inspect_json(cli, *args):
    code, out, err = cli("inspect-acceptance", *args, "--format", "json")
    assert code == 0, err
    assert out.count("\n") == 1  # one JSON document, nothing else on stdout
    return json.loads(out)


def check_counts(document):
    """accepted + recovered + bonus = generated tokens; per-position counts agree with the rounds."""
    totals, fates = document["totals"], document["fates"]
    assert fates["accepted"] + fates["recovered"] + fates["bonus"] == totals["generated_tokens"]
    assert totals["generated_tokens"] == sum(len(r["token_ids"]) for r in document["runs"])
    rounds = [r for run in document["runs"] for r in run["rounds"]]
    assert totals["rounds"] == len(rounds)
    assert totals["drafted"] == sum(len(r["drafted_ids"]) for r in rounds)
    assert totals["accepted"] == fates["accepted"] == sum(r["num_accepted"] for r in rounds)
    positions = document["per_position"]
    for row in positions:
        i = row["position"] - 1
        assert row["drafted"] == sum(len(r["drafted_ids"]) > i for r in rounds)
        assert row["accepted"] == sum(r["num_accepted"] > i for r in rounds)
    assert sum(row["drafted"] for row in positions) == totals["drafted"]
    rejections = sum(r["num_accepted"] < len(r["drafted_ids"]) and len(r["token_ids"]) > r["num_accepted"]
                     for r in rounds)
    assert sum(entry["count"] for entry in document["rejected"]) <= rejections  # only the top N are listed
    for run in document["runs"]:
        assert len(run["fates"]) == len(run["token_ids"]) == len(run["pieces"])
        assert [t for r in run["rounds"] for t in r["token_ids"]] == run["token_ids"]


@pytest.mark.parametrize("temperature", ["0", "0.9"])
def test_counts_add_up(cli, tiny, temperature):
    document = inspect_json(cli, "-p", tiny, "--prompts", tiny.parent / "prompts.txt", "-n", "20", "-t",
                            temperature, "--seed", "1", "--top", "1000")
    check_counts(document)
    assert document["source"]["temperature"] == float(temperature)
    assert document["source"]["proposer"] == "draft"
    assert len(document["runs"]) == 2 and document["totals"]["generated_tokens"] == 40
    rounds_k = [r["k_used"] for run in document["runs"] for r in run["rounds"]]
    assert document["totals"]["mean_k"] == pytest.approx(sum(rounds_k) / len(rounds_k))
    assert document["totals"]["early_stops"] == sum(r["early_stop"] for run in document["runs"] for r in run["rounds"])
    assert document["has_probabilities"]
    rounds = [r for run in document["runs"] for r in run["rounds"]]
    rejections = sum(r["num_accepted"] < len(r["drafted_ids"]) and len(r["token_ids"]) > r["num_accepted"]
                     for r in rounds)
    assert sum(entry["count"] for entry in document["rejected"]) == rejections == document["fates"]["recovered"]
    for entry in document["rejected"]:
        assert 0.0 <= entry["mean_p"] <= 1.0 and 0.0 <= entry["mean_q"] <= 1.0
        assert entry["examples"] and all(e["target_token_id"] != entry["token_id"] for e in entry["examples"])
    bins = document["entropy"]
    verified = sum(b["verified"] for b in bins)
    assert verified == document["fates"]["accepted"] + rejections
    assert sum(b["accepted"] for b in bins) == document["fates"]["accepted"]


def test_text_report(cli, tiny):
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "12", "def add(a, b):")
    assert code == 0, err
    for heading in ("prompt 1", "Per-position acceptance", "Most rejected draft tokens",
                    "Acceptance by target entropy", "12 tokens = "):
        assert heading in out
    assert "\x1b[" not in out  # stdout is not a terminal here


class Checker(HTMLParser):
    """Balanced tags, and every tag and attribute that could pull in something from outside."""

    VOID = {"meta", "br", "hr", "img", "link", "input"}

    def __init__(self):
        super().__init__()
        self.stack, self.tags, self.urls, self.styles = [], set(), [], []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag not in self.VOID:
            self.stack.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "action", "srcset") or "url(" in (value or ""):
                self.urls.append(value)

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"unbalanced </{tag}>"

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "style":
            self.styles.append(data)


def test_exports_json_and_self_contained_html(cli, tiny, tmp_path):
    html_path, json_path = tmp_path / "report.html", tmp_path / "report.json"
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "16", "--export", html_path, "x = [1, 2]")
    assert code == 0, err
    page = html_path.read_text()
    checker = Checker()
    checker.feed(page)
    checker.close()
    assert checker.stack == []
    assert checker.tags >= {"html", "head", "style", "body", "table", "pre", "span"}
    assert not checker.tags & {"script", "link", "img", "iframe"}
    assert checker.urls == []
    assert "http://" not in page and "https://" not in page
    assert not any("@import" in css or "url(" in css for css in checker.styles)
    assert 'class="accepted"' in page and "Per-position acceptance" in page
    document = inspect_json(cli, "-p", tiny, "-n", "16", "--export", json_path, "x = [1, 2]")
    assert json.loads(json_path.read_text()) == document
    check_counts(document)


def test_token_tree_report(cli, tiny, tmp_path):
    """A tree run: the JSON's `tree` (tokens per round against the chain inside the tree, per
    depth), each round's `branch` and `tree`; the text report's table; the HTML draws each round's
    tree with its accepted path highlighted."""
    html_path = tmp_path / "tree.html"
    args = ("-p", tiny, "-n", "16", "--k", "3", "--tree-width", "2", "--tree-nodes", "5", "def add(a, b):")
    document = inspect_json(cli, *args, "--export", html_path)
    check_counts(document)
    assert (document["source"]["tree_width"], document["source"]["tree_nodes"]) == (2, 5)
    tree, totals = document["tree"], document["totals"]
    rounds = document["runs"][0]["rounds"]
    assert tree["rounds"] == totals["rounds"] == len(rounds)
    assert tree["tokens_per_round"] * tree["rounds"] == pytest.approx(totals["generated_tokens"])
    assert tree["gain_per_round"] == pytest.approx(tree["tokens_per_round"] - tree["chain_tokens_per_round"])
    assert sum(d["reached"] for d in tree["per_depth"]) == totals["accepted"]
    assert tree["line"].startswith("tree +") and "over its chain" in tree["line"]
    for r in rounds:
        assert len(r["branch"]) == r["num_accepted"]
        view = r["tree"]
        assert len(view["tokens"]) == len(view["parents"]) == len(view["p"]) == len(view["q"]) == 6
        assert [view["tokens"][row] for row in view["path"]] == r["token_ids"][: len(view["path"])]
        assert [view["ranks"][row] for row in view["path"]] == r["branch"][: len(view["path"])]
    page = html_path.read_text()
    checker = Checker()
    checker.feed(page)
    checker.close()
    assert checker.stack == [] and checker.urls == [] and not checker.tags & {"script", "link", "img"}
    assert "Token tree against its chain" in page
    i, known = max(enumerate(rounds), key=lambda item: len(item[1]["tree"]["path"]))
    assert known["tree"]["path"], "no round accepted a node: pick another prompt"
    block = page.split(f'<details class="round"><summary>round {i + 1}: ')[1].split("</details>")[0]
    highlighted = re.findall(r'class="node path" data-row="(\d+)"', block)
    assert sorted(map(int, highlighted)) == [0] + sorted(known["tree"]["path"])
    code, out, err = cli("inspect-acceptance", *args)
    assert code == 0, err
    assert "Token tree against its chain" in out and "branch" in out  # a narrow terminal wraps headers
    won = [f"{i + 1} ({'·'.join(map(str, r['branch']))})" for i, r in enumerate(rounds) if any(r["branch"])]
    assert "rounds a branch won (sibling per depth): " + (", ".join(won) or "none") in out.replace("\n", " ")
    # not a hybrid run: nothing of the lookup's nodes anywhere
    assert "hybrid" not in tree and "lookup" not in tree["line"] and "Hybrid tree" not in out
    assert all("source" not in r and "lookup_nodes" not in r for r in rounds)
    assert ".node.lookup" not in page and "node lookup" not in page


def test_hybrid_token_tree_report(cli, tiny, tmp_path):
    """A hybrid tree run: each round says whose nodes its accepted path took (the lookup's rows
    1 .. lookup_nodes of its tree, or the model's), the JSON's tree.hybrid adds them up, the text
    report shows its table, and the HTML outlines exactly the lookup's nodes of each round's tree."""
    html_path = tmp_path / "hybrid.html"
    args = ("-p", tiny, "-n", "30", "--k", "3", "--proposer", "hybrid", "--tree-width", "3", "--tree-nodes", "8",
            "a a a a a a a a")  # repetitive: the lookup finds tries
    document = inspect_json(cli, *args, "--export", html_path)
    check_counts(document)
    tree, totals = document["tree"], document["totals"]
    hybrid, rounds = tree["hybrid"], document["runs"][0]["rounds"]
    for r in rounds:
        path = r["tree"]["path"]
        want = "none" if not r["num_accepted"] else \
            "lookup" if path and path[0] <= r["lookup_nodes"] else "model"
        assert r["source"] == want
    merged = [i for i, r in enumerate(rounds) if r["lookup_nodes"]]
    assert merged and hybrid["merged_rounds"] == len(merged) and hybrid["rounds"] == len(rounds)
    for part in ("lookup", "model"):
        mine = [r for r in rounds if r["source"] == part]
        assert hybrid[part]["rounds"] == len(mine)
        assert hybrid[part]["accepted"] == sum(r["num_accepted"] for r in mine)
    assert hybrid["none"] == sum(r["source"] == "none" for r in rounds)
    assert hybrid["lookup"]["accepted"] + hybrid["model"]["accepted"] == totals["accepted"]
    assert tree["line"].endswith(f"lookup {hybrid['lookup']['share']:.0%} of accepted")
    page = html_path.read_text()
    for i in merged:
        block = page.split(f'<details class="round"><summary>round {i + 1}: ')[1].split("</details>")[0]
        assert f"· path: {rounds[i]['source']}</summary>" in block
        outlined = re.findall(r'class="node(?: path)? lookup" data-row="(\d+)"', block)
        assert sorted(map(int, outlined)) == list(range(1, rounds[i]["lookup_nodes"] + 1))
    assert "Hybrid tree: whose nodes the accepted path took" in page
    code, out, err = cli("inspect-acceptance", *args)
    assert code == 0, err
    assert "Hybrid tree: whose nodes the accepted path took" in out.replace("\n", " ")
    depths = " · ".join(f"{d['depth']}: {d['lookup']}/{d['model']}" for d in hybrid["per_depth"])
    assert f"through the lookup's/the model's nodes: {depths}" in out.replace("\n", " ")


def test_a_chain_run_has_no_tree(cli, tiny):
    document = inspect_json(cli, "-p", tiny, "-n", "8", "x = 1")
    assert document["tree"] is None and document["source"]["tree_width"] == 1
    assert all(r["branch"] is None and r["tree"] is None for r in document["runs"][0]["rounds"])


def test_png_export(cli, tiny, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plot.png"
    code, _, err = cli("inspect-acceptance", "-p", tiny, "-n", "8", "--export", path, "def f():")
    assert code == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_export_without_matplotlib(cli, tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    path = tmp_path / "plot.png"
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "4", "--export", path, "def f():")
    assert code == 1 and out == "" and not path.exists()
    assert err.count("\n") == 1
    assert "matplotlib" in err and "pip install 'specgen[plot]'" in err


def test_bad_export_and_sources(cli, tiny, tmp_path):
    code, _, err = cli("inspect-acceptance", "-p", tiny, "--export", tmp_path / "x.svg", "hi")
    assert code == 2 and ".json, .html or .png" in err
    code, _, err = cli("inspect-acceptance", "--bench", tmp_path / "missing.json", "hi")
    assert code == 2 and "not several" in err
    (tmp_path / "other.json").write_text('{"schema": "something"}')
    code, _, err = cli("inspect-acceptance", "--bench", tmp_path / "other.json")
    assert code == 2 and "not the JSON of `specgen bench" in err


def test_from_bench_records(cli, tiny, tmp_path):
    code, out, err = cli("bench", "-p", tiny, "--prompts", tiny.parent / "prompts.txt", "--k", "2,3", "-n", "10",
                         "--warmup", "0", "--records", "--format", "json", "-q")
    assert code == 0, err
    bench = tmp_path / "bench.json"
    bench.write_text(out)
    document = inspect_json(cli, "--bench", bench, "--k", "3", "--top", "1000")
    assert document["source"] == {"kind": "bench", "file": str(bench), "profile": "tiny", "k": 3,
                                  "temperature": 0.0}
    check_counts(document)
    result = next(r for r in json.loads(out)["results"] if r["k"] == 3)
    assert document["totals"]["acceptance_rate"] == pytest.approx(result["acceptance_rate"])
    assert [row["rate"] for row in document["per_position"]] == pytest.approx(result["per_position_acceptance"])
    assert not document["has_probabilities"] and document["entropy"] == []
    default = inspect_json(cli, "--bench", bench)  # the recommended k
    assert default["source"]["k"] == json.loads(out)["recommendation"][0]["k"]
    code, _, err = cli("inspect-acceptance", "--bench", bench, "--k", "5")
    assert code == 2 and "no result for k=5" in err and "k=2 T=0" in err
    code, out, err = cli("bench", "-p", tiny, "--prompts", tiny.parent / "prompts.txt", "--k", "2", "-n", "4",
                         "--warmup", "0", "--format", "json", "-q")
    bench.write_text(out)
    code, _, err = cli("inspect-acceptance", "--bench", bench)
    assert code == 2 and "--records" in err


# ---------------------------------------------------------------- exports that cannot be written


@pytest.fixture
def unloadable(tmp_path):
    """A profile whose target does not exist: loading it fails with exit 1 and 'not found', so an error
    about --export proves the destination was checked before any model loads."""
    return write_profile(tmp_path / "unloadable.toml", tmp_path / "no-target", None)


def _cannot_create_in(folder):
    import tempfile

    real = tempfile.TemporaryFile

    def temporary_file(*args, dir=None, **kwargs):
        if dir is not None and str(dir) == str(folder):
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    return temporary_file


@pytest.mark.parametrize("case", ["missing directory", "a directory", "not a regular file", "parent is a file",
                                  "read-only directory", "png without matplotlib"])
def test_export_destination_is_checked_before_loading(cli, unloadable, tmp_path, monkeypatch, case):
    import os
    import tempfile

    path, code, fragment = tmp_path / "report.html", 2, None
    if case == "missing directory":
        path, fragment = tmp_path / "nowhere" / "report.html", "does not exist"
    elif case == "a directory":
        path.mkdir()
        fragment = "is a directory"
    elif case == "not a regular file":  # like /dev/full: writes would fail only at the end
        os.mkfifo(path)
        fragment = "is not a regular file"
    elif case == "parent is a file":
        (tmp_path / "file").write_text("")
        path, fragment = tmp_path / "file" / "report.html", "is not a directory"
    elif case == "read-only directory":  # simulated: the tests may run as root, whom permissions do not stop
        monkeypatch.setattr(tempfile, "TemporaryFile", _cannot_create_in(tmp_path))
        fragment = "cannot create a file in"
    else:
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
        path, code, fragment = tmp_path / "plot.png", 1, "pip install 'specgen[plot]'"
    out_code, out, err = cli("inspect-acceptance", "-p", unloadable, "--export", path, "def f():")
    assert (out_code, out) == (code, ""), err
    assert err.startswith("specgen: error: ") and fragment in err and "not found" not in err
    assert "Traceback" not in err and len(err.splitlines()) <= 2


@pytest.mark.parametrize("output_format", ["text", "json"])
def test_export_failing_at_write_time_keeps_the_report_on_stdout(cli, tiny, tmp_path, monkeypatch, output_format):
    from pathlib import Path

    path = tmp_path / "report.html"
    path.write_text("an earlier report")
    real_write_text = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.parent == tmp_path:
            real_write_text(self, "half a rep")  # the disk fills up midway
            raise OSError(28, "No space left on device")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "8", "--export", path, "--format", output_format,
                         "def f():")
    assert code == 1
    assert err.splitlines() == [f"specgen: error: cannot write --export {path}: No space left on device",
                                "hint: free some space or choose another --export path; the report is on stdout"]
    if output_format == "json":
        check_counts(json.loads(out))
    else:
        assert "Per-position acceptance" in out and "8 tokens = " in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no half-written file left
    assert path.read_text() == "an earlier report"


# ---------------------------------------------------------------- prompts that do not fit


LONG = " ".join(str(i) for i in range(600))  # over the tiny models' 512 positions


def test_a_long_prompt_in_the_file_names_its_line_before_anything_runs(cli, tiny, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"def add(a, b):\n\n{LONG}\nimport os\n")
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "8", "--prompts", prompts, "--format", "json")
    assert (code, out) == (2, "")
    assert err.startswith(f"specgen: error: {prompts}:3: the prompt has ") and "--skip-long-prompts" in err
    document = inspect_json(cli, "-p", tiny, "-n", "8", "--prompts", prompts, "--skip-long-prompts")
    assert [run["prompt"] for run in document["runs"]] == ["def add(a, b):", "import os"]
    check_counts(document)


# ---------------------------------------------------------------- Ctrl-C


def test_ctrl_c_reports_what_finished_marked_incomplete(cli, tiny, monkeypatch):
    from cli_helpers import count_forwards

    with monkeypatch.context() as patch:  # how many forwards the first prompt takes
        calls = count_forwards(patch)
        inspect_json(cli, "-p", tiny, "-n", "20", PROMPTS[0])
    count_forwards(monkeypatch, interrupt_at=len(calls) + 16)  # a few rounds into the second prompt (rounds run one ahead)
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "20", "--prompts", tiny.parent / "prompts.txt",
                         "--format", "json")
    assert code == 130, err
    document = json.loads(out)
    assert document["incomplete"] is True
    assert document["runs"][0]["prompt"] == PROMPTS[0] and len(document["runs"][0]["token_ids"]) == 20
    assert len(document["runs"]) == 2 and 0 < len(document["runs"][1]["token_ids"]) < 20
    check_counts(document)


# ---------------------------------------------------------------- generate's options


def test_stop_min_tokens_and_stop_token_ids(cli, tiny):
    first = inspect_json(cli, "-p", tiny, "-n", "20", PROMPTS[0])["runs"][0]
    stop = first["text"][len(first["text"]) // 2:][:3]
    cut = first["text"].index(stop)
    stopped = inspect_json(cli, "-p", tiny, "-n", "20", "--stop", stop, PROMPTS[0])["runs"][0]
    assert stopped["text"] == first["text"][:cut]
    token = str(first["token_ids"][0])
    stopped = inspect_json(cli, "-p", tiny, "-n", "20", "--stop-token-id", token, PROMPTS[0])
    assert len(stopped["runs"][0]["token_ids"]) == 1
    held = inspect_json(cli, "-p", tiny, "-n", "20", "--stop-token-id", token, "--min-tokens", "6", PROMPTS[0])
    assert len(held["runs"][0]["token_ids"]) >= 6


def test_truncate_prompt_and_its_hint(cli, tiny):
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "8", LONG)
    assert (code, out) == (2, "") and "--truncate-prompt" in err
    document = inspect_json(cli, "-p", tiny, "-n", "8", "--k", "2", "--truncate-prompt", LONG)
    run = document["runs"][0]
    assert run["prompt"] == LONG and len(run["token_ids"]) == 8


def test_quiet_threads_and_the_temperature_warning(cli, tiny):
    import torch

    before = torch.get_num_threads()
    try:
        code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "4", "-t", "8", "--seed", "1", "--threads", "2",
                             PROMPTS[0])
        assert code == 0 and err.startswith("specgen: warning: temperature 8 is above 2")
        assert torch.get_num_threads() == 2
        code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "4", "-t", "8", "--seed", "1", "-q", PROMPTS[0])
        assert (code, err) == (0, "")
    finally:
        torch.set_num_threads(before)


def test_chat_and_system_prompt(cli, tmp_path):
    from cli_helpers import add_chat_template

    target, draft = build_pair(tmp_path, noisy=0.1)
    plain = write_profile(tmp_path / "plain.toml", target, draft, sampling={"ignore_eos": True})
    code, out, err = cli("inspect-acceptance", "-p", plain, "-n", "4", "--chat", PROMPTS[0])
    assert code == 2 and "no chat template" in err
    add_chat_template(target, draft)
    document = inspect_json(cli, "-p", plain, "-n", "4", "--system", "be brief", PROMPTS[0])
    assert document["runs"][0]["prompt"] == PROMPTS[0] and len(document["runs"][0]["token_ids"]) == 4


def test_rejected_tokens_that_differ_in_white_space_look_different(cli, tiny, tmp_path):
    """' a' and 'a' in quotes, in the text report and the HTML page, where a token's spaces are kept."""
    from rich.console import Console

    from specgen.cli.inspect import rejected_table

    example = {"target_text": "b", "context": "x = 1\n"}
    document = {"has_probabilities": True, "rejected": [
        {"text": " a", "count": 2, "mean_q": 0.25, "mean_p": 0.125, "examples": [example]},
        {"text": "a", "count": 1, "mean_q": 0.5, "mean_p": 0.0625, "examples": [example]},
        {"text": " return", "count": 1234, "mean_q": 0.5, "mean_p": 0.0625, "examples": [example]}]}
    for width in (100, 50):  # on a narrow terminal only the context gives way
        console = Console(width=width, record=True)
        console.print(rejected_table(document))
        text = console.export_text()
        for whole in ("' a'", "'a'", "'b'", "' return'", "1234", "0.250", "0.125", "0.062"):
            assert whole in text, (width, whole, text)
        assert ("x = 1\\n" in text) == (width == 100)  # the context, with its line break made visible
    html_path = tmp_path / "report.html"
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "16", "--export", html_path, "--top", "1000",
                         "--format", "json", "x = [1, 2]")
    assert code == 0, err
    page = html_path.read_text()
    assert re.search(r"code \{[^}]*white-space: pre;", page)
    for entry in json.loads(out)["rejected"]:
        assert f"<code>{escape(repr(entry['text']))}</code>" in page


# ---------------------------------------------------------------- exports through links, progress, details


def test_export_through_a_symlink_writes_where_it_points(cli, tiny, tmp_path):
    (tmp_path / "reports").mkdir()
    real, link = tmp_path / "reports" / "latest.json", tmp_path / "link.json"
    real.write_text("an earlier report")
    link.symlink_to(real)
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "4", "--export", link, "--format", "json", "def f():")
    assert code == 0, err
    assert link.is_symlink() and json.loads(real.read_text()) == json.loads(out)
    assert err.splitlines()[-1] == f"report written to {link} (→ {real})"
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "4", "--export", tmp_path / "loop.json", "def f():")
    assert code == 2 and "cannot be reached (Too many levels of symbolic links)" in err
    assert (tmp_path / "loop.json").is_symlink()


CURSOR = re.compile(r"\x1b\[\??[0-9;]*[A-HJKSTfhl]|\r")  # cursor moves, erasing, hiding the cursor


@pytest.mark.parametrize("stdout_tty, stderr_tty", [(True, True), (False, True), (True, False)])
def test_progress_while_generating(tiny, monkeypatch, stdout_tty, stderr_tty):
    """On stderr, only when it is a terminal: a status line while stdout is a terminal too, else a
    plain line per prompt, nothing that moves the cursor over what stdout prints there."""
    from cli_helpers import Stream, specgen

    result = specgen(monkeypatch, "inspect-acceptance", "-p", tiny, "-n", "6", "--prompts-file",
                     tiny.parent / "prompts.txt", stdout=Stream(tty=stdout_tty), tty=stderr_tty,
                     env={"TERM": "xterm-256color"})
    assert result.code == 0, result
    if not stderr_tty:
        assert result.stderr == ""
    elif stdout_tty:
        assert "inspecting prompt 2 of 2" in result.stderr
    else:
        assert "inspected prompt 1 of 2: 6 tokens\ninspected prompt 2 of 2: 6 tokens" in render_plain(result.stderr)
        progress = result.stderr[result.stderr.index("inspected prompt 1"):]  # the loading status is generate's
        assert not CURSOR.search(progress), repr(result.stderr)


def render_plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_a_bench_without_the_temperature_says_so_without_none(cli, tiny, tmp_path):
    code, out, err = cli("bench", "-p", tiny, "--prompts", tiny.parent / "prompts.txt", "--k", "2", "-n", "4",
                         "--warmup", "0", "--records", "--format", "json", "-q")
    assert code == 0, err
    (tmp_path / "bench.json").write_text(out)
    code, _, err = cli("inspect-acceptance", "--bench", tmp_path / "bench.json", "-t", "0.5")
    assert code == 2 and "the bench has no result for temperature 0.5" in err and "None" not in err


def test_a_chat_reply_starts_its_own_line(cli, tmp_path):
    from cli_helpers import add_chat_template

    target, draft = build_pair(tmp_path, noisy=0.1)
    add_chat_template(target, draft)
    profile = write_profile(tmp_path / "chat.toml", target, draft, sampling={"ignore_eos": True})
    code, out, err = cli("inspect-acceptance", "-p", profile, "-n", "6", "--chat", "hello there")
    assert code == 0, err
    assert out.splitlines()[1] == "hello there"
    document = inspect_json(cli, "-p", profile, "-n", "6", "--chat", "hello there")
    assert document["source"]["chat"] is True


def test_the_target_choosing_eos_shows_its_name():
    """The pieces leave EOS out (''), so the rejected table takes the token's own text."""
    from types import SimpleNamespace as NS

    from specgen.core.insight import RunRecord, analyse

    class Tokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return {0: "" if skip_special_tokens else "<eos>", 7: "x"}[ids[0]]

    event = NS(drafted_ids=[7, 7], num_accepted=0, token_ids=[0], target_p=[0.1, 0.2], draft_q=[0.5, 0.5],
               target_entropy=[1.0, 1.0], k_used=2, early_stop=False)
    finished = NS(text="", token_ids=[0], fates=[NS(value="recovered")], pieces=[""])
    run = RunRecord.build("p", finished, [event], Tokenizer())
    [entry] = analyse([run])["rejected"]
    assert entry["text"] == "x" and entry["examples"][0]["target_text"] == "<eos>"


def test_html_tooltips_hold_p_q_and_entropy(cli, tiny, tmp_path):
    path = tmp_path / "report.html"
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "16", "--export", path, "--format", "json", "x = 1")
    assert code == 0, err
    page = path.read_text()
    titles = re.findall(r'<span class="(accepted|recovered|bonus)" title="([^"]*)"', page)
    fates = json.loads(out)["runs"][0]["fates"]
    assert [fate for fate, _ in titles] == fates and "recovered" in fates
    for fate, title in titles:
        if fate == "bonus":
            assert title == "bonus"
        else:
            assert re.search(r"p\(x\) target \d\.\d{3} · q\(x\) draft \d\.\d{3}\ntarget entropy \d+\.\d\d nats", title)
            assert ("drafted" in title) == (fate == "recovered")
    assert re.search(r"body \{[^}]*padding: 0 1rem", page)  # a side margin on narrow screens too


def test_html_tooltips_of_prompt_lookups_rounds(cli, tiny, tmp_path):
    """Prompt lookup's chain rounds stage p but no q (one-hot drafts): the page says so ('–')."""
    path = tmp_path / "ngram.html"
    code, out, err = cli("inspect-acceptance", "-p", tiny, "-n", "16", "--proposer", "ngram", "--export", path,
                         "--format", "json", "a a a a a a a a")
    assert code == 0, err
    rounds = json.loads(out)["runs"][0]["rounds"]
    assert any(r["drafted_ids"] for r in rounds) and all(r["draft_q"] is None for r in rounds)
    titles = re.findall(r'<span class="(?:accepted|recovered)" title="([^"]*)"', path.read_text())
    assert titles and all(re.search(r"p\(x\) target \d\.\d{3} · q\(x\) draft –", t) for t in titles)


def test_png_bar_labels_stay_under_the_panel_title():
    pytest.importorskip("matplotlib")
    from specgen.cli.inspect_export import png_figure

    bins = [{"lower": lo, "upper": hi, "verified": 100, "accepted": 100, "rate": 1.0}
            for lo, hi in [(0, 0.25), (0.25, 0.5), (0.5, 1), (1, 2), (2, 4), (4, None)]]
    document = {"per_position": [{"position": 1, "rate": 1.0}], "fates": {"accepted": 5, "recovered": 1, "bonus": 1},
                "totals": {"generated_tokens": 7}, "entropy": bins,
                "source": {"profile": "p", "k": 4, "temperature": 0.0}}
    fig = png_figure(document)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panel = fig.axes[2]
    title, frame = panel.title.get_window_extent(renderer), panel.get_window_extent(renderer)
    labels = [text.get_window_extent(renderer) for text in panel.texts]
    assert len(labels) == 6
    assert all(not label.overlaps(title) and label.y1 <= frame.y1 for label in labels)
