"""core/models/tokenizer.py's PlainTokenizer against transformers' PreTrainedTokenizerFast on the same
folders, and which folders it takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgen.core.models.tokenizer import PlainTokenizer, plain_config
from repo_paths import REPO
from tiny_models import build_tokenizer

DEMO = REPO / "src" / "specgen" / "builtin" / "demo" / "target"
TEXTS = ["def quicksort(arr):\n    return arr", "", "  two leading spaces", "héllo wörld — naïve ✓ 你好 \t\r\n",
         "<|endoftext|>", "a<|endoftext|>b<|endoftext|>", "x = [1, 2]  # ok?"]


def both(folder: Path):
    from transformers import PreTrainedTokenizerFast

    config = plain_config(folder)
    assert config is not None
    return PlainTokenizer(folder, config), PreTrainedTokenizerFast.from_pretrained(folder)


@pytest.fixture(params=["demo", "tiny"])
def folder(request, tmp_path):
    if request.param == "demo":
        return DEMO
    build_tokenizer(tmp_path)
    return tmp_path


def test_encodes_decodes_and_describes_itself_as_transformers_does(folder):
    ours, theirs = both(folder)
    for text in TEXTS:
        for special in (True, False):
            ids = theirs(text, add_special_tokens=special)["input_ids"]
            assert ours(text, add_special_tokens=special)["input_ids"] == ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
            assert (ours.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
                    == theirs.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False))
        for token in ids:
            assert ours.decode([token]) == theirs.decode([token])
    assert (ours.eos_token, ours.eos_token_id, len(ours)) == (theirs.eos_token, theirs.eos_token_id, len(theirs))
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.name_or_path == theirs.name_or_path


def test_chat_templates_render_through_transformers(tmp_path):
    from cli_helpers import CHAT_TEMPLATE, add_chat_template

    build_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    add_chat_template(tmp_path)
    ours, theirs = both(tmp_path)
    assert ours.chat_template == theirs.chat_template == CHAT_TEMPLATE
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    for prompt in (True, False):
        assert (ours.apply_chat_template(messages, add_generation_prompt=prompt)
                == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt))
    ours.chat_template = "{{ messages[0]['content'] }}!"  # as tests and callers may set it
    assert ours.apply_chat_template(messages) == "be brief!"


@pytest.mark.parametrize("change", [
    {"add_bos_token": True}, {"add_prefix_space": True}, {"tokenizer_class": "LlamaTokenizer"},
    {"clean_up_tokenization_spaces": True}, {"added_tokens_decoder": {}}, {"eos_token": "def"},
    {"chat_template": [{"name": "default", "template": "x"}]},
])
def test_configs_that_ask_more_of_transformers_are_left_to_it(tmp_path, change):
    build_tokenizer(tmp_path)
    path = tmp_path / "tokenizer_config.json"
    assert plain_config(tmp_path) is not None
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    assert plain_config(tmp_path) is None


def test_a_special_tokens_map_is_left_to_transformers(tmp_path):
    build_tokenizer(tmp_path)
    (tmp_path / "special_tokens_map.json").write_text("{}")
    assert plain_config(tmp_path) is None


def test_the_loader_takes_it_for_llama_checkpoints_unless_told_otherwise(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from specgen.core.models.loading import load_tokenizer
    from specgen.core.settings import ModelSpec

    build_tokenizer(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")  # the folder must look like a checkpoint; never read
    spec = ModelSpec(path=str(tmp_path), device="cpu")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert isinstance(load_tokenizer(spec), PlainTokenizer)
    assert isinstance(load_tokenizer(spec, modeling="transformers"), PreTrainedTokenizerFast)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))  # AutoTokenizer remaps qwen2's
    assert not isinstance(load_tokenizer(spec), PlainTokenizer)
