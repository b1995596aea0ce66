"""The steady-state round as ONE device program: k draft steps, the target's (k+1)-token step,
warp, verification and the cache rollback, captured as a single CUDA graph.

GraphDecoder's per-phase round launches every draft step, pick, warp and verify kernel from Python;
at batch 1 those launches (tens of microseconds each) cost more than the GPU work they start. Here
the host replays one graph per round and reads its result once.

What makes a whole round static:

- the draft cache always holds the committed sequence minus its LAST TWO tokens, and every round
  starts with the draft's 2-token step over those two (`pending`). After a round with a rejection
  the older of the two was already in the draft cache: it is fed again at the same position and
  its K/V rewritten from the same inputs, so nothing depends on how the previous round ended;
- drafted ids are picked on the device straight into the target's input buffer `feed`
  ([last, d0 .. d(k-1)]), and the draft's next step reads them from there;
- after verification the graph itself rolls both caches back: with m = emitted tokens, both
  positions move back by k + 1 - m (target: `last` and the m - 1 accepted drafts stay; draft: the
  new committed sequence minus two), and it writes the next round's `pending` (the new
  committed[-2:]) and `feed[0]` (the new last token) from the verify output. The host only keeps
  its own length counters in step;
- random draws (temperature > 0) are drawn by the host into static buffers in exactly the order
  and shapes of the core loop (one Exp(1) row per draft step, then the uniforms, then the recovery
  row), so a seed gives the same text on every path. After a fused round's replay the decoder
  draws the next round's numbers (predraw), queued behind the replay, so their launches overlap
  the round on the device; if the next round turns out not to be fused, the generator goes back
  to its state before those draws. The round's Exp(1) rows share one buffer and one clamp;
- what the host reads (verify output, drafts, p(d_i), q(d_i)) is staged by the graph into two
  static buffers, so a round ends with one device-to-host copy per dtype and no host-side gather.

Rounds that do not fit (penalties, min_tokens masks, the last rounds that draft fewer than k,
prompts of one token, adaptive k or draft_p_min proposers, n-gram) run GraphDecoder's per-phase
round; the two hand the draft state over in both directions (enter / leave).

Without CUDA graphs (CPU tests, models that cannot be captured) the same body runs eagerly, so
CI checks the logic, and tests/test_gpu.py the capture.
"""

from __future__ import annotations

import warnings

import torch

from specgen.core import sampling, verifier
from specgen.core.proposers import Proposal
from specgen.core.sampling import WarpParams
from specgen.core.state import RoundRows, draft_spec
from specgen.gpu.loop import pick

WARMUP_ROUNDS = 2  # eager rounds before capture: Triton JIT, cuBLAS, torch.compile guards


class FusedRound:
    """The fused round for one (runners, k, sampling) combination: built and captured once, then
    shared by every decoder of the engine with those settings (FusedRound.get). It owns its static
    buffers; a decoder hands it its proposer's state on enter/leave."""

    def __init__(self, target, draft, k: int, sample: bool, spec, width: int, vocab_size: int, cut: bool = True):
        self.target = target
        self.draft = draft  # the draft's GraphRunner, or None (target-only, k = 0)
        self.k = k
        device = target.device
        self.device = device
        self.feed = torch.zeros(k + 1, dtype=torch.long, device=device)  # last, d0 .. d(k-1)
        self.drafts = self.feed[1 : k + 1]  # the graph writes the drafts here
        self.pending = torch.zeros(2, dtype=torch.long, device=device)  # committed[-2:]
        self.cu = torch.tensor([k], dtype=torch.int32, device=device)
        self.index = torch.arange(k, device=device)
        params = WarpParams.from_spec(spec, k + 1, device)
        padding = None
        if vocab_size < width:  # as SamplingState: columns with no token behind them
            padding = torch.zeros(width, dtype=torch.bool, device=device)
            padding[vocab_size:] = True
        # static rows: no penalties and no min_tokens mask (eligible() keeps such rounds out)
        self.rows = RoundRows(params.slice(0, k + 1), None, padding)
        self.draft_row = RoundRows(params.slice(0, 1) if cut else WarpParams.from_spec(draft_spec(spec, False), 1, device),
                                   None, padding)
        self.greedy = params.flags.all_greedy
        self.sample = draft is not None and sample and not self.greedy
        self.target_logits = torch.full((k + 1, width), float("-inf"), dtype=torch.float32, device=device)
        self.draft_logits = {n: torch.full((n, width), float("-inf"), dtype=torch.float32, device=device)
                             for n in (1, 2)} if draft is not None else {}
        if not self.greedy:
            self.uniform = torch.ones(k, dtype=torch.float32, device=device)
            # Exp(1) rows: one per draft step (sampled drafts), then the target's recovery row, in
            # one buffer so that a single clamp covers them all (draw())
            self.noise = torch.ones(k * self.sample + 1, width, dtype=torch.float32, device=device)
            self.expo_target = self.noise[-1:]
            self.expo_draft = self.noise[:-1]
        if self.sample:
            self.q = torch.zeros(k, width, dtype=torch.float32, device=device)
        # what the host reads after a round, staged inside the graph so that it takes one copy per
        # dtype: [verify output (k+1) | drafts (k)] and [p(d_i) (k) | q(d_i) (k, sampled drafts)]
        self.stage_ids = torch.zeros(2 * k + 1, dtype=torch.long, device=device)
        self.stage_p = None if self.greedy else torch.zeros(k * (1 + self.sample), dtype=torch.float32, device=device)
        self.graph = None
        self.generation = ()
        self.raws: list = []
        self.graph_failed = False
        self.events: list = []  # CUDA timing events captured inside the graph (empty: not split)
        self.keep: list = []  # tensors the graph reads or writes that nothing else holds
        self.out = None  # [1, k+1] verify output (the graph's own buffer once captured)
        self.target_p = None  # [k] p(d_i) (random verification only)
        self.use_graph = getattr(target, "use_graphs", False) and (draft is None or getattr(draft, "use_graphs", False))

    # -- when it applies ------------------------------------------------------------------------

    @classmethod
    def get(cls, decoder, proposer) -> "FusedRound | None":
        """The engine's fused round for this decoder's settings (made on first use), or None when
        its proposer's rounds cannot all be one program (n-gram, adaptive k, draft_p_min, eager runners)."""
        from specgen.gpu.loop import GraphDraftProposer  # noqa: PLC0415

        target = decoder.target
        if not hasattr(target, "step"):
            return None
        cut = True
        if proposer.kind == "none":
            draft, k, sample = None, 0, False
        elif isinstance(proposer, GraphDraftProposer) and proposer.adaptive is None and hasattr(proposer.runner, "step"):
            draft, k, sample, cut = proposer.runner, decoder.setup.k, proposer.sample, proposer.cut
        else:
            return None
        spec = decoder.setup.sampling
        key = (id(draft), k, sample, cut, spec.temperature, spec.top_k, spec.top_p, spec.min_p)
        rounds = target.__dict__.setdefault("fused_rounds", {})
        if key not in rounds:
            rounds[key] = cls(target, draft, k, sample, spec, decoder.setup.width, decoder.setup.vocab_size, cut)
        return rounds[key]

    def eligible(self, asked: int, committed: int, state, proposer) -> bool:
        """This round can be the fused one: full k, no penalties, min_tokens satisfied, >= 2 tokens."""
        if asked != self.k or state.use_penalties or state.spec.min_tokens > state.generated:
            return False
        if self.draft is None:
            return committed >= 1
        return committed >= 2 and proposer.num_pending <= 2

    # -- hand-over with GraphDraftProposer's bookkeeping ----------------------------------------

    def enter(self, tail: list[int]) -> None:
        """Set the fused state from the host: tail = the committed sequence's last two ids."""
        self.feed[0].fill_(tail[-1])
        if self.draft is None:
            return
        committed = self.target.length + 1
        self.draft.truncate(committed - 2)  # the cache holds committed[:-num_pending] (num_pending <= 2)
        self.pending[0].fill_(tail[-2])
        self.pending[1].fill_(tail[-1])

    def leave(self, proposer) -> None:
        """Back to the per-phase round: the draft cache holds committed[:-2], pending the rest."""
        if self.draft is None:
            return
        proposer.pending[0:2].copy_(self.pending)
        proposer.num_pending = 2

    # -- a round ----------------------------------------------------------------------------------

    def draw(self, gen: torch.Generator) -> None:
        """The round's random numbers, in the core loop's order and shapes, drawn in place: the
        values of sampling.exponentials_ per row, with its clamp done once for all rows (the clamp
        draws nothing, so the generator moves exactly as in the core loop)."""
        if self.greedy:
            return
        if self.sample:
            for i in range(self.k):
                self.expo_draft[i : i + 1].exponential_(generator=gen)
        sampling.uniforms_(self.uniform, gen)
        self.expo_target.exponential_(generator=gen)
        self.noise.clamp_min_(sampling.MIN_EXPONENTIAL)

    def ready(self) -> bool:
        """Captured (or capturable now), or running eagerly by design; False after a failed capture."""
        if not self.use_graph:
            return True
        if self.graph is not None and self.generation != self._generations():
            self.graph = None  # a runner re-allocated its cache (a longer request): capture again
        if self.graph is None and not self.graph_failed:
            self._capture()
        return self.graph is not None

    def launch(self, gen: torch.Generator, clock, drawn: bool = False) -> Proposal:
        """Queue one round (no sync). Returns the proposal view the decoder reports from.
        drawn: this round's random numbers are in the buffers already (predraw)."""
        if not drawn:
            self.draw(gen)
        if self.graph is not None:
            clock.start_graph(self.events)
            self.graph.replay()
        else:
            clock.begin()
            with torch.inference_mode():
                self.out, self.target_p = self._body(clock.mark)
        return Proposal(self.drafts, self.q if self.sample else None, k=self.k)

    def predraw(self, gen: torch.Generator):
        """Draw the NEXT round's random numbers now, queued behind this round's replay (which has
        read the buffers by then): the host launches them while the device runs the round, instead
        of between the round's sync and the next replay. Returns the generator's state before the
        draws (None when greedy: nothing drawn), for the decoder to restore if the next round is
        not a fused one, so a seed gives the same draws in the same order on every path."""
        if self.greedy:
            return None
        state = gen.get_state()
        self.draw(gen)
        return state

    def queue_copies(self, host_ids: torch.Tensor, host_probs: torch.Tensor) -> None:
        """The round's results into the decoder's pinned buffers, in GraphDecoder._fetch's layout
        (non-blocking; the round's timing events are recorded after these)."""
        host_ids[: self.stage_ids.numel()].copy_(self.stage_ids, non_blocking=True)
        if self.stage_p is not None and self.stage_p.numel():
            host_probs[: self.stage_p.numel()].copy_(self.stage_p, non_blocking=True)

    def _generations(self) -> tuple:
        return tuple(getattr(r, "generation", 0) for r in (self.target, self.draft) if r is not None)

    def commit(self, emitted: int) -> None:
        """Host lengths after a round that emitted `emitted` tokens (the device moved already):
        the target keeps `last` and the accepted drafts, the draft its committed sequence minus two."""
        self.target.length += emitted
        if self.draft is not None:
            self.draft.length += emitted

    def _body(self, mark):
        """The round on the device. mark() is called between phases (timing)."""
        k, feed = self.k, self.feed
        self.raws = []  # every tensor the round allocates: a captured graph's buffers stay owned
        mark()
        ids = self.pending
        for i in range(k):
            n = ids.shape[0]
            with self.draft.step_context(n):
                self.raws.append(self.draft.step(ids, self.draft_logits[n]))
            token = feed[1 + i : 2 + i]
            expo = self.expo_draft[i : i + 1] if self.sample else None
            probs = pick(self.draft_logits[n][n - 1 :], self.draft_row, self.sample, None, token, expo)
            if probs is not None:
                self.q[i : i + 1].copy_(probs)
            ids = token
        mark()
        with self.target.step_context(k + 1):
            self.raws.append(self.target.step(feed, self.target_logits))
        mark()
        argmax, probs = verifier.warp(self.target_logits, self.rows.params, None, self.rows.bad_mask)
        self.raws += [argmax, probs]
        cu = self.cu
        target_p = None  # q(d_i) is gathered by the decoder's copies, from self.q
        if probs is None:
            out = verifier.verify_greedy(self.drafts, cu, argmax, k)
        else:
            q = self.q if self.sample else None
            out = verifier.verify_random(self.drafts, cu, q, probs, self.uniform, self.expo_target, k)
            index = self.index
            target_p = probs[index, self.drafts]
            picked = [target_p, self.q[index, self.drafts]] if self.sample else [target_p]
            self.raws += picked
            torch.cat(picked, out=self.stage_p)
        torch.cat([out[0], self.drafts], out=self.stage_ids)  # before the rollback rewrites feed[0]
        self._roll_back(out)
        mark()
        return out, target_p

    def _roll_back(self, out: torch.Tensor) -> None:
        """Both caches back to the accepted length; the next round's inputs from this one's output."""
        emitted = (out[0] >= 0).sum()  # m = accepted + 1 (an error sentinel makes it garbage: the host raises)
        back = (self.k + 1) - emitted
        self.target.position.sub_(back)
        last_index = (emitted - 1).clamp(0, self.k).view(1)
        newest = out[0].index_select(0, last_index)  # the recovered or bonus token
        if self.draft is not None:
            self.draft.position.sub_(back)
            self.pending[0:1].copy_(self.feed.index_select(0, last_index))  # last accepted (or `last`)
            self.pending[1:2].copy_(newest)
        self.feed[0:1].copy_(newest)

    def _capture(self) -> None:
        """Warm up at scratch positions, restore the state, capture with timing events inside
        (without them if this CUDA/torch cannot); if neither captures, warn once and let the
        per-phase round run."""
        runners = [r for r in (self.target, self.draft) if r is not None]
        saved = [r.position.clone() for r in runners] + [self.feed.clone(), self.pending.clone()]
        error = None
        for timed in (True, False):
            try:
                self._warm_up(runners)
                self._restore(runners, saved)
                events = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(4)] if timed else []
                marks = iter(events)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph), torch.inference_mode():
                    self.out, self.target_p = self._body(
                        (lambda: next(marks).record()) if timed else (lambda: None))
            except Exception as exc:  # noqa: BLE001 (whatever the capture raises: try without events, then give up)
                error = exc
                torch.cuda.synchronize(self.device)
                self._restore(runners, saved)
                continue
            self._restore(runners, saved)
            self.graph, self.events, self.generation = graph, events, self._generations()
            from specgen.gpu import verify as gpu_verify  # noqa: PLC0415
            from specgen.gpu import warp as gpu_warp  # noqa: PLC0415

            # the kernels' cached scratch buffers: held so a later resize cannot free what replays use
            self.keep = list(gpu_warp._workspaces.values()) + [t for p in gpu_verify._scratch.values() for t in p]
            return
        self.graph_failed = True
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(f"could not capture the fused round ({type(error).__name__}: {first}); "
                      "rounds run phase by phase", RuntimeWarning, stacklevel=4)

    def _warm_up(self, runners) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(WARMUP_ROUNDS):
                for r in runners:
                    r.position.fill_(r.capacity - (self.k + 3))  # scratch: never a live position
                self._body(lambda: None)
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def _restore(self, runners, saved) -> None:
        for r, position in zip(runners, saved):
            r.position.copy_(position)
        self.feed.copy_(saved[-2])
        self.pending.copy_(saved[-1])

