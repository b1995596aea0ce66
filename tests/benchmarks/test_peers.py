"""benchmarks/peers/: specgen's pairs through llama.cpp's own GGUF converter, and the arithmetic
behind llama_cpp.py's summaries.

The conversion tests need llama.cpp's source in .peers/llama.cpp (benchmarks/peers/fetch_llama_cpp.sh
puts it there; git ignores it) and are skipped without it. They read each GGUF back with the
source's own gguf-py: the vocabulary and the merges as the tokenizer has them, every tensor of the
checkpoint in its shape, the embedding's values those of the checkpoint in bf16.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repo_paths import script
from tiny_models import family_pairs

ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "pyproject.toml").is_file())
SOURCE = ROOT / ".peers" / "llama.cpp"
CONVERT = ROOT / "benchmarks" / "peers" / "convert_pair.py"
DEMO = ROOT / "src" / "specgen" / "builtin" / "demo"
needs_source = pytest.mark.skipif(not (SOURCE / "convert_hf_to_gguf.py").is_file(),
                                  reason="no llama.cpp source in .peers/llama.cpp (benchmarks/peers/fetch_llama_cpp.sh)")


def _script(name: str):
    return script(ROOT / "benchmarks" / "peers" / f"{name}.py", f"peers_{name}")  # not the llama_cpp package


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> Path:
    """benchmarks/family_pairs.py's Llama 3.1 8B + 3.2 1B pair at tiny scale (a merge-free tokenizer)."""
    return family_pairs().build_family("llama-3.1", tmp_path_factory.mktemp("family"), scale="tiny")


def _reader(path: Path):
    sys.path.insert(0, str(SOURCE / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.remove(str(SOURCE / "gguf-py"))
    return GGUFReader(path)


def _vocabulary(folder: Path) -> tuple[list[str], list[str]]:
    """(tokens in id order, merges as GGUF writes them) of a folder's tokenizer.json."""
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {**tokenizer["model"]["vocab"], **{added["content"]: added["id"] for added in tokenizer["added_tokens"]}}
    tokens = sorted(ids, key=ids.get)
    assert [ids[token] for token in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    return tokens, merges


def test_merges_are_written_only_for_a_tokenizer_without_them(family):
    convert = _script("convert_pair")
    assert convert.gpt2_byte_level(family / "target") and convert.without_merges(family / "target")
    assert convert.gpt2_byte_level(DEMO / "draft") and not convert.without_merges(DEMO / "draft")


@needs_source
@pytest.mark.parametrize("which", ["family target", "family draft", "demo draft"])
def test_a_pair_converts_with_its_vocabulary_and_weights(family, tmp_path, which):
    from safetensors.torch import load_file

    folder = {"family target": family / "target", "family draft": family / "draft", "demo draft": DEMO / "draft"}[which]
    out = tmp_path / "model.gguf"
    done = subprocess.run([sys.executable, str(CONVERT), str(SOURCE), str(folder), str(out), "--outtype", "bf16"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    gguf = _reader(out)
    fields = gguf.fields
    tokens, merges = _vocabulary(folder)
    config = json.loads((folder / "config.json").read_text())
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    assert fields["tokenizer.ggml.tokens"].contents() == tokens and len(tokens) == config["vocab_size"]
    assert fields["tokenizer.ggml.merges"].contents() == merges  # the family's: present, and empty

    tensors = {t.name: t for t in gguf.tensors}
    weights = load_file(folder / "model.safetensors")
    layers = config["num_hidden_layers"]
    per_layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}
    expected = {f"blk.{i}.{name}.weight" for i in range(layers) for name in per_layer} | {
        "token_embd.weight", "output_norm.weight"} | ({"output.weight"} if "lm_head.weight" in weights else set())
    assert set(tensors) - {"rope_freqs.weight"} == expected
    # llama3 rope scaling (the family's) is written as the frequency factors of rope_freqs
    assert ("rope_freqs.weight" in tensors) == (config["rope_parameters"]["rope_type"] == "llama3")
    pairs = {"token_embd.weight": "model.embed_tokens.weight", "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
             "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight"}
    for name, source in pairs.items():
        assert [int(n) for n in tensors[name].shape] == list(reversed(weights[source].shape)), name
        want = weights[source].to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        assert tensors[name].data.tobytes() == want, name


def _spec_run(tokens: int, accepted: int, drafted: int, seconds: float) -> dict:
    return {"tokens": tokens, "accepted": accepted, "drafted": drafted, "seconds": seconds,
            "decode_tok_s": tokens / seconds, "tok_s_with_prefill": None}


def test_rounds_are_tokens_less_accepted_drafts_pooled_over_prompts():
    llama_cpp = _script("llama_cpp")
    runs = [_spec_run(65, 0, 246, 0.65), _spec_run(10, 6, 8, 0.04)]  # 65 rounds; 4 rounds of 1-3 tokens
    summary = llama_cpp.summarize(runs)
    assert summary["rounds"] == 65 + 4
    assert summary["round_ms"] == pytest.approx((0.65 + 0.04) / 69 * 1000)
    assert summary["drafted_per_round"] == pytest.approx((246 + 8) / 69)
    assert summary["acceptance"] == pytest.approx(6 / 254)
    target_only = llama_cpp.summarize([{"tokens": 64, "decode_tok_s": 200.0, "tok_s_with_prefill": 150.0}])
    assert "rounds" not in target_only and target_only["median_decode_tok_s"] == 200.0


def test_the_round_fit_is_the_line_through_draft_lengths_at_one_temperature():
    llama_cpp = _script("llama_cpp")
    per_token, besides = 1.25, 6.5
    summary = {f"k={k}": {"k": k, "temperature": 0.0, "drafted_per_round": d, "round_ms": besides + per_token * d}
               for k, d in ((4, 3.78), (2, 1.94), (8, 7.5))}
    summary["sampled"] = {"k": 4, "temperature": 0.8, "drafted_per_round": 3.78, "round_ms": 50.0}
    summary["target-only"] = {"k": None, "temperature": None, "median_decode_tok_s": 200.0}
    fit = llama_cpp.round_fit(summary, 0.0)
    assert fit["ms_per_drafted_token"] == pytest.approx(per_token)
    assert fit["ms_per_round_besides"] == pytest.approx(besides)
    assert fit["draft_lengths"] == 3
    assert llama_cpp.round_fit({"k=4": summary["k=4"], "sampled": summary["sampled"]}, 0.0) is None


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_the_table_puts_both_engines_against_the_floor_of_their_bytes():
    llama_cpp = _script("llama_cpp")
    bench = json.loads((ROOT / "benchmarks" / "results" / "bench-floor" / "llama.json").read_text())
    llama = {"llama_bench": {"depth": 128, "tok_s": 190.0, "stddev_tok_s": 0.5},
             "summary": {"speculative k=4 t=0.0": {"k": 4, "temperature": 0.0, "round_ms": 11.0, "drafted_per_round": 3.75,
                                                   "acceptance": 0.0, "median_decode_tok_s": 91.0}}}
    rows = [_cells(row) for row in llama_cpp.table_rows(llama, bench)[2:]]
    streamed, bandwidth = bench["environment"]["streamed_bytes"], bench["environment"]["copy_bandwidth_bytes_per_s"]
    step_floor = streamed["target"] / bandwidth * 1000
    engines = [(row[0], row[1].split(" (")[0]) for row in rows]
    assert engines[:3] == [("llama.cpp", "target-only step"), ("specgen", "target-only step"),
                           ("llama.cpp", "k = 4 greedy round")]
    assert rows[0][2:6] == ["190.0", f"{1000 / 190:.3f}", f"{step_floor:.3f}", f"{1000 / 190 / step_floor:.2f}×"]
    round_floor = (streamed["target"] + 3.75 * streamed["draft"]) / bandwidth * 1000
    assert rows[2][3:6] == ["11.000", f"{round_floor:.3f}", f"{11 / round_floor:.2f}×"]
    draft = next(r for r in bench["results"] if r["proposer"] == "draft")
    assert ["specgen", "k = 4 greedy round, draft", f"{draft['decode_tokens_per_second']['median']:,.1f}",
            f"{draft['round_ms']['total']:.3f}", f"{draft['round_floor_ms']:.3f}"] in [row[:5] for row in rows]


def test_a_run_without_simple_times_llama_bench_and_the_rounds_alone(family, tmp_path, monkeypatch):
    llama_cpp = _script("llama_cpp")
    calls = []
    monkeypatch.setattr(llama_cpp, "target_bench", lambda args, depth: {"depth": depth, "tok_s": 190.0})
    monkeypatch.setattr(llama_cpp, "target_only", lambda args, text: calls.append("simple"))
    monkeypatch.setattr(llama_cpp, "speculative",
                        lambda args, text, k, t: calls.append((k, t)) or _spec_run(65, 0, 61 * k, 0.01 * (6 + k)))
    out = tmp_path / "llama.json"
    monkeypatch.setattr(sys, "argv", ["llama_cpp.py", "run", "bin", str(family), "--k", "4,2", "-t", "0", "-n", "64",
                                      "--num-prompts", "2", "--depth", "128", "--no-simple", "--out", str(out)])
    assert llama_cpp.main() == 0
    document = json.loads(out.read_text())
    assert calls == [(4, 0.0), (4, 0.0), (2, 0.0), (2, 0.0)]
    assert list(document["summary"]) == ["speculative k=4 t=0.0", "speculative k=2 t=0.0"]
    assert document["summary"]["speculative k=2 t=0.0"]["k"] == 2
    assert document["summary"]["speculative k=2 t=0.0"]["round_ms"] == pytest.approx(80 / 65)
