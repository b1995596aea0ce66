"""core/models/detok.py: the prefix window's decode kept while the offsets stay changes no output.

The reference is the detokenizer as it was (two decodes every id); both run over the tiny
byte-level tokenizer, whose multi-byte characters split over several ids (held back until whole),
with a special id in the middle (skipped: its text is empty), and through TextTracker's stop strings."""

from __future__ import annotations

import pytest

from specgen.core.models.detok import REPLACEMENT, IncrementalDetokenizer, TextTracker
from tiny_models import EOS, build_tokenizer

TEXTS = ["héllo wörld — naïve café ✓ 你好\n", "😀 emoji 🚀🚀 and 你好你好, then ascii", "def add(a, b):\n    return a + b\n",
         "ünïcödé ✓✓✓ 好"]


class Counting:
    """The tokenizer, counting decodes."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decodes = tokenizer, 0

    def decode(self, ids, **kwargs):
        self.decodes += 1
        return self.tokenizer.decode(ids, **kwargs)


class TwoDecodes(IncrementalDetokenizer):
    """The detokenizer before the prefix was kept: both windows decoded on every add and flush."""

    def add(self, new_ids):
        self.ids.extend(new_ids)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        if len(text) <= len(prefix) or text.endswith(REPLACEMENT):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(prefix):]

    def flush(self):
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix):] if len(text) > len(prefix) else ""


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _cases(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(EOS)
    prompt = tokenizer("say: ")["input_ids"]
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        yield prompt, ids
        yield prompt, ids[:3] + [eos] + ids[3:]  # a skipped id
        yield [], ids[:-1]  # no prompt; the end mid-character where the last is multi-byte


def _run(cls, tokenizer, prompt, ids, stops, cut_at_end: bool):
    counting = Counting(tokenizer)
    tracker = TextTracker(cls(counting, prompt), stops)
    pieces, deltas, hit = [], [], False
    for token in ids:
        piece = tracker.detok.add([token])
        pieces.append(piece)
        delta, hit = tracker.add(piece)
        deltas.append(delta)
        if hit:
            break
    tail = tracker.finish(hit or cut_at_end)
    return (pieces, deltas, hit, tail, tracker.text, tracker.released), counting.decodes


@pytest.mark.parametrize("stops", [(), ("你",), ("ö", "✓✓"), ("🚀🚀", "a + ")])
def test_the_same_pieces_text_and_stops_with_fewer_decodes(tokenizer, stops):
    fewer = False
    for prompt, ids in _cases(tokenizer):
        for cut in (False, True):
            want, before = _run(TwoDecodes, tokenizer, prompt, ids, stops, cut)
            got, after = _run(IncrementalDetokenizer, tokenizer, prompt, ids, stops, cut)
            assert got == want, (prompt, ids, stops)
            assert after <= before
            fewer |= after < before
    assert fewer  # multi-byte characters span ids here: some adds were held back, and cost one decode


def test_each_multi_byte_character_whole(tokenizer):
    """The pieces never split a character: each is text of whole characters, adding up to the text."""
    ids = tokenizer(TEXTS[1])["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, [])
    pieces = [detok.add([t]) for t in ids]
    assert any(p == "" for p in pieces) and "".join(pieces) + detok.flush() == TEXTS[1]
    assert all(REPLACEMENT not in p for p in pieces)
