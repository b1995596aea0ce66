"""Convert a specgen pair's models to GGUF with llama.cpp's own converter, vocabulary unchanged.

    python benchmarks/peers/convert_pair.py LLAMA_CPP_SOURCE MODEL_FOLDER OUT.gguf [--outtype bf16]

llama.cpp's converter names a BPE tokenizer's pre-tokenizer by hashing how the tokenizer splits a
fixed text, and refuses hashes it does not list. specgen's pairs (benchmarks/make_pair.py) use
the `tokenizers` library's byte-level BPE, whose pre-tokenizer is GPT-2's regular expression:
this wrapper tells the converter so ("gpt-2") when, and only when, the tokenizer.json says its
pre-tokenizer is ByteLevel with that expression. The tokenizers of benchmarks/family_pairs.py are
such a BPE without merges (one token a byte): the converter then writes no merges list, which
llama.cpp requires of a BPE vocabulary, so for them this wrapper writes the empty list (gguf-py
refuses empty arrays). Everything else is the converter's own code, run as
`convert_hf_to_gguf.py` would be. benchmarks/peers/llama_cpp.sh checks afterwards that llama.cpp
tokenizes the prompts exactly as specgen does. Needs numpy, torch, safetensors and transformers
(its tokenizer), nothing else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def tokenizer_json(folder: Path) -> dict:
    return json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))


def gpt2_byte_level(folder: Path) -> bool:
    tokenizer = tokenizer_json(folder)
    pre = tokenizer.get("pre_tokenizer") or {}
    return (tokenizer.get("model", {}).get("type") == "BPE" and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True) and not pre.get("add_prefix_space", False))


def without_merges(folder: Path) -> bool:
    """A byte-level BPE that merges nothing (benchmarks/family_pairs.py's character-level tokenizers)."""
    return gpt2_byte_level(folder) and tokenizer_json(folder)["model"].get("merges") == []


def empty_array(pack_val):
    """gguf-py's GGUFWriter._pack_val, also for an empty array of a named item type: that type, then a
    count of 0 (the GGUF format allows it, and llama.cpp's reader takes it); gguf-py refuses one
    because it reads the item type from the first item."""
    from gguf import GGUFValueType

    def pack(self, val, vtype, add_vtype, sub_type=None):
        if vtype != GGUFValueType.ARRAY or sub_type is None or len(val):
            return pack_val(self, val, vtype, add_vtype, sub_type)
        return (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type) + self._pack("Q", 0)

    return pack


def write_empty_merges() -> None:
    """After the converter's special vocabulary finds no merges, an empty merges list in the GGUF."""
    import gguf

    add_to_gguf = gguf.SpecialVocab.add_to_gguf

    def add(self, writer, quiet: bool = False) -> None:
        add_to_gguf(self, writer, quiet)
        if self.load_merges and not self.merges:
            writer.add_key_value(gguf.Keys.Tokenizer.MERGES, [], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)

    gguf.SpecialVocab.add_to_gguf = add
    gguf.GGUFWriter._pack_val = empty_array(gguf.GGUFWriter._pack_val)


def main() -> None:
    source, folder, out, *rest = sys.argv[1:]
    source, folder = Path(source), Path(folder)
    sys.path[:0] = [str(source), str(source / "gguf-py")]
    sys.argv = ["convert_hf_to_gguf.py", str(folder), "--outfile", out, *(rest or ["--outtype", "bf16"])]
    import convert_hf_to_gguf
    from conversion.base import TextModel

    known = TextModel.get_vocab_base_pre

    def pre_tokenizer(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            if gpt2_byte_level(folder):
                return "gpt-2"
            raise

    TextModel.get_vocab_base_pre = pre_tokenizer
    if not (folder / "tokenizer.model").is_file():
        # the Llama converter tries SentencePiece first and imports it before it finds no
        # tokenizer.model; without that package (as on the GPU machine) go straight to its fallbacks
        def no_sentencepiece(self):
            raise FileNotFoundError(folder / "tokenizer.model")

        TextModel._set_vocab_sentencepiece = no_sentencepiece
    if without_merges(folder):
        write_empty_merges()
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
