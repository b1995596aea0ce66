"""From a resolved Profile to a ready decoder: load the pair, build runners and the proposer."""

from __future__ import annotations

from dataclasses import replace

from specgen.core.decode import Decoder, DecodeSetup
from specgen.core.errors import UsageError
from specgen.core.models import LoadedPair, load_pair, logits_width
from specgen.core.proposers import DraftModelProposer, NoProposer
from specgen.core.runner import EagerRunner
from specgen.core.settings import Profile, ProposerSpec


def eos_ids(pair: LoadedPair) -> set[int]:
    ids = set()
    config = getattr(pair.target, "generation_config", None)
    value = getattr(config, "eos_token_id", None) if config is not None else None
    if value is None:
        value = pair.tokenizer.eos_token_id
    if isinstance(value, int):
        ids.add(value)
    elif value:
        ids.update(int(v) for v in value)
    return ids


class Engine:
    """Holds the loaded models for a profile; hands out decoders for any sampling settings."""

    def __init__(self, profile: Profile, allow_pickle: bool = False, progress=None):
        """progress(done, total, what): start-up steps (CUDA graph capture), for the CLI to show."""
        self.profile = profile
        self.pair = load_pair(profile, allow_pickle)
        self.width = logits_width(self.pair.target)
        self.eos_ids = eos_ids(self.pair)
        self.target_runner = EagerRunner(self.pair.target, self.width)
        self.draft_runner = EagerRunner(self.pair.draft, self.width) if self.pair.draft is not None else None
        self.fast_path = None  # gpu/loop.py's graph runners, GPU proposer and GPU round
        if self.pair.device.type == "cuda" and profile.speculation.cuda_graphs:
            from specgen.gpu import loop  # noqa: PLC0415 (gpu/ only with CUDA)

            self.fast_path = loop.build(self.pair, self.width, profile, progress)
        if self.fast_path is not None:
            self.target_runner, self.draft_runner = self.fast_path.target, self.fast_path.draft
        config = self.pair.target.config
        self.max_context = getattr(config, "max_position_embeddings", None)

    @property
    def tokenizer(self):
        return self.pair.tokenizer

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        tok = self.pair.tokenizer
        if chat:
            if not getattr(tok, "chat_template", None):
                raise UsageError("--chat was given but this tokenizer has no chat template",
                                 hint="drop --chat to send the prompt as plain text")
            messages = [{"role": "user", "content": prompt}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return tok(text, add_special_tokens=False)["input_ids"]
        return tok(prompt)["input_ids"]

    def proposer(self, kind: str, sample: bool, stop_ids: set[int], spec: ProposerSpec | None = None,
                 cut: bool = True):
        spec = spec or self.profile.proposer
        if kind == "none":
            return NoProposer(self.target_runner.device)
        from specgen.core.ngram import NgramProposer  # noqa: PLC0415 (only when asked for)

        if kind == "ngram":
            return NgramProposer(spec.ngram_min, spec.ngram_max, self.target_runner.device)
        if self.draft_runner is None:
            raise UsageError(f"the {kind} proposer needs a draft model", hint="add [draft] or use --proposer ngram")
        draft = DraftModelProposer(self.draft_runner, sample, stop_ids, spec.draft_p_min, spec.adaptive_k, cut)
        if kind == "draft":
            return draft
        from specgen.core.hybrid import HybridProposer  # noqa: PLC0415

        return HybridProposer(NgramProposer(spec.ngram_min, spec.ngram_max, self.target_runner.device), draft)

    def decoder(self, profile: Profile | None = None, proposer_kind: str | None = None,
                insight: bool = False) -> Decoder:
        """A decoder for `profile`'s settings (default: the engine's), optionally another proposer kind;
        insight=True makes its round events carry p(x), q(x) and entropy (inspect-acceptance)."""
        profile = profile or self.profile
        kind = proposer_kind or profile.proposer.kind
        sampling = profile.sampling
        k = profile.speculation.k if kind != "none" else 0
        setup = DecodeSetup(sampling=sampling, k=k, eos_ids=self.eos_ids, vocab_size=self.pair.vocab_size,
                            width=self.width, max_context=self.max_context)
        sample, cut = draft_picking(profile.speculation.draft_sampling, sampling)
        stop_ids = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else self.eos_ids)
        proposer = self.proposer(kind, sample, stop_ids, profile.proposer, cut=cut)
        cls = Decoder
        if self.fast_path is not None and not insight:  # insight reads host values per draft step
            cls, proposer = self.fast_path.decoder_class, self.fast_path.adopt(proposer)
        decoder = cls(self.target_runner, proposer, self.tokenizer, setup, insight=insight)
        return decoder


def draft_picking(mode: str, sampling) -> tuple[bool, bool]:
    """(sample, cut) for speculation.draft_sampling: whether the draft draws from q (else its argmax,
    q one-hot), and whether q has the request's top-k / top-p / min-p (else temperature only).
    auto: greedy requests take the argmax; sampled ones draw, and a request cut by top-p alone
    drafts without the cut. On the bench pair at t 0.8 / top-p 0.95 and k = 4 that was 1.24-1.33x
    target-only against 1.17-1.20x with the cut, at the same acceptance (docs/benchmarks.md,
    "Temperature drafts");
    with top-k or min-p too, the wider q costs more acceptance, so those keep the cut."""
    if mode == "auto":
        sample = not sampling.greedy
        top_p_only = sampling.top_p < 1.0 and sampling.top_k <= 0 and sampling.min_p == 0.0
        return sample, not (sample and top_p_only)
    return mode in ("sample", "temperature"), mode != "temperature"


def target_only(profile: Profile) -> Profile:
    return replace(profile, proposer=replace(profile.proposer, kind="none"))
