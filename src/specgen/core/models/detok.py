"""Incremental detokenization that never splits a multi-byte character.

Decodes a short window of ids and releases only text that is stable: when the newest ids end in an
incomplete UTF-8 sequence the decoder yields U+FFFD, and that text is held back until it completes.

A window's text past its first id does not depend on where the window starts (the decoders of
byte-level BPE, SentencePiece's metaspace and byte fallback, WordPiece): the windows move as ids are
released, and the batch loop releases a round's ids at once (add_all), or a row's whole output when
it ends (no stop strings), where the single loop takes them one at a time (add), to the same text.
"""

from __future__ import annotations

import sys

REPLACEMENT = "\ufffd"
CONTEXT = 5  # prompt ids kept before the output, so leading spaces decode as they would in context


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-CONTEXT:])
        self.context = len(self.ids)
        self._decode = decoder(tokenizer)
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        # the prefix window's text, kept while the offsets stay: ids only grow, so ids[prefix_offset:
        # read_offset] and its decode are the same until they move (a held-back id, as within a
        # multi-byte character, then costs one decode, not two)
        self._prefix: tuple[tuple[int, int], str] | None = None

    def _prefix_text(self) -> str:
        window = (self.prefix_offset, self.read_offset)
        if self._prefix is None or self._prefix[0] != window:
            self._prefix = window, self._decode(self.ids[self.prefix_offset:self.read_offset])
        return self._prefix[1]

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        prefix = self._prefix_text()
        text = self._decode(self.ids[self.prefix_offset:])
        if len(text) <= len(prefix) or text.endswith(REPLACEMENT):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(prefix):]

    def add_all(self, new_ids: list[int]) -> str:
        """What add([t]) for each of new_ids releases, joined: one decode where the ids end on a whole
        character, else each half in turn (what comes before the incomplete character is released now,
        as add releases it; halves, not one id at a time: a row's whole output may come at once)."""
        if len(new_ids) < 2:
            return self.add(new_ids)
        text = self._decode(self.ids[self.prefix_offset:] + new_ids)
        if text.endswith(REPLACEMENT):
            half = len(new_ids) // 2
            return self.add_all(new_ids[:half]) + self.add_all(new_ids[half:])
        prefix = self._prefix_text()
        self.ids.extend(new_ids)
        if len(text) <= len(prefix):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(prefix):]

    def pieces(self) -> list[str]:
        """The text each output id so far released as add took them one at a time (a stop string
        cuts the ids where their text does): replayed from the prompt's context, once a stop hits."""
        again = IncrementalDetokenizer(self.tokenizer, self.ids[:self.context])
        return [again.add([t]) for t in self.ids[self.context:]]

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end stays U+FFFD)."""
        if self.read_offset == len(self.ids):  # nothing held back: the window is the prefix's, its text too
            self.prefix_offset = self.read_offset
            return ""
        prefix = self._prefix_text()
        text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix):] if len(text) > len(prefix) else ""


def decoder(tokenizer):
    """ids -> text, skipping special tokens, without cleaning up spaces: a tokenizer of the
    `tokenizers` library decodes in its own call (transformers' decode only converts the ids and
    calls it, at several times the cost, and a round decodes each row's window); any other through
    its decode. A transformers tokenizer means transformers is imported: specgen's own plain
    tokenizer (the demo's) must not import it (its start-up cost is most of the demo's)."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return lambda ids: tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    PreTrainedTokenizerBase, PreTrainedTokenizerFast = (transformers.PreTrainedTokenizerBase,
                                                        transformers.PreTrainedTokenizerFast)
    kind = type(tokenizer)
    if (isinstance(tokenizer, PreTrainedTokenizerFast)
            and kind._decode is PreTrainedTokenizerFast._decode and kind.decode is PreTrainedTokenizerBase.decode):
        backend = tokenizer.backend_tokenizer
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


class TextTracker:
    """Detokenized output with stop strings: text is released only once no stop string can start in it."""

    def __init__(self, detok: IncrementalDetokenizer, stops: tuple[str, ...]):
        self.detok = detok
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.released = ""

    def add(self, new_text: str) -> tuple[str, bool]:
        self.text += new_text
        cut = self._stop_at()
        if cut is not None:
            self.text = self.text[:cut]
            return self._release(len(self.text)), True
        return self._release(len(self.text) - self.hold), False

    def _stop_at(self) -> int | None:
        start = max(0, len(self.released) - self.hold)
        hits = [i for i in (self.text.find(s, start) for s in self.stops if s) if i >= 0]
        return min(hits) if hits else None

    def _release(self, upto: int) -> str:
        upto = max(upto, len(self.released))
        delta = self.text[len(self.released):upto]
        self.released = self.text[:upto]
        return delta

    def finish(self, stopped: bool) -> str:
        if not stopped:
            self.text += self.detok.flush()
            cut = self._stop_at()
            if cut is not None:
                self.text = self.text[:cut]
        return self._release(len(self.text))
