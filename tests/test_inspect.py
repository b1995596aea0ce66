"""`specgen inspect-acceptance` and the insight decoder on tiny random models."""

from __future__ import annotations

import json
import sys
from html.parser import HTMLParser

import pytest

from specgen.core.decode import Finished
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
