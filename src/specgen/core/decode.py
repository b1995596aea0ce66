"""The speculative decode loop, one round at a time, as a generator of events.

A round: the proposer drafts up to k tokens; the target scores [last, d0 .. d(n-1)] in ONE
forward (n + 1 rows of p); the verifier keeps an accepted prefix and adds a recovered or bonus
token; both KV caches roll back to the accepted length. Caches always hold the committed
sequence minus its last token, which is the first input of the next round.

The loop knows nothing about terminals: it yields RoundEvent per round and a final Finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from specgen.core import verifier
from specgen.core.detok import IncrementalDetokenizer
from specgen.core.errors import UsageError
from specgen.core.sampling import exponentials, logprobs_from_logits, uniforms
from specgen.core.settings import SamplingSpec
from specgen.core.state import SamplingState
from specgen.core.stats import AcceptanceStats


class Fate(str, Enum):
    ACCEPTED = "accepted"
    RECOVERED = "recovered"
    BONUS = "bonus"


@dataclass
class RoundEvent:
    index: int
    token_ids: list[int]
    fates: list[Fate]
    text: str  # text released by this round (stop strings and held-back prefixes excluded)
    pieces: list[str]  # the text each token completed, for per-token display (before stop-string cuts)
    num_drafted: int
    num_accepted: int
    drafted_ids: list[int]
    timings: dict[str, float]
    draft_q: list[float] | None = None  # q(x) of each drafted token (probabilistic drafting)
    target_p: list[float] | None = None  # p(x) of each drafted token under the target
    logprobs: list[dict] | None = None
    target_entropy: list[float] | None = None  # insight only: entropy of p at each drafted position (nats)
    k_used: int = 0  # the round's k: the profile's, cut to fit max_tokens, or the adaptive one
    early_stop: bool = False  # fewer than k_used drafted (unsure draft, drafted stop token, short n-gram match)


@dataclass
class Finished:
    reason: str  # eos | stop | stop_token | length
    text: str
    token_ids: list[int]
    fates: list[Fate]
    stats: AcceptanceStats
    pieces: list[str] = field(default_factory=list)  # per-token text, as in RoundEvent
    tail: str = ""  # text released only at the end (held back for stop strings or incomplete bytes)
    logprobs: list[dict] | None = None


@dataclass
class DecodeSetup:
    """What the loop needs besides the models: built once per run by the caller."""

    sampling: SamplingSpec
    k: int
    eos_ids: set[int]
    vocab_size: int
    width: int
    max_context: int | None = None  # positions the target supports; None = unbounded
    extra: dict = field(default_factory=dict)


class Decoder:
    def __init__(self, target_runner, proposer, tokenizer, setup: DecodeSetup, insight: bool = False):
        self.target = target_runner
        self.proposer = proposer
        self.tokenizer = tokenizer
        self.setup = setup
        spec = setup.sampling
        self.stop_ids = set(spec.stop_token_ids) | (set() if spec.ignore_eos else set(setup.eos_ids))
        self.state = SamplingState(spec, setup.width, setup.vocab_size, self.stop_ids, setup.k + 1,
                                   target_runner.device)
        self.stats = AcceptanceStats()  # of the current (or last) run, live while it goes
        # insight: p(x), q(x) and the target's entropy for every drafted token, in greedy mode too
        # (a softmax per round and per draft step); off, the loop computes none of it.
        self.insight = insight
        self.proposer.insight = insight

    def _generator(self) -> torch.Generator:
        gen = torch.Generator(device=self.target.device)
        seed = self.setup.sampling.seed
        gen.manual_seed(seed if seed is not None else int(torch.seed()) % (2**63))
        return gen

    def check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise UsageError("the prompt is empty", hint="give a prompt as an argument or on stdin")
        limit = self.setup.max_context
        need = len(prompt_ids) + self.setup.sampling.max_tokens + self.setup.k + 1
        if limit is not None and need > limit:
            room = limit - self.setup.sampling.max_tokens - self.setup.k - 1
            if room < 1:  # no prompt fits: truncating it cannot help
                raise UsageError(
                    f"max_tokens={self.setup.sampling.max_tokens} leaves no room for a prompt in the "
                    f"model's {limit}-token context (k={self.setup.k} needs {self.setup.k + 1} more)",
                    hint=f"lower --max-tokens below {limit - self.setup.k - 1}",
                )
            raise UsageError(
                f"the prompt has {len(prompt_ids)} tokens but only {max(room, 0)} fit with "
                f"max_tokens={self.setup.sampling.max_tokens} in the model's {limit}-token context",
                hint="shorten the prompt, lower --max-tokens, or pass --truncate-prompt",
            )

    def run(self, prompt_ids: list[int]):
        self.check_prompt(prompt_ids)
        spec = self.setup.sampling
        stats = self.stats = AcceptanceStats()
        gen = self._generator()
        start = time.perf_counter()
        self.target.reset()
        self.target.forward(torch.tensor(prompt_ids[:-1], dtype=torch.long), want_logits=False)
        self.proposer.start(prompt_ids)
        self.state.start(prompt_ids)
        stats.prefill_seconds = time.perf_counter() - start
        text = _TextTracker(IncrementalDetokenizer(self.tokenizer, prompt_ids), spec.stop)
        last = prompt_ids[-1]
        out_ids: list[int] = []
        out_fates: list[Fate] = []
        out_pieces: list[str] = []
        out_logprobs: list[dict] | None = [] if spec.logprobs is not None else None
        index = 0
        while True:
            event, reason = self._round(index, last, stats, gen, text, spec)
            if stats.first_token_seconds is None:
                stats.first_token_seconds = time.perf_counter() - start
            out_ids += event.token_ids
            out_fates += event.fates
            out_pieces += event.pieces
            if out_logprobs is not None:
                out_logprobs += event.logprobs or []
            yield event
            if reason is None and len(out_ids) >= spec.max_tokens:
                reason = "length"
            if reason is not None:
                tail = text.finish(reason == "stop")
                yield Finished(reason, text.released, out_ids, out_fates, stats, out_pieces, tail, out_logprobs)
                return
            last = event.token_ids[-1]
            index += 1

    def _round(self, index, last, stats, gen, text, spec):
        t0 = time.perf_counter()
        remaining = spec.max_tokens - self.state.generated
        asked = min(self.setup.k, remaining - 1)
        proposal = self.proposer.propose(asked, self.state, gen)
        n = len(proposal)
        k_used = asked if proposal.k is None else proposal.k
        t1 = time.perf_counter()
        feed = torch.cat([torch.tensor([last], device=proposal.token_ids.device), proposal.token_ids])
        logits = self.target.forward(feed)  # [n+1, V]
        t2 = time.perf_counter()
        emitted, target_p, logprobs = self._verify(logits, proposal, gen, spec)
        t3 = time.perf_counter()
        insight = self._insight(logits, proposal) if self.insight else None  # before commit moves the state
        num_accepted = len(emitted) - 1
        fates = [Fate.ACCEPTED] * num_accepted + [Fate.BONUS if num_accepted == n else Fate.RECOVERED]
        reason, emitted, fates = self._stop_tokens(emitted, fates)
        kept_accepted = min(num_accepted, len(emitted))
        if logprobs is not None:
            logprobs = logprobs[: len(emitted)]
        self.state.commit(emitted)
        if reason is None:
            self.target.truncate(self.target.length - n + num_accepted)
            self.proposer.commit(num_accepted, emitted[-1])
        pieces = [text.detok.add([t]) for t in emitted]
        delta, stop_hit = text.add("".join(pieces))
        if stop_hit and reason is None:
            reason = "stop"
        t4 = time.perf_counter()
        timings = {"draft": t1 - t0, "verify": t2 - t1, "sample": t3 - t2, "other": t4 - t3}
        early_stop = n < k_used
        stats.add_round(n, kept_accepted, len(emitted), timings, early_stop=early_stop, k_used=k_used)
        event = RoundEvent(index, emitted, fates, delta, pieces, n, kept_accepted, proposal.token_ids.tolist(), timings,
                           proposal.token_q, target_p, logprobs, k_used=k_used, early_stop=early_stop)
        if insight is not None:
            event.target_p, event.target_entropy = insight
        return event, reason

    def _insight(self, logits, proposal) -> tuple[list[float], list[float]]:
        """p(x) of each drafted token and the entropy of p at its position. p is the warped target
        distribution; for greedy rows, the softmax of the penalised logits (as for logprobs)."""
        n = len(proposal)
        rows = self.state.rows(proposal.token_ids)
        p = logprobs_from_logits(logits, rows.params, rows.penalties, rows.bad_mask)[:n].exp()  # [n, V]
        entropy = torch.special.entr(p).sum(dim=-1)  # entr(0) = 0
        return p[torch.arange(n, device=p.device), proposal.token_ids].tolist(), entropy.tolist()

    def _verify(self, logits, proposal, gen, spec):
        n = len(proposal)
        rows = self.state.rows(proposal.token_ids)
        argmax, probs = verifier.warp(logits, rows.params, rows.penalties, rows.bad_mask)
        cu = torch.tensor([n], dtype=torch.int32, device=logits.device)
        if probs is None:
            out = verifier.verify_greedy(proposal.token_ids, cu, argmax, n)
            target_p = None
        else:
            u = uniforms((n,), gen, logits.device)
            e = exponentials((1, probs.shape[-1]), gen, logits.device)
            out = verifier.verify_random(proposal.token_ids, cu, proposal.probs, probs, u, e, n)
            target_p = probs[torch.arange(n), proposal.token_ids].tolist() if n else []
        emitted = verifier.emitted(out)[0]  # the one host read; raises on a kernel error flag
        logprobs = None
        if spec.logprobs is not None:
            logprobs = self._logprobs(logits, rows, emitted, spec.logprobs)
        return emitted, target_p, logprobs

    def _logprobs(self, logits, rows, emitted, top_n):
        logp = logprobs_from_logits(logits, rows.params, rows.penalties, rows.bad_mask)[: len(emitted)]
        chosen = logp[torch.arange(len(emitted)), torch.tensor(emitted)].tolist()
        entries = []
        top = logp.topk(top_n, dim=-1) if top_n > 0 else None
        for i, token in enumerate(emitted):
            entry = {"token_id": token, "logprob": chosen[i]}
            if top is not None:
                entry["top"] = [{"token_id": int(t), "logprob": float(v)}
                                for v, t in zip(top.values[i].tolist(), top.indices[i].tolist())]
            entries.append(entry)
        return entries

    def _stop_tokens(self, emitted, fates):
        """Cut the round after the first stop token (EOS unless ignore_eos, or a stop_token_id)."""
        for i, token in enumerate(emitted):
            if token in self.stop_ids:
                reason = "stop_token" if token in self.setup.sampling.stop_token_ids else "eos"
                return reason, emitted[: i + 1], fates[: i + 1]
        return None, emitted, fates


class _TextTracker:
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
