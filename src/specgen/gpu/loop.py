"""The round on a GPU: tensors between proposer, target and verifier, ONE host sync per round.

GraphDecoder runs core Decoder's loop with its own round:

- draft: GraphDraftProposer replays the draft's 1-token graph k times (its 2-token catch-up graph
  first after a fully accepted round). Each drafted id is picked on the device (argmax, or the
  exponential race on q) straight into a static buffer that is the next step's input. There is no
  stop-token check per step: a drafted stop id is found after the round's sync, and whatever was
  drafted after it counts as never drafted (the emitted tokens are cut there anyway).
- verify: the target scores [last, d0 .. d(k-1)] with its (k+1)-token graph. Rounds that draft
  fewer (the last ones, n-gram misses) pad the feed: one shape serves every round, and the padded
  positions land past the cache's kept length, where the next forward overwrites them.
- sample: core.verifier's warp and verify (the Triton kernels on CUDA). They report NaN logits
  and all-masked rows through a sentinel in the output row, read with the round's sync.
- sync: emitted and drafted ids come back through pinned buffers, once. Rollback then moves both
  cache positions to values the host now knows (fill_: no sync).

Timing: CUDA events split draft / verify / sample on the device's clock; "other" is the rest of the
round's wall time (host bookkeeping, detokenizing, the sync itself).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch

from specgen.core import sampling, verifier
from specgen.core.decode import Decoder, Fate, RoundEvent
from specgen.core.proposers import DraftModelProposer, Proposal
from specgen.core.rejection import PLACEHOLDER

FUSED = True  # steady-state rounds as one program (gpu/fused.py); False: always phase by phase
PREDRAW = True  # draw a fused round's random numbers behind the previous round (FusedRound.predraw)
MAX_K = 32  # the profile's upper bound for speculation.k
PROMPT_ROOM = 512  # prompt positions allocated at start-up; reserve() grows the caches beyond


def pick(logits: torch.Tensor, rows, sample: bool, generator, out: torch.Tensor,
         expo: torch.Tensor | None = None) -> torch.Tensor | None:
    """The draft's next id into `out` [1]; returns its q row [1, V] when drawn from q, else None.
    expo: the Exp(1) row for the race, drawn beforehand (a captured round); None draws it here."""
    plain = rows.penalties is None and rows.bad_mask is None
    if plain and (not sample or rows.params.flags.all_greedy):  # the whole warp chain is the argmax
        torch.argmax(logits, dim=-1, out=out)
        return None
    if plain and sample and expo is not None:  # a captured round: warp and race in one go
        return verifier.warp_and_race(logits, rows.params, expo, out)
    argmax, probs = verifier.warp(logits, rows.params, rows.penalties, rows.bad_mask)
    if not sample or probs is None:
        out.copy_(argmax)
        return None
    if expo is None:
        expo = sampling.exponentials(probs.shape, generator, logits.device)
    out.copy_(sampling.sample_race(probs, expo))
    return probs


_warmed: set = set()


def warm_kernels(state, k: int, device: torch.device) -> None:
    """Compile (Triton JIT) the warp and verify kernels for every round size 0..k and for the
    draft's one-row pick now, once per process and settings, instead of in the first request
    whose last rounds draft fewer than k (a timed one: ~0.1 s per new kernel shape)."""
    if device.type != "cuda" or not verifier.use_triton(device):
        return
    key = (str(device), k, state.params.flags, state.width, state.use_penalties)
    if key in _warmed:
        return
    _warmed.add(key)
    width = state.width
    for n in range(k + 1):
        drafts = torch.zeros(n, dtype=torch.long, device=device)
        rows = state.rows(drafts)
        argmax, probs = verifier.warp(torch.zeros(n + 1, width, device=device), rows.params, rows.penalties,
                                      rows.bad_mask)
        cu = torch.tensor([n], dtype=torch.int32, device=device)
        if probs is None:
            verifier.verify_greedy(drafts, cu, argmax, n)
            continue
        u, e = torch.ones(n, device=device), torch.ones(1, width, device=device)
        verifier.verify_random(drafts, cu, probs[:n].contiguous(), probs, u, e, n)  # sampled drafts
        verifier.verify_random(drafts, cu, None, probs, u, e, n)  # one-hot q (argmax drafts, n-gram)
    for cut in (True, False):  # the draft's pick, with and without the request's cut (draft_spec)
        row = state.last_row(torch.zeros(0, dtype=torch.long, device=device), cut)
        verifier.warp(torch.zeros(1, width, device=device), row.params, row.penalties, row.bad_mask)
    torch.cuda.synchronize(device)


class GraphDraftProposer:
    """DraftModelProposer's protocol and cache discipline, with device-side picks and no syncs.

    The draft cache holds the committed sequence except its `num_pending` last tokens, which are
    fed first in the next round (two after a fully accepted round: the catch-up step).
    adaptive_k as in DraftModelProposer (a host-side budget per round, no sync).
    """

    kind = "draft"

    def __init__(self, runner, sample: bool, stop_ids: set[int], adaptive_k: bool = False, cut: bool = True):
        from specgen.core.proposers import AdaptiveK  # noqa: PLC0415

        self.runner = runner
        self.sample = sample
        self.cut = cut  # as DraftModelProposer.cut
        self.stop_ids = stop_ids  # checked by the decoder after the round's sync
        self.adaptive = AdaptiveK() if adaptive_k else None
        device = runner.device
        self.tokens = torch.zeros(MAX_K + 1, dtype=torch.long, device=device)  # [k] drafted ids
        self.pending = torch.zeros(3, dtype=torch.long, device=device)
        self.num_pending = 0
        self.num_drafted = 0

    def start(self, prompt_ids: list[int]) -> None:
        self.runner.reset()
        self.runner.forward(torch.tensor(prompt_ids[:-1], dtype=torch.long), want_logits=False)
        self.pending[0].fill_(prompt_ids[-1])
        self.num_pending = 1
        if self.adaptive is not None:
            self.adaptive = type(self.adaptive)()

    def propose(self, k: int, state, generator) -> Proposal:
        k = self.adaptive.budget(k) if self.adaptive is not None else k
        feed = self.pending[: self.num_pending]
        q_rows = []
        same = not state.use_penalties and state.spec.min_tokens <= state.generated  # every step's row alike
        row = state.last_row(self.tokens[:0], self.cut) if same else None
        for i in range(k):
            logits = self.runner.forward(feed)[-1:]  # [1, V]
            token = self.tokens[i : i + 1]
            probs = pick(logits, row or state.last_row(self.tokens[:i], self.cut), self.sample, generator, token)
            if probs is not None:
                q_rows.append(probs)
            feed = token
        self.num_drafted = k
        return Proposal(self.tokens[:k], torch.cat(q_rows) if q_rows else None, k=k)

    def commit(self, num_accepted: int, next_token: int) -> None:
        n = self.num_drafted
        if self.adaptive is not None and n > 0:
            self.adaptive.update(num_accepted)
        if n == 0:
            self.pending[self.num_pending].fill_(next_token)
            self.num_pending += 1
        elif num_accepted == n:  # the last draft never went through the draft model
            self.pending[0:1].copy_(self.tokens[n - 1 : n])
            self.pending[1].fill_(next_token)
            self.num_pending = 2
        else:  # the cache holds pending + drafted[:n-1]; keep pending + drafted[:num_accepted]
            self.runner.truncate(self.runner.length - (n - 1) + num_accepted)
            self.pending[0].fill_(next_token)
            self.num_pending = 1


class RoundClock:
    """Device phases of a round, timed with CUDA events read after its sync (wall time on CPU).

    Per-phase rounds record events between their launches; a fused round's graph carries its own
    (captured) events, handed over by start_graph. `finish` marks the end of everything queued for
    the round, copies to the host included: `wait` is the round's one sync.
    """

    PHASES = ("draft", "verify", "sample")

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if self.cuda else []
        self.done = torch.cuda.Event(enable_timing=True) if self.cuda else None
        self.inner: list = []  # a fused graph's own events (empty: per-phase marks)
        self.marks: list[float] = []

    def start(self) -> None:
        self.begin()
        self.mark()

    def begin(self) -> None:
        """A round whose phases mark themselves (the fused body run eagerly)."""
        self.inner = []
        self.marks = []

    def start_graph(self, events: list) -> None:
        """A fused round replayed as one graph; without captured events, time the whole replay."""
        self.begin()
        self.inner = events
        if not events:
            self.mark()

    def mark(self) -> None:
        if self.cuda:
            self.events[len(self.marks)].record()
        self.marks.append(time.perf_counter())

    def finish(self) -> None:
        if self.cuda:
            self.done.record()
        self.marks.append(time.perf_counter())

    def wait(self) -> None:
        """The round's one device-to-host synchronisation."""
        if self.cuda:
            self.done.synchronize()

    def spans(self) -> dict[str, float]:
        if self.inner:
            spans = [self.inner[i].elapsed_time(self.inner[i + 1]) / 1e3 for i in range(3)]
        elif self.cuda and len(self.marks) == 2:  # a graph without inner events: one device span
            spans = [0.0, self.events[0].elapsed_time(self.done) / 1e3, 0.0]
        elif self.cuda:
            spans = [self.events[i].elapsed_time(self.events[i + 1]) / 1e3 for i in range(3)]
        else:
            spans = [self.marks[i + 1] - self.marks[i] for i in range(3)]
        return dict(zip(self.PHASES, spans))


@dataclass
class _Launched:
    """A round queued on the device, waiting for its one sync."""

    proposal: Proposal
    k_used: int
    kept: int  # target cache length to keep before the accepted drafts (`last` included)
    logits: torch.Tensor  # [n+1, V]: the target graph's buffer, valid until the next launch
    rows: object  # the round's RoundRows
    out: torch.Tensor  # [1, n+1] verifier output
    fused: bool = False  # the whole round was one FusedRound program (it rolled the caches back itself)


class GraphDecoder(Decoder):
    """core Decoder with the GPU round (see the module docstring); the same events and results.

    Rounds are pipelined one deep: as soon as a round's sync says what was accepted, the caches
    roll back and the NEXT round is queued on the device; detokenizing, stop strings and the
    event are done while it runs. The draws happen in the core loop's order, so a seed gives the
    same text. A round queued after a stop string is abandoned (the next run resets everything).
    "other" is the wall time between two rounds' ends minus the device phases, so the four
    phases add up to the decode time.
    """

    def __init__(self, target_runner, proposer, tokenizer, setup, insight: bool = False):
        if insight:
            raise ValueError("insight decoding reads host values per step: use core Decoder")
        super().__init__(target_runner, proposer, tokenizer, setup)
        device = target_runner.device
        k = setup.k
        if hasattr(target_runner, "add_shapes"):
            target_runner.add_shapes([k + 1])
        self.feed = torch.zeros(k + 1, dtype=torch.long, device=device)  # [k+1] last, d0 .. d(k-1)
        self.cu = [torch.tensor([n], dtype=torch.int32, device=device) for n in range(k + 1)]
        self.rows_index = torch.arange(k, device=device)
        pin = device.type == "cuda"
        self.host_ids = torch.zeros(2 * k + 2, dtype=torch.long, pin_memory=pin)
        self.host_probs = torch.zeros(2 * k, dtype=torch.float32, pin_memory=pin)
        self.clock = RoundClock(device)
        self.launched: _Launched | None = None
        self.round_end = 0.0
        from specgen.gpu.fused import FusedRound  # noqa: PLC0415

        self.fused = FusedRound.get(self, proposer)  # the steady-state round as one program (gpu/fused.py)
        warm_kernels(self.state, k, device)
        self.fused_active = False  # the draft state is the fused round's (see FusedRound.enter)
        self.predrawn = None  # generator state before the next fused round's draws (FusedRound.predraw)
        self.tail: list[int] = []  # the committed sequence's last two ids

    def run(self, prompt_ids: list[int]):
        self.check_prompt(prompt_ids)
        positions = len(prompt_ids) + self.setup.sampling.max_tokens + self.setup.k + 1
        for runner in (self.target, getattr(self.proposer, "runner", None)):
            if hasattr(runner, "reserve"):
                runner.reserve(positions)
        self.launched = None
        self.fused_active = False
        self.predrawn = None
        self.tail = list(prompt_ids[-2:])
        yield from super().run(prompt_ids)

    def _launch(self, last: int, gen, spec) -> _Launched:
        """Queue a whole round (draft, target, verify, copies to the host); no sync."""
        clock = self.clock
        remaining = spec.max_tokens - self.state.generated
        asked = min(self.setup.k, remaining - 1)
        fused = self.fused
        if FUSED and fused is not None and fused.eligible(asked, self.target.length + 1, self.state, self.proposer) \
                and fused.ready():
            if not self.fused_active:
                fused.enter(self.tail)
                self.fused_active = True
            kept = self.target.length + 1
            proposal = fused.launch(gen, clock, drawn=self.predrawn is not None)
            fused.queue_copies(self.host_ids, self.host_probs)
            clock.finish()
            self.predrawn = fused.predraw(gen) if PREDRAW else None  # the next round's draws, behind this one
            return _Launched(proposal, fused.k, kept, fused.target_logits, fused.rows, fused.out, fused=True)
        if self.predrawn is not None:  # drawn for a fused round that is not coming: undo the draws
            gen.set_state(self.predrawn)
            self.predrawn = None
        if self.fused_active:
            fused.leave(self.proposer)
            self.fused_active = False
        clock.start()
        proposal = self.proposer.propose(asked, self.state, gen)
        n = len(proposal)
        clock.mark()
        self.feed[0].fill_(last)
        if n:
            self.feed[1 : n + 1].copy_(proposal.token_ids)
        kept = self.target.length + 1
        logits = self.target.forward(self.feed)[: n + 1]  # [n+1, V]
        clock.mark()
        rows = self.state.rows(proposal.token_ids)
        out, target_p = self._verify_on_device(logits, rows, proposal, gen)
        self._queue_copies(out, proposal, target_p)
        clock.mark()
        clock.finish()
        k_used = asked if proposal.k is None else proposal.k
        return _Launched(proposal, k_used, kept, logits, rows, out)

    def _round(self, index, last, stats, gen, text, spec):
        if self.launched is None:  # the first round of a run
            self.round_end = time.perf_counter()
            self.launched = self._launch(last, gen, spec)
        round_, self.launched = self.launched, None
        proposal, out = round_.proposal, round_.out
        n = len(proposal)
        out_ids, drafted, target_p, token_q = self._fetch(n, out.shape[1], round_)
        spans = self.clock.spans()
        if out_ids[0] < PLACEHOLDER:  # an error sentinel from the kernels: emitted() raises it
            verifier.emitted(out)
        emitted = [t for t in out_ids if t >= 0]
        num_accepted = len(emitted) - 1
        drafted = self._cut_at_stop(drafted)
        fates = [Fate.ACCEPTED] * num_accepted + [Fate.BONUS if num_accepted == n else Fate.RECOVERED]
        reason, emitted, fates = self._stop_tokens(emitted, fates)
        kept_accepted = min(num_accepted, len(emitted))
        logprobs = None
        if spec.logprobs is not None:  # before the next launch overwrites the logits
            logprobs = self._logprobs(round_.logits, round_.rows, emitted, spec.logprobs)
        self.state.commit(out[0, : len(emitted)])
        if reason is None:
            if round_.fused:
                self.fused.commit(num_accepted + 1)
            else:
                self.target.truncate(round_.kept + num_accepted)
                self.proposer.commit(num_accepted, emitted[-1])
            self.tail = (self.tail + emitted)[-2:]
            if self.state.generated < spec.max_tokens:
                self.launched = self._launch(emitted[-1], gen, spec)
        pieces = [text.detok.add([t]) for t in emitted]
        delta, stop_hit = text.add("".join(pieces))
        if stop_hit and reason is None:
            reason = "stop"
            self.launched = None
        now = time.perf_counter()
        timings = {**spans, "other": max(0.0, now - self.round_end - sum(spans.values()))}
        self.round_end = now
        used = len(drafted)
        early_stop = used < round_.k_used
        stats.add_round(used, kept_accepted, len(emitted), timings, early_stop=early_stop, k_used=round_.k_used)
        event = RoundEvent(index, emitted, fates, delta, pieces, used, kept_accepted, drafted, timings,
                           token_q and token_q[:used], target_p and target_p[:used], logprobs,
                           k_used=round_.k_used, early_stop=early_stop)
        return event, reason

    def _verify_on_device(self, logits, rows, proposal, gen):
        """(output ids [1, n+1], p of each draft [n] or None), queued without a host sync."""
        n = len(proposal)
        argmax, probs = verifier.warp(logits, rows.params, rows.penalties, rows.bad_mask)
        if probs is None:
            return verifier.verify_greedy(proposal.token_ids, self.cu[n], argmax, n), None
        u = sampling.uniforms((n,), gen, logits.device)
        e = sampling.exponentials((1, probs.shape[-1]), gen, logits.device)
        out = verifier.verify_random(proposal.token_ids, self.cu[n], proposal.probs, probs, u, e, n)
        return out, probs[self.rows_index[:n], proposal.token_ids]

    def _queue_copies(self, out, proposal, target_p) -> None:
        """Everything the host needs from the round, into pinned buffers (non-blocking)."""
        n = len(proposal)
        width = out.shape[1]
        self.host_ids[:width].copy_(out[0], non_blocking=True)
        self.host_ids[width : width + n].copy_(proposal.token_ids, non_blocking=True)
        if target_p is not None:
            self.host_probs[:n].copy_(target_p, non_blocking=True)
        if proposal.probs is not None:
            q = proposal.probs[self.rows_index[:n], proposal.token_ids]
            self.host_probs[n : 2 * n].copy_(q, non_blocking=True)

    def _fetch(self, n: int, width: int, round_: _Launched):
        """The round's one sync, then plain host reads."""
        self.clock.wait()
        values = self.host_ids[: width + n].tolist()
        sampled = round_.proposal.probs is not None
        p = self.host_probs[:n].tolist() if not round_.rows.params.flags.all_greedy else None
        q = self.host_probs[n : 2 * n].tolist() if sampled else None
        return values[:width], values[width:], p, q

    def _cut_at_stop(self, drafted: list[int]) -> list[int]:
        """Drafts after a drafted stop id were never meant to be proposed."""
        for i, token in enumerate(drafted):
            if token in self.stop_ids:
                return drafted[: i + 1]
        return drafted


@dataclass
class FastPath:
    """What Engine swaps in on CUDA: graph runners, the GPU proposer and the GPU decoder."""

    target: object
    draft: object | None
    decoder_class = GraphDecoder

    @staticmethod
    def adopt(proposer):
        """The GPU twin of a core DraftModelProposer; others as they are (p_min's early stop is a
        host decision per draft step, so that one stays the core proposer, over the same runner)."""
        if isinstance(proposer, DraftModelProposer) and not proposer.p_min > 0:
            return GraphDraftProposer(proposer.runner, proposer.sample, proposer.stop_ids,
                                      adaptive_k=proposer.adaptive is not None, cut=proposer.cut)
        return proposer


def build(pair, width: int, profile, progress=None) -> FastPath | None:
    """Graph runners for a pair on one CUDA device, or None (after one warning) to stay eager."""
    from specgen.gpu import runner as runner_module
    from specgen.gpu.runner import PREFILL_CHUNK, GraphRunner

    if profile.target.device_map is not None or (profile.draft is not None and profile.draft.device_map is not None):
        warnings.warn("a device_map spreads the model over devices: decoding runs eagerly, without CUDA graphs",
                      RuntimeWarning, stacklevel=3)
        return None
    spec = profile.speculation
    capacity = spec.k + 1 + profile.sampling.max_tokens + PROMPT_ROOM

    def runners(use_graphs: bool, attention: bool | None = None, linear: bool | None = None) -> FastPath:
        common = dict(compile=spec.compile and use_graphs, progress=progress, use_graphs=use_graphs,
                      attention=attention, autotune=spec.autotune, linear=linear)
        target = GraphRunner(pair.target, width, capacity, shapes=(1, spec.k + 1, PREFILL_CHUNK), name="target", **common)
        draft = None
        if pair.draft is not None:
            draft = GraphRunner(pair.draft, width, capacity, shapes=(1, 2, PREFILL_CHUNK), name="draft", **common)
        return FastPath(target, draft)

    try:
        return runners(use_graphs=True)
    except Exception as exc:  # noqa: BLE001 (a model that cannot be captured falls back, below)
        failure = exc
    models = [pair.target] + ([pair.draft] if pair.draft is not None else [])
    if any(runner_module.use_kernel(m) or runner_module.use_linear(m) for m in models):
        try:  # the step kernels are an optimisation: captured steps through SDPA and cuBLAS are next best
            fast = runners(use_graphs=True, attention=False, linear=False)
        except Exception as exc:  # noqa: BLE001
            failure = exc
        else:
            warnings.warn(f"the step kernels failed ({_first_line(failure)}); steps use SDPA and cuBLAS",
                          RuntimeWarning, stacklevel=3)
            return fast
    return _eager_runners(runners, failure)


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0]


def _eager_runners(runners, exc: Exception) -> FastPath | None:
    warnings.warn(f"could not capture CUDA graphs for this model ({_first_line(exc)}); decoding runs eagerly",
                  RuntimeWarning, stacklevel=4)
    try:
        return runners(use_graphs=False, attention=False, linear=False)
    except Exception:  # noqa: BLE001 (not even a static cache: the core eager path)
        return None
