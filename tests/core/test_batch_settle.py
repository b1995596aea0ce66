"""core/batch_decode.py's settling of a row (a round's ids detokenized at once, per-token text only
replayed when a stop string hits) against the per-token path it replaced, kept here as the
reference: the same ids, fates, text, tail, finish reason and statistics after every round, over
multi-byte text whose characters span ids and rounds, stop strings that begin in an earlier round,
eos and stop ids, max_tokens, on a byte-level BPE, a SentencePiece-style metaspace tokenizer and
the demo pair's; a row without stop strings detokenizes only when it ends, all at once, to the
same text."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from specgen.core.batch_decode import BatchDecoder, _Row
from specgen.core.events import Fate, Output, text_starts
from specgen.core.models.detok import IncrementalDetokenizer, TextTracker
from specgen.core.settings import SamplingSpec
from specgen.core.stats import AcceptanceStats
from tiny_models import CORPUS, EOS, build_tokenizer

K = 4
TEXTS = ["héllo wörld — naïve café ✓ 你好\nand on 😀 emoji 🚀🚀 and 你好你好, then ascii",
         "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n",
         "ünïcödé ✓✓✓ 好 ünïcödé ✓✓✓ 好 ünïcödé"]
STOPS = [(), ("你好你",), ("ö", "✓✓"), ("🚀🚀", "a + "), ("\n\n",), ("好 ü", "never there")]


def metaspace_tokenizer():
    """A SentencePiece-style BPE: '▁' for spaces, one leading space stripped when decoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", EOS])
    tok.train_from_iterator((CORPUS + TEXTS) * 20, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, unk_token="<unk>")


@pytest.fixture(scope="module", params=["byte-level", "metaspace", "demo"])
def tokenizer(request, tmp_path_factory):
    if request.param == "byte-level":
        return build_tokenizer(tmp_path_factory.mktemp("tok"))
    if request.param == "metaspace":
        return metaspace_tokenizer()
    from transformers import AutoTokenizer

    from specgen.core.profile import load_profile

    return AutoTokenizer.from_pretrained(load_profile().target.path)


def old_settle(row, staged: list[int], k: int, timings: dict, now: float) -> bool:
    """The batch loop's settling as it was: each id detokenized on its own, its text and start kept."""
    if row.adaptive is None:
        row.budget = max(0, min(k, row.spec.max_tokens - len(row.out.ids) - 1))
    emitted = [t for t in staged[: k + 1] if t >= 0]
    n = staged[2 * k + 1]
    accepted = len(emitted) - 1
    fates = [Fate.ACCEPTED] * accepted + [Fate.BONUS if accepted == n else Fate.RECOVERED]
    stops = row.stops
    drafted = staged[k + 1: k + 1 + n]
    used = next((i + 1 for i, t in enumerate(drafted) if t in stops), n)
    for i, token in enumerate(emitted):
        if token in stops:
            row.reason = "stop_token" if token in row.spec.stop_token_ids else "eos"
            emitted, fates = emitted[: i + 1], fates[: i + 1]
            break
    text = row.text
    pieces = [text.detok.add([t]) for t in emitted]
    before = len(text.text)
    _, stop_hit = text.add("".join(pieces))
    starts = text_starts(before, pieces)
    if stop_hit and row.reason is None:
        row.reason = "stop"
        keep = sum(1 for at in starts if at < len(text.text))
        emitted, fates, pieces, starts = emitted[:keep], fates[:keep], pieces[:keep], starts[:keep]
        row.stats.drop(row.out.trim(len(text.text)))
    row.stats.released(now - row.start, len(emitted))
    kept = min(accepted, len(emitted))
    row.stats.add_round(used, kept, len(emitted), timings, early_stop=used < row.budget, k_used=row.budget)
    row.out.extend(emitted, fates, pieces, starts)
    if row.reason is None and len(row.out.ids) >= row.spec.max_tokens:
        row.reason = "length"
    return row.reason is not None


def rounds(ids: list[int], rng: random.Random, extra: list[int]) -> list[list[int]]:
    """Staged rows (out | drafts | n) emitting ids in chunks of 1 to k + 1, now and then a drafted
    or emitted id of `extra` (eos, a stop id) among them."""
    out, at = [], 0
    while at < len(ids):
        chunk = ids[at: at + rng.randint(1, K + 1)]
        at += len(chunk)
        if extra and rng.random() < 0.05:
            chunk[rng.randrange(len(chunk))] = rng.choice(extra)
        accepted = len(chunk) - 1
        n = accepted if accepted == K or rng.random() < 0.3 else K  # a bonus, or a rejection
        drafted = chunk[:accepted] + ([rng.choice(extra)] if extra and rng.random() < 0.1 else [])
        drafted = (drafted + [1] * K)[:K]  # the first n drafted, the rest padding
        out.append(chunk + [-1] * (K + 1 - len(chunk)) + drafted + [n])
    return out


def compare(tokenizer, prompt: list[int], staged: list[list[int]], spec: SamplingSpec, stop_ids: frozenset,
            each_round: bool = True):
    """each_round: the text caught up after every round (else, without stop strings, the ids wait
    until the row ends, as the batch loop keeps them: _Row.caught_up)."""
    decoder = object.__new__(BatchDecoder)
    # a chain round's reads of its staged ids (core/round/batch_round.py: no draft taken, no ranks)
    decoder.round = SimpleNamespace(k=K, read_tree=lambda staged: (False, None),
                                    read_source=lambda b, ranks, accepted: None)
    new = _Row(0, spec, None, TextTracker(IncrementalDetokenizer(tokenizer, prompt), spec.stop), 0.0, stop_ids)
    old = SimpleNamespace(spec=spec, stops=stop_ids, text=TextTracker(IncrementalDetokenizer(tokenizer, prompt), spec.stop),
                          out=Output(False), stats=AcceptanceStats(), adaptive=None, budget=0, reason=None, start=0.0)
    for r, stage in enumerate(staged):
        now = 1.0 + r
        done = decoder._settle(new, stage, {"other": 0.5}, now)
        assert done == old_settle(old, stage, K, {"other": 0.5}, now)
        assert (new.ids, new.fates, new.reason) == (old.out.ids, old.out.fates, old.reason)
        if each_round or spec.stop:
            assert (new.caught_up().released, new.text.text) == (old.text.released, old.text.text)
        assert new.stats.as_dict() == old.stats.as_dict()
        if done:
            break
    assert (new.caught_up().released, new.text.text) == (old.text.released, old.text.text)
    assert new.text.finish(new.reason == "stop") == old.text.finish(old.reason == "stop")
    return new.reason


@pytest.mark.parametrize("each_round", [True, False], ids=["text-each-round", "text-at-the-end"])
def test_settling_a_round_at_once_matches_the_per_token_path(tokenizer, each_round):
    rng = random.Random(0)
    eos = tokenizer.convert_tokens_to_ids(EOS) if EOS in tokenizer.get_vocab() else tokenizer.eos_token_id
    prompt = tokenizer("say: ", add_special_tokens=False)["input_ids"]
    reasons = set()
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for stops in STOPS:
            for trial in range(6):
                stop_id = rng.choice(ids)
                extra = [eos, stop_id] if trial % 2 else []
                spec = SamplingSpec(max_tokens=len(ids) - trial if trial >= 4 else 10**6, stop=stops,
                                    stop_token_ids=(stop_id,) if extra else ())
                stop_ids = frozenset(spec.stop_token_ids) | ({eos} if extra else frozenset())
                reasons.add(compare(tokenizer, prompt if trial != 2 else [], rounds(list(ids), rng, extra), spec,
                                    stop_ids, each_round))
    assert {"stop", "eos", "stop_token", "length", None} <= reasons


def test_a_round_ending_mid_character_releases_what_came_before(tokenizer):
    """add_all over ids whose end is an incomplete character: the whole characters before it come
    out now, as one id at a time, and the rest once it completes."""
    ids = tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    singly, together = IncrementalDetokenizer(tokenizer, []), IncrementalDetokenizer(tokenizer, [])
    held = False
    for at in range(0, len(ids), 3):
        chunk = ids[at: at + 3]
        pieces = [singly.add([t]) for t in chunk]
        held |= pieces[-1] == "" and any(pieces)
        assert together.add_all(chunk) == "".join(pieces)
    assert together.pieces() == _singly(tokenizer, ids)
    assert together.flush() == singly.flush()
    assert held or "metaspace" in type(tokenizer.backend_tokenizer.decoder).__name__.lower()


def test_a_whole_output_at_once_matches_one_id_at_a_time(tokenizer):
    """add_all over a row's whole output (the batch loop's, without stop strings), ending at every
    id, inside characters too (add_all halves it then), then the rest of the ids: the text and the
    flush of one id at a time."""
    ids = tokenizer(TEXTS[0] + TEXTS[2], add_special_tokens=False)["input_ids"]
    prompt = tokenizer("say: ", add_special_tokens=False)["input_ids"]
    halved = 0
    for end in range(1, len(ids) + 1):
        for rest in (False, True):  # flushed where the ids end (an incomplete character stays U+FFFD), or after the rest
            singly, together = IncrementalDetokenizer(tokenizer, prompt), IncrementalDetokenizer(tokenizer, prompt)
            pieces = [singly.add([t]) for t in ids[:end]]
            halved += pieces[-1] == "" and any(pieces)
            assert together.add_all(ids[:end]) == "".join(pieces)
            if rest:
                assert together.add_all(ids[end:]) == "".join(singly.add([t]) for t in ids[end:])
                assert together.pieces() == _singly(tokenizer, prompt, ids)
            assert together.flush() == singly.flush()
    assert halved or "metaspace" in type(tokenizer.backend_tokenizer.decoder).__name__.lower()


def _singly(tokenizer, ids: list[int], more: list[int] | None = None) -> list[str]:
    """Each of `more` one at a time after the context `ids` (without more: each of ids, no context)."""
    if more is not None:
        detok = IncrementalDetokenizer(tokenizer, ids)
        return [detok.add([t]) for t in more]
    detok = IncrementalDetokenizer(tokenizer, [])
    return [detok.add([t]) for t in ids]
