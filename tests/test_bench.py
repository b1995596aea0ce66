"""`specgen bench` on tiny random models: every documented JSON field, sane values, the sweep, errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.core.bench import Unavailable, first_divergence, hf_generation_config, percentile, recommend
from specgen.core.settings import SamplingSpec
from tiny_models import build_pair, write_profile

SCHEMA_DOC = Path(__file__).resolve().parents[1] / "docs" / "bench-schema.md"
PROMPTS = ["def add(a, b):", "class Point:"]
KS = (1, 3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny pair whose folder also holds prompts.jsonl, as the pair recipe writes it."""
    root = tmp_path_factory.mktemp("bench")
    target, draft = build_pair(root, noisy=0.1)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return write_profile(root / "tiny.toml", target, draft)


@pytest.fixture(scope="module")
def sweep(tiny, tmp_path_factory):
    """One bench over k x temperature with every baseline, run once for the module (in-process)."""
    from specgen.cli import errors
    from specgen.cli.main import app

    out = tmp_path_factory.mktemp("out") / "bench.json"
    argv = sys.argv
    sys.argv = ["specgen", "bench", "-p", str(tiny), "--k", ",".join(map(str, KS)), "-t", "0,0.8",
                "--baseline", "target-only,hf,hf-assisted", "-n", "8", "--warmup", "1", "--records",
                "--format", "json", "-q"]
    stdout = sys.stdout
    try:
        with open(out, "w") as sys.stdout:
            code = errors.run(app)
    finally:
        sys.stdout, sys.argv = stdout, argv
    assert code == 0
    return out


def documented_paths() -> list[str]:
    """Every field path in docs/bench-schema.md's tables (records prefixed with their place)."""
    paths, prefix = [], ""
    for line in SCHEMA_DOC.read_text().splitlines():
        if line.startswith("## Per-round records"):
            prefix = "results[].records[]."
        match = re.match(r"\| `([^`]+)` \|", line)
        if match:
            paths.append(prefix + match.group(1))
    return paths


def resolve(node, parts: list[str], baselines: list[str], where: str) -> None:
    """Check that the path exists in node (stopping at null, which documented nullable fields may be)."""
    if not parts or node is None:
        return
    head, rest = parts[0], parts[1:]
    if head.endswith("[]"):
        node = node[head[:-2]] if head[:-2] else node
        assert isinstance(node, list), where
        for item in node:
            resolve(item, rest, baselines, where)
        return
    keys = baselines if head == "<baseline>" else [head]
    for key in keys:
        assert isinstance(node, dict) and key in node, f"{where}: missing {key!r}"
        resolve(node[key], rest, baselines, where)


def test_bench_json_has_every_documented_field(sweep):
    document = json.loads(sweep.read_text())
    paths = documented_paths()
    assert len(paths) > 80
    for path in paths:
        resolve(document, path.split("."), document["settings"]["baselines"], path)
    assert document["schema"] == "specgen.bench/1"


def test_bench_values_are_sane(sweep):
    document = json.loads(sweep.read_text())
    assert [p["text"] for p in document["prompts"]] == PROMPTS  # the pair's prompts.jsonl by default
    assert all(b["available"] for b in document["baselines"])
    for result in document["results"]:
        k = result["k"]
        assert 0.0 <= result["acceptance_rate"] <= 1.0
        assert 1.0 <= result["mean_accepted_length"] <= k + 1
        assert len(result["per_position_acceptance"]) <= k
        assert all(0.0 <= r <= 1.0 for r in result["per_position_acceptance"])
        assert result["tokens_per_second"]["median"] > 0
        assert result["tokens_per_second"]["min"] <= result["tokens_per_second"]["median"] <= result[
            "tokens_per_second"]["max"]
        for name in ("target-only", "hf", "hf-assisted"):
            assert result["speedup"][name]["median"] > 0
            assert all(row["speedup"][name] > 0 for row in result["per_prompt"])
        assert all(v >= 0 for v in result["round_ms"].values())
        assert result["round_ms"]["total"] == pytest.approx(sum(result["round_ms"][p] for p in
                                                                ("draft", "verify", "sample", "other")))
        counts = result["counts"]
        assert counts["accepted"] + counts["recovered"] + counts["bonus"] == counts["generated_tokens"] == 8 * len(PROMPTS)
        assert result["peak_gpu_memory_bytes"] is None  # CPU
        assert 0 < result["time_to_first_token_seconds"]["median"]
        if result["temperature"] == 0:
            agreement = result["greedy_agreement"]
            assert set(agreement) == {"target-only", "hf", "hf-assisted"}
            assert agreement["target-only"]["identical_fraction"] == 1.0  # lossless greedy, float32
            assert agreement["target-only"]["first_divergence"] == [None] * len(PROMPTS)
            assert all(0.0 <= a["identical_fraction"] <= 1.0 for a in agreement.values())
        else:
            assert result["greedy_agreement"] is None


def test_k_sweep_runs_each_k_at_each_temperature(sweep):
    document = json.loads(sweep.read_text())
    combos = [(r["temperature"], r["k"]) for r in document["results"]]
    assert combos == [(t, k) for t in (0.0, 0.8) for k in KS]
    for result in document["results"]:
        counts = result["counts"]
        assert counts["drafted"] <= result["k"] * counts["rounds"]
        assert max(len(r["rounds"][0]["drafted_ids"]) for r in result["records"]) == result["k"]
    assert [(b["temperature"], b["method"]) for b in document["baselines"]] == [
        (t, m) for t in (0.0, 0.8) for m in ("target-only", "hf", "hf-assisted")]
    recommended = document["recommendation"]
    assert [r["temperature"] for r in recommended] == [0.0, 0.8]
    for rec in recommended:
        best = max((r for r in document["results"] if r["temperature"] == rec["temperature"]),
                   key=lambda r: r["tokens_per_second"]["median"])
        assert rec["k"] == best["k"]
        assert rec["faster_than_target_only"] == (rec["speedup_vs_target_only"] > 1)


def test_json_alone_on_stdout_in_a_real_process(tiny, tmp_path):
    """A separate process, so nothing printed at import or load time can hide: stdout is one JSON line."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\n\n{\"prompt\": \"import os\"}\n")
    env = {k: v for k, v in os.environ.items() if k != "SPECGEN_DEBUG"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "specgen.cli.main", "bench", "-p", str(tiny), "--prompts", str(prompts), "--k", "2",
         "-n", "4", "--warmup", "0", "--format", "json"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.endswith("\n")
    document = json.loads(proc.stdout)
    assert [p["text"] for p in document["prompts"]] == ["def f(x):", "import os"]
    assert "recommended k" in proc.stderr  # the table goes to stderr with --format json
    assert "\x1b[" not in proc.stderr  # not a terminal: no colours, no progress bar


def test_text_table_on_stdout(cli, tiny):
    code, out, err = cli("bench", "-p", tiny, "--k", "2", "-n", "4", "--warmup", "0", "--num-prompts", "1")
    assert code == 0, err
    assert "k=2" in out and "target-only" in out and "recommended k at temperature 0: 2" in out
    assert err == ""  # stderr is not a terminal: no progress bar


def test_errors(cli, tiny, tmp_path):
    no_prompts = write_profile(tmp_path / "bare.toml", *build_pair_paths(tiny))
    code, out, err = cli("bench", "-p", no_prompts)
    assert code == 2 and out == ""
    assert "no prompts" in err and "prompts.jsonl" in err and "--prompts" in err
    code, _, err = cli("bench", "-p", tiny, "--k", "1,two")
    assert code == 2 and "--k takes a comma list" in err
    code, _, err = cli("bench", "-p", tiny, "--baseline", "vllm")
    assert code == 2 and "unknown baseline 'vllm'" in err
    code, _, err = cli("bench", "-p", tiny, "--k", "0")
    assert code == 2 and "--k" in err


def build_pair_paths(profile: Path) -> tuple[Path, Path]:
    """The tiny pair's folders, copied (without prompts.jsonl) into a fresh folder."""
    import shutil

    src = profile.parent
    dst = profile.parent.parent / (src.name + "-bare")
    for name in ("target", "draft"):
        if not (dst / name).exists():
            shutil.copytree(src / name, dst / name)
    return dst / "target", dst / "draft"


def test_summaries_and_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([7.0], 0.25) == 7.0
    rows = [{"temperature": 0.0, "k": k, "tokens_per_second": {"median": tps}, "speedup": {"target-only": {"median": s}}}
            for k, tps, s in ((1, 10.0, 0.9), (2, 12.0, 0.95))]
    assert recommend(rows) == [{"temperature": 0.0, "k": 2, "tokens_per_second": 12.0,
                                "speedup_vs_target_only": 0.95, "faster_than_target_only": False}]


def test_hf_baselines_refuse_what_transformers_cannot_do():
    with pytest.raises(Unavailable, match="presence or frequency"):
        hf_generation_config(SamplingSpec(presence_penalty=0.5), {0})
    with pytest.raises(Unavailable, match="stop strings"):
        hf_generation_config(SamplingSpec(stop=("\n",)), {0})
    config = hf_generation_config(SamplingSpec(temperature=0.8, top_k=-1, ignore_eos=True), {0})
    assert config.do_sample and config.top_k == 0 and config.eos_token_id is None
