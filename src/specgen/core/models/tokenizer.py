"""A plain fast tokenizer without transformers: tokenizer.json through the `tokenizers` library.

Importing transformers at all costs a large part of the demo's start-up (its package __init__
reads every model's source to build its lazy imports). For a checkpoint whose
tokenizer_config.json declares a plain PreTrainedTokenizerFast and asks nothing of transformers
beyond it, what specgen uses of that class (encode, decode, vocabulary, EOS) is the `tokenizers`
library's own behaviour, which this class passes on. `plain_config` says which checkpoints
qualify; the others load through transformers. Chat templates are rendered by transformers
itself (imported then), so that a template sees exactly what it would there.
"""

from __future__ import annotations

import json
from pathlib import Path

# tokenizer_config.json keys that do not change what transformers' PreTrainedTokenizerFast does with
# tokenizer.json for encoding and decoding. Any other key (add_bos_token, add_prefix_space,
# added_tokens_decoder, extra special tokens, ...) makes transformers adjust the tokenizer: then
# transformers loads it.
PLAIN_KEYS = {"tokenizer_class", "backend", "eos_token", "bos_token", "pad_token", "unk_token", "model_max_length",
              "clean_up_tokenization_spaces", "chat_template", "model_input_names", "padding_side",
              "truncation_side", "is_local", "local_files_only"}  # the last two: loading options save_pretrained keeps
SPECIAL_KEYS = ("eos_token", "bos_token", "pad_token", "unk_token")
PLAIN_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def plain_config(folder: Path) -> dict | None:
    """The folder's tokenizer_config.json when PlainTokenizer behaves as transformers' class would
    on it, else None."""
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
    except (OSError, ValueError):
        return None  # transformers then says what is wrong
    if not isinstance(config, dict) or config.get("tokenizer_class") not in PLAIN_CLASSES or set(config) - PLAIN_KEYS:
        return None
    if config.get("clean_up_tokenization_spaces") or not isinstance(config.get("chat_template", ""), str):
        return None
    if any((folder / name).exists() for name in ("special_tokens_map.json", "chat_template.json",
                                                   "additional_chat_templates")):
        return None
    special = {token["content"] for token in added if token.get("special")}
    named = [_content(config[key]) for key in SPECIAL_KEYS if config.get(key) is not None]
    return config if all(name in special for name in named) else None  # else transformers adds or marks them


def _content(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


class PlainTokenizer:
    """The part of transformers' tokenizer API that specgen uses, on a `tokenizers.Tokenizer`."""

    def __init__(self, folder: Path, config: dict):
        from tokenizers import Tokenizer

        self.name_or_path = str(folder)
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_truncation()  # as transformers does for a call that asks for none
        self._tokenizer.no_padding()
        template = folder / "chat_template.jinja"
        self.chat_template = template.read_text(encoding="utf-8") if template.is_file() else config.get(
            "chat_template")
        self.eos_token = _content(config.get("eos_token"))
        self.eos_token_id = self._tokenizer.token_to_id(self.eos_token) if self.eos_token is not None else None
        self._transformers = None

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict:
        """{"input_ids": ids}, or for a list of texts a list of ids (encoded in parallel)."""
        if isinstance(text, list):
            encodings = self._tokenizer.encode_batch(text, add_special_tokens=add_special_tokens)
            return {"input_ids": [encoding.ids for encoding in encodings]}
        return {"input_ids": self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        # clean_up_tokenization_spaces: off in every config this class takes, and specgen passes False
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        """The template rendered by transformers' own PreTrainedTokenizerFast for this folder."""
        if self._transformers is None:
            from transformers import PreTrainedTokenizerFast

            self._transformers = PreTrainedTokenizerFast.from_pretrained(self.name_or_path, local_files_only=True)
        self._transformers.chat_template = self.chat_template
        return self._transformers.apply_chat_template(messages, tokenize=tokenize,
                                                      add_generation_prompt=add_generation_prompt)
