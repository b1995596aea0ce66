"""benchmarks/peers/: specgen's pairs through llama.cpp's own GGUF converter, and the arithmetic
behind llama_cpp.py's summaries.

The conversion tests need llama.cpp's source in .peers/llama.cpp (benchmarks/peers/fetch_llama_cpp.sh
puts it there; git ignores it) and are skipped without it. They read each GGUF back with the
source's own gguf-py: the vocabulary and the merges as the tokenizer has them, every tensor of the
checkpoint in its shape, the embedding's values those of the checkpoint in bf16.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_models import family_pairs

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / ".peers" / "llama.cpp"
CONVERT = ROOT / "benchmarks" / "peers" / "convert_pair.py"
DEMO = ROOT / "src" / "specgen" / "builtin" / "demo"
needs_source = pytest.mark.skipif(not (SOURCE / "convert_hf_to_gguf.py").is_file(),
                                  reason="no llama.cpp source in .peers/llama.cpp (benchmarks/peers/fetch_llama_cpp.sh)")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "peers" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
