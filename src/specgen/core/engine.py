"""From a resolved Profile to a ready decoder: load the pair, pick the backend, build rounds."""

from __future__ import annotations

import platform
from dataclasses import replace
from functools import partial

import torch

from specgen.core.backend import Backend, TorchBackend
from specgen.core.batch_decode import BatchDecoder
from specgen.core.decode import Decoder, DecodeSetup
from specgen.core.errors import UsageError
from specgen.core.drafters.heads import build_heads
from specgen.core.drafters.merge_rule import MergeRule, cost_ratio
from specgen.core.models.loading import LoadedPair, checkpoint_folder, load_pair, logits_width
from specgen.core.drafters.ngram import NgramProposer, TreeLookup
from specgen.core.round import Mode, Round, RoundShape, TreeRound
from specgen.core.round.batch_head import BatchHead
from specgen.core.round.batch_head_tree import BatchHeadTree
from specgen.core.round.batch_hybrid import BatchHybrid
from specgen.core.round.batch_hybrid_tree import BatchHybridTree
from specgen.core.round.batch_lookup import BatchLookup
from specgen.core.round.batch_lookup_tree import BatchLookupTree
from specgen.core.round.batch_round import SLACK, BatchDraftModel, BatchRound
from specgen.core.round.batch_rows import uses_penalties
from specgen.core.round.batch_tree import BatchTreeDraftModel, BatchTreeRound
from specgen.core import batch_cost, measured
from specgen.core.bench import floors
from specgen.core.batch_cost import BatchChoice
from specgen.core.settings import AUTO, TREE_DRAFTERS, TREE_PROPOSERS, Profile
from specgen.core.tree_cost import TreeChoice, choose, regime

PROMPT_ROOM = 512  # prompt positions allocated at start-up; runners grow their caches beyond


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
    """Holds the loaded models, the backend and its runners; hands out decoders for any settings.
    Rounds (their static buffers and captured programs) are built once per shape and shared."""

    def __init__(self, profile: Profile, allow_pickle: bool = False, progress=None,
                 proposers: tuple[str, ...] | None = None, backend: Backend | None = None):
        """progress(done, total, what): start-up steps (CUDA graph capture), for the CLI to show.
        proposers: the kinds this engine serves (default: the profile's); it loads what they draft
        with: the draft model, an EAGLE-3 head, the target's MTP layers. backend: what the rounds
        and runners run on (default: make_backend's pick for the profile's device)."""
        self.profile = profile
        kinds = proposers or (profile.proposer.kind,)
        self.drafters = {profile.proposer.drafter(kind) for kind in kinds} - {"none"}
        self.pair = load_pair(profile, allow_pickle, need_draft="draft" in self.drafters)
        self.width = logits_width(self.pair.target)
        self.eos_ids = eos_ids(self.pair)
        self.max_context = getattr(self.pair.target.config, "max_position_embeddings", None)
        models = (self.pair.target, self.pair.draft)
        self.backend = backend or make_backend(self.pair.device, profile, progress, models)
        capacity = profile.speculation.k + 2 + profile.sampling.max_tokens + PROMPT_ROOM
        runtime = profile.runtime
        tap, self.heads = build_heads(
            self.drafters, profile.proposer, self.pair.target,
            lambda: checkpoint_folder(profile.target, allow_pickle, runtime.download), capacity, self.width,
            eager=self.backend.name == "torch")
        self.target_runner = self.backend.runner(self.pair.target, self.width, capacity, "target", tap=tap)
        # the heads' calls take the target's kernels where the backend has them (after the
        # target's runner: that resolves them), before any round is captured
        self.head_paths = {kind: drafter.accelerate(self.backend) for kind, drafter in self.heads.items()}
        self.draft_runner = None
        if self.pair.draft is not None:
            self.draft_runner = self.backend.runner(self.pair.draft, self.width, capacity, "draft")
        self._rounds: dict[tuple, tuple[Round, dict]] = {}
        self._measured: dict[str, list[dict]] = {}  # by [runtime] measured folder: this pair's rows

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

    def decoder(self, profile: Profile | None = None, proposer_kind: str | None = None,
                insight: bool = False, positions: int | None = None) -> Decoder:
        """A decoder for `profile`'s settings (default: the engine's), optionally another proposer kind;
        insight=True makes its round events carry p(x), q(x) and entropy (inspect-acceptance), and a
        tree round's its tree (core/round/tree_stage.py). positions: the most its generations reach
        (prompt and max_tokens), where known: what tree_width auto weighs trees at (resolve)."""
        profile, choice = self.resolve(profile or self.profile, proposer_kind, positions)
        kind = "none" if choice is not None and not choice.speculate else proposer_kind or profile.proposer.kind
        spec, sampling = profile.proposer, profile.sampling
        drafter = spec.drafter(kind)
        uses_model = drafter != "none"  # a draft model or a head drafts on the device
        if drafter == "draft" and self.draft_runner is None:
            raise UsageError(f"the {kind} proposer needs a draft model", hint="add [draft] or use --proposer ngram")
        if drafter in ("eagle", "mtp") and drafter not in self.heads:
            raise UsageError(f"the {kind} proposer needs the {drafter} drafter, which this run did not load",
                             hint="name every proposer when the run starts (bench --proposer a,b)")
        k = profile.speculation.k if kind != "none" else 0
        sample, cut = draft_picking(profile.speculation.draft_sampling, sampling)
        stop_ids = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else self.eos_ids)
        penalties = (sampling.repetition_penalty != 1.0 or sampling.presence_penalty != 0.0
                     or sampling.frequency_penalty != 0.0)
        rows = ("penalties",) * penalties + ("min_tokens",) * (sampling.min_tokens > 0)
        shape = RoundShape(k=k, width=self.width, vocab_size=self.pair.vocab_size, drafter=drafter,
                           draft_pick=("sample" if cut else "temperature") if uses_model and sample else "argmax",
                           coupling="gumbel" if sampling.coupling == "gumbel" and not sampling.greedy
                           else "rejection", rows=rows, p_min=spec.draft_p_min if uses_model else 0.0,
                           stages=("insight",) * insight)
        shape = replace(shape, **self._tree(profile, kind, k))
        modes = {"ngram": [Mode.HOST], "hybrid": [Mode.MODEL, Mode.HOST]}.get(kind, [Mode.MODEL])
        if kind == "ngram" and shape.tree_width > 1:  # a lookup that found nothing: the root alone
            modes.append(Mode.EMPTY)
        merge = None
        if kind == "hybrid" and shape.tree_width > 1:  # the lookup's trie alone (HOST) or merged
            merge = self.merge_rule(profile.speculation.hybrid_merge, drafter, k)
            modes = [Mode.MODEL] + [mode for mode, off in ((Mode.HOST, "always"), (Mode.MERGED, "never"))
                                    if merge.choice != off]
        rnd, programs = self._round(shape, sampling, sorted(stop_ids), modes)
        lookup = NgramProposer(spec.ngram_min, spec.ngram_max) if kind in ("ngram", "hybrid") else None
        if lookup is not None and shape.tree_width > 1:  # ngram, and hybrid's lookup and merged rounds
            w, n = shape.tree_width, shape.tree_nodes
            if kind == "hybrid":  # a root lane and a node left to the model (core/round/merged_tree.py)
                lookup = TreeLookup(spec.ngram_min, spec.ngram_max, w, n - 1, root_width=w - 1)
            else:
                lookup = TreeLookup(spec.ngram_min, spec.ngram_max, w, n)
        setup = DecodeSetup(sampling=sampling, k=k, eos_ids=self.eos_ids, max_context=self.max_context,
                            pipeline=profile.speculation.pipeline)
        return Decoder(rnd, programs, self.tokenizer, setup, lookup, adaptive_k=uses_model and spec.adaptive_k,
                       merge=merge)

    def merge_rule(self, choice: str, drafter: str, k: int) -> MergeRule:
        """Hybrid trees' merge rule; only auto weighs tokens against the rounds' bytes (merge_ratio)."""
        return MergeRule(choice, self.merge_ratio(drafter, k) if choice == "auto" else 1.0)

    def merge_ratio(self, drafter: str, k: int) -> float:
        """A merged hybrid tree round's weight-streaming floor over a lookup round's
        (core/drafters/merge_rule.py): the draft model's pending pair, k - 1 levels and the commit's
        step against one step, or a head's extend and k - 1 levels against its extend."""
        target = floors.streamed_bytes(self.pair.target)
        if drafter == "draft":
            return cost_ratio(target, floors.streamed_bytes(self.pair.draft), k + 1)
        head = self.heads[drafter]  # an EAGLE-3 head's module, or an MTP layer
        return cost_ratio(target, floors.streamed_bytes(head.head if drafter == "eagle" else head.layer), k)

    def batch_decoder(self, batch: int, profile: Profile | None = None, room: int = 0) -> BatchDecoder:
        """A decoder of `batch` rows at once for `profile`'s settings (default: the engine's); each
        prompt brings its own (core/batch_decode.py). What batches do not take yet is a one-line error.
        room: the most positions a prompt of the run takes (its tokens and max_tokens), for which
        the caches are allocated at once (0: grown as prompts come)."""
        profile = profile or self.profile
        refusal = batch_refusal(profile, bool(getattr(self.backend, "spread", None)))
        if refusal:
            raise UsageError(f"batches (batch_size {batch}) {refusal}",
                             hint="set batch_size = 1 (--batch-size 1), or change what the message names")
        sampling = profile.sampling
        proposer = profile.proposer
        kind = proposer.kind
        k = profile.speculation.k if kind != "none" else 0
        model = proposer.drafter(kind)  # hybrid: the model it drafts with where lookup finds nothing
        if k and model == "draft" and self.draft_runner is None:
            raise UsageError(f"the {kind} proposer needs a draft model", hint="add [draft] or use --proposer ngram")
        if k and model == "eagle" and "eagle" not in self.heads:
            raise UsageError(f"the {kind} proposer needs the eagle drafter, which this run did not load",
                             hint="name every proposer when the run starts (bench --proposer a,b)")
        lookup = (proposer.ngram_min, proposer.ngram_max) if kind in ("ngram", "hybrid") else None
        # a shape left auto (nothing measured at batch: Engine.resolve_batch) runs as a chain
        tree = (profile.speculation.tree_width, profile.speculation.nodes) if k and \
            profile.speculation.tree_width not in (AUTO, 1) and profile.speculation.tree_nodes != AUTO else None
        rows = batch_rows(sampling)
        # how a model's drafts are picked: drawn from q or its argmax (draft_sampling), cut at draft_p_min
        races = profile.speculation.draft_sampling != "argmax"
        p_min = proposer.draft_p_min if k and model != "none" else 0.0
        key = ("batch", batch, k, sampling.coupling, kind if k else "none", model, lookup, tree, rows, races, p_min)
        if key not in self._rounds and tree is not None:  # each row its own tree (core/round/batch_tree.py)
            if kind == "ngram":
                drafter = partial(BatchLookupTree, ngram_min=proposer.ngram_min, ngram_max=proposer.ngram_max)
            elif model == "eagle":
                drafter = partial(BatchHeadTree, drafter=self.heads["eagle"])
            else:
                drafter = partial(BatchTreeDraftModel, runner=self.draft_runner)
            if kind == "hybrid":  # each row the lookup's trie where it matches, else the model's tree
                drafter = partial(BatchHybridTree, model=drafter, ngram_min=proposer.ngram_min,
                                  ngram_max=proposer.ngram_max)
            rnd = BatchTreeRound(k, *tree, batch, self.width, self.pair.vocab_size, sampling.coupling == "gumbel",
                                 self.backend, self.target_runner, drafter, rows, self.eos_ids, races)
            self._rounds[key] = (rnd, self.backend.batch_program(rnd))
        if key not in self._rounds:
            if kind == "ngram":
                drafter = partial(BatchLookup, ngram_min=proposer.ngram_min, ngram_max=proposer.ngram_max)
            elif model == "eagle":
                drafter = partial(BatchHead, drafter=self.heads["eagle"])
            else:
                drafter = partial(BatchDraftModel, runner=self.draft_runner)
            if kind == "hybrid":  # the model drafts every row, lookup's drafts where it matches
                drafter = partial(BatchHybrid, model=drafter, ngram_min=proposer.ngram_min,
                                  ngram_max=proposer.ngram_max)
            rnd = BatchRound(k, batch, self.width, self.pair.vocab_size, sampling.coupling == "gumbel",
                             self.backend, self.target_runner, drafter if k else None, rows, self.eos_ids,
                             races, p_min)
            self._rounds[key] = (rnd, self.backend.batch_program(rnd))
        rnd, program = self._rounds[key]
        if room:
            rnd.reserve(room + rnd.reach)
        mode = profile.speculation.draft_sampling
        return BatchDecoder(rnd, program, self.tokenizer, self.eos_ids, lambda spec: draft_picking(mode, spec)[1],
                            adaptive_k=proposer.adaptive_k and k > 0 and proposer.drafter(kind) != "none",
                            pipeline=profile.speculation.pipeline)

    def forget_batches(self) -> None:
        """Drop the batch rounds built so far (their caches hold B rows each): bench's batch sizes
        are measured one after another, never needed again."""
        for key in [key for key in self._rounds if key[0] == "batch"]:
            self._rounds.pop(key)[0].close()

    def resolve_batch(self, profile: Profile, prompts: int, longest: int) -> BatchChoice:
        """[runtime] batch_size for a run of `prompts` prompts, the longest taking `longest` positions
        (its tokens and max_tokens). A number stands; auto is chosen from what `specgen bench
        --batch-size` measured for this pair on this device (core/measured.py, core/batch_cost.py),
        capped by memory and the prompts: batch 1 where nothing was measured, or where batches
        cannot run these settings. The rows read are the profile's proposer's (an EAGLE-3 head's
        of this head only) and target-only's."""
        from specgen.core.step.model import OwnedModel

        size = profile.runtime.batch_size
        if size != AUTO:
            return self._set_batch(profile, size)
        if prompts <= 1:
            return batch_cost.choose([], profile.proposer.kind, prompts, None)
        refusal = batch_refusal(profile, bool(getattr(self.backend, "spread", None)))
        if not refusal and not all(isinstance(m, OwnedModel) for m in (self.pair.target, self.pair.draft) if m):
            refusal = "need specgen's own model step, and this pair runs on transformers"
        if refusal:
            return BatchChoice(1, reason=f"batch 1: batches {refusal}")
        sampling, kind = profile.sampling, profile.proposer.kind
        rows, where = self._batch_rows(profile)
        speculates = kind != "none"
        # a tree's rows of the vocabulary and positions past a row's: its n + 1 target rows and the
        # (k - 1) w nodes the draft steps, counted as a chain's of that many drafts
        k = max([tree_reach(r["k"], r.get("tree_width", 1), r.get("tree_nodes", r["k"])) for r in rows]
                + [profile.speculation.k if speculates else 0])
        spec = profile.speculation
        if speculates and spec.tree_width not in (AUTO, 1) and spec.tree_nodes != AUTO:
            k = max(k, tree_reach(spec.k, spec.tree_width, spec.nodes))
        fit, memory = self._rows_fit(longest, k, kind if speculates else "none", batch_rows(sampling))
        return batch_cost.choose(rows, profile.proposer.kind, prompts, fit, where, memory)

    def _batch_rows(self, profile: Profile) -> tuple[list[dict], str]:
        """(the batch rows `specgen bench --batch-size` kept that a run of this profile reads: its
        proposer's (a head's of this head only) and target-only's, at its sampling regime, of the
        shapes its speculation settings choose among (`shaped`; none where only target-only's
        are), where they are from in words)."""
        sampling, kind = profile.sampling, profile.proposer.kind
        key = self._pair_key(profile)
        head = measured.drafting_head(profile.proposer, kind)
        kept = measured.batch_rows(measured.load_batches(profile.runtime.measured).get(key, []), kind, head)
        rows = shaped(regime(kept, sampling.temperature, sampling.coupling, kind if kind != "none" else "draft"),
                      profile.speculation)
        if kind != "none" and not any(r["k"] for r in rows):  # target-only rows alone: nothing of this proposer's
            rows = []
        pair = measured.describe_key(key) + (f", EAGLE-3 head {measured.describe_head(head)}" if head else "")
        if all(row["proposer"] == "none" for row in rows):  # target-only's alone: nothing of this proposer's
            sweep = "greedy" if sampling.greedy else f"sampled with {sampling.coupling} coupling"
            return rows, f" for {pair}, {sweep}"
        return rows, f" (bench's measurements, {pair}, T={rows[0]['temperature']:g})"

    def _set_batch(self, profile: Profile, size: int) -> BatchChoice:
        """A batch_size number stands. With tree_width or tree_nodes auto, B > 1 and a proposer
        the batch bench measures, the shape is the fastest speculative run bench --batch-size
        measured at the batch size nearest B (its k and tree: core/batch_cost.shape_at), a chain
        of the profile's k where nothing was (as one request's auto: core/tree_cost.py)."""
        spec, kind = profile.speculation, profile.proposer.kind
        if size == 1 or not spec.auto_tree or kind == "none":
            return BatchChoice(size)
        rows, where = self._batch_rows(profile)
        return batch_cost.shape_at(rows, size, where)

    def batch_profile(self, profile: Profile, choice: BatchChoice) -> Profile:
        """The profile a run at `choice` decodes with: a choice from measurements takes its
        recommendation (target-only, or its k, and with tree_width auto its tree shape: a chain
        or a tree; a profile's own tree shape stands), else the profile stands."""
        if not choice.measured:
            return profile
        if not choice.speculate:
            return target_only(profile)
        spec = profile.speculation
        if spec.tree_width not in (AUTO, 1) and spec.tree_nodes != AUTO:  # the profile's tree: its k stands
            return profile
        shape = {}
        if spec.auto_tree:  # the measured shape: a chain (width 1) or a tree of its nodes
            shape = dict(tree_width=choice.tree_width, tree_nodes=choice.tree_nodes if choice.tree_width > 1 else 0)
        return replace(profile, speculation=replace(spec, k=choice.k, **shape))

    def _rows_fit(self, longest: int, k: int, proposer: str, rows: tuple[str, ...] = ()) -> tuple[int | None, str]:
        """(the rows whose caches and buffers fit in core/batch_cost.MEMORY_SHARE of the free
        device memory, the cap in words). A row: the target's keys and values and the drafter's
        (the draft model's, or an EAGLE-3 head's with proposer eagle; none target-only) at the
        run's most positions (its longest prompt and max_tokens, the round's reach, the caches'
        slack), and the round's rows of the vocabulary, its logits-row parts' (rows) too
        (batch_row_bytes). On the CPU, None:
        host memory is not capped (the bench ran the measured batches on this machine, and the
        operating system pages rather than failing an allocation)."""
        device = self.pair.device
        if device.type != "cuda":
            return None, f"memory not capped on {device.type}"
        positions = longest + k + 3 + SLACK  # BatchRound.reach, and its caches' slack
        head = self.heads["eagle"].head if proposer == "eagle" and "eagle" in self.heads else None
        per_row = batch_row_bytes((self.pair.target, self.pair.draft if proposer == "draft" else None), positions,
                                  k, self.width, head, rows)
        free, _ = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # the allocator's pool
        fit = batch_cost.memory_rows(free, per_row)
        return fit, (f"memory holds {fit} rows ({batch_cost.MEMORY_SHARE:.0%} of {free / 2**30:.1f} GiB free, "
                     f"{per_row / 2**20:,.1f} MiB a row at {positions:,} positions)")

    def _pair_key(self, profile: Profile) -> str:
        return measured.pair_key(profile.target.path, profile.draft.path if profile.draft else None,
                                 device_name(self.pair.device), str(self.pair.target.dtype).removeprefix("torch."))

    def resolve(self, profile: Profile, proposer_kind: str | None = None,
                positions: int | None = None) -> tuple[Profile, TreeChoice | None]:
        """The profile with tree_width / tree_nodes auto chosen from what `specgen bench` measured
        for this pair on this device (core/measured.py, core/tree_cost.py), and the choice (None
        where neither is auto). Where width auto predicts target-only faster, the profile's
        proposer becomes none. positions: the most the run's generations reach, where known (trees
        measured at far fewer are left out: core/tree_cost.py)."""
        spec = profile.speculation
        if not spec.auto_tree:
            return profile, None
        choice = self._choose(profile, proposer_kind or profile.proposer.kind, positions)
        resolved = replace(profile, speculation=replace(spec, tree_width=choice.width,
                                                        tree_nodes=choice.nodes if choice.width > 1 else 0))
        return (resolved if choice.speculate else target_only(resolved)), choice

    def _choose(self, profile: Profile, kind: str, positions: int | None = None) -> TreeChoice:
        spec, sampling = profile.speculation, profile.sampling
        k, width = spec.k, spec.tree_width
        refusal = "" if kind == "none" else tree_refusal(profile, kind, bool(getattr(self.backend, "spread", None)),
                                                         self.pair)
        if kind == "none" or refusal and width == "auto":
            why = "no proposer drafts" if kind == "none" else f"token trees {refusal}"
            return TreeChoice(1, k, reason=f"a chain: {why}")
        key = self._pair_key(profile)
        folder = profile.runtime.measured
        if folder not in self._measured:
            self._measured[folder] = measured.load(folder).get(key, [])
        head = measured.drafting_head(profile.proposer, kind)  # a head's rows stand for that head only
        kept = measured.tree_rows(self._measured[folder], head)
        rows = regime(kept, sampling.temperature, sampling.coupling, kind)
        pair = measured.describe_key(key) + (f", EAGLE-3 head {measured.describe_head(head)}" if head else "")
        if all(row["proposer"] == "none" for row in rows):  # target-only's alone: nothing of this proposer's
            sweep = "greedy" if sampling.greedy else f"sampled with {sampling.coupling} coupling"
            where = f" for {pair}, {sweep}"
        else:
            at = rows[0]["temperature"]
            where = f" (bench's measurements, {pair}, T={at:g})"
        return choose(k, width, spec.tree_nodes, rows, where, positions)

    def _tree(self, profile: Profile, kind: str, k: int) -> dict:
        """The round's tree fields: a chain (width 1) unless the profile asks for a tree, which
        this run must be able to draft and verify (a one-line error says what to change)."""
        spec = profile.speculation
        if spec.tree_width == 1 or k == 0:
            return {}
        refusal = tree_refusal(profile, kind, bool(getattr(self.backend, "spread", None)), self.pair)
        if refusal:
            raise UsageError(f"token trees (tree_width {spec.tree_width}) {refusal}",
                             hint="set tree_width = 1 (--tree-width 1), or change what the message names")
        return {"tree_width": spec.tree_width, "tree_nodes": spec.nodes}

    def _round(self, shape: RoundShape, sampling, stop_ids: list[int], modes: list[Mode]):
        """The round for these settings and its programs, built (and captured) on first use."""
        warp = (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.repetition_penalty,
                sampling.presence_penalty, sampling.frequency_penalty, sampling.min_tokens)
        key = (shape, warp, tuple(stop_ids), tuple(modes))
        if key not in self._rounds:
            draft = self.draft_runner if shape.drafter == "draft" else None
            kind = TreeRound if shape.tree_width > 1 else Round
            rnd = kind(shape, sampling, self.backend, self.target_runner, draft, stop_ids,
                        head=self.heads.get(shape.drafter))
            programs = {mode: self.backend.program(rnd, mode) for mode in modes}
            self._rounds[key] = (rnd, programs)
        return self._rounds[key]

    def describe(self, positions: int | None = None) -> dict:
        """The resolved settings of this engine's backend, for reports (bench JSON, generate -v), and
        which code runs the models ([runtime] modeling resolved: "specgen" or "transformers", and
        why transformers where it does), and which path each head's calls take ("kernels" or
        "torch")."""
        return {"modeling": self.pair.modeling, "modeling_note": self.pair.modeling_note,
                **self.backend.describe(), "heads": self.head_paths,
                **self.tree_report(self.profile, positions=positions)}

    def tree_report(self, profile: Profile, proposer_kind: str | None = None, positions: int | None = None) -> dict:
        """The round's tree shape as reports give it (tree_shape), auto resolved (for a run whose
        generations reach `positions`, where known), and with auto, `tree_auto`: what it chose and
        why, None without auto (generate -v, the bench JSON); for the hybrid proposer's trees,
        `hybrid_merge`: its merge rule (None otherwise)."""
        resolved, choice = self.resolve(profile, proposer_kind, positions)
        return {**tree_shape(resolved.speculation), "tree_auto": choice.reason if choice else None,
                "hybrid_merge": self._merge_report(resolved, proposer_kind or profile.proposer.kind)}

    def _merge_report(self, profile: Profile, kind: str) -> str | None:
        """Hybrid trees' merge rule as reports give it (core/drafters/merge_rule.py); None otherwise."""
        spec = profile.speculation
        if kind != "hybrid" or spec.tree_width == AUTO or spec.tree_width <= 1:
            return None
        drafter = profile.proposer.drafter(kind)
        if drafter not in ("draft", "eagle", "mtp") or (drafter == "draft" and self.pair.draft is None) \
                or (drafter != "draft" and drafter not in self.heads):
            return None
        return self.merge_rule(spec.hybrid_merge, drafter, spec.k).describe()


def batch_row_bytes(models, positions: int, k: int, width: int, head=None, rows: tuple[str, ...] = ()) -> int:
    """The device bytes one row of a batch takes (Engine._rows_fit): each model's keys, values and
    slot positions at `positions` (core/step/cache.py), and the round's fp32 rows of the
    vocabulary (logits, noise, probabilities: 3 (k + 1) + 3 of them, core/round/batch_round.py),
    counted twice for what a step and the warp allocate on the way. head: an EAGLE-3 head drafting
    the batch (core/round/batch_head.py): its one layer's keys and values at `positions`, and its
    tap's k + 1 rows of the target's states (3 target widths each). rows: the logits-row parts
    (core/round/batch_rows.py): penalties' int32 counts and bool seen ids (the row's, its draft
    step's, its k + 1 target rows'), min_tokens' bool masks (stop ids, a draft step's, the target
    rows'), and their ops' temporaries as many again."""
    total = 2 * (3 * (k + 1) + 3) * width * 4
    if "penalties" in rows:
        total += 2 * (k + 3) * width * (4 + 1)
    if "min_tokens" in rows:
        total += 2 * (k + 3) * width
    for model in models:
        if model is not None:
            c = model.config
            per_slot = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * model.dtype.itemsize
            total += positions * (per_slot + 8)  # keys, values and the slot's position (int64)
    if head is not None:
        c, element = head.config, head.fc.weight.element_size()
        total += positions * 2 * c.num_key_value_heads * c.head_dim * element
        total += (k + 1) * 3 * c.target_hidden_size * element
    return total


def draft_picking(mode: str, sampling) -> tuple[bool, bool]:
    """(sample, cut) for speculation.draft_sampling: whether the draft draws from q (else its argmax,
    q one-hot), and whether q has the request's top-k / top-p / min-p (else temperature only).
    auto: greedy requests take the argmax; sampled ones draw, and a request cut by top-p alone
    drafts without the cut: the draft skips the cut's work at about the same acceptance
    (docs/benchmarks.md, "Tried and not kept"; docs/profiles.md, draft_sampling); with top-k or
    min-p too, the wider q costs more acceptance, so those keep the cut."""
    if mode == "auto":
        sample = not sampling.greedy
        top_p_only = sampling.top_p < 1.0 and sampling.top_k <= 0 and sampling.min_p == 0.0
        return sample, not (sample and top_p_only)
    return mode in ("sample", "temperature"), mode != "temperature"


def tree_refusal(profile: Profile, kind: str, spread: bool, pair: LoadedPair) -> str:
    """Why this run cannot draft or verify a token tree ("" where it can). spread: a model lies
    over several GPUs (its step crosses devices; tree rows do not yet)."""
    from specgen.core.runner import tree_steps_refusal

    drafter = profile.proposer.drafter(kind)  # hybrid: the model whose tree its lookup's trie merges with
    if kind not in TREE_PROPOSERS or drafter not in TREE_DRAFTERS:
        what = f"the {kind} proposer" + (f" with {drafter} (hybrid_with)" if kind == "hybrid" else "")
        return (f"are drafted by the draft model, an EAGLE-3 head (eagle), an MTP layer (mtp), prompt lookup (ngram) "
                f"or hybrid only, not by {what}")
    if spread:
        return "need each model on one GPU, and this run spreads one over several"
    models = (pair.target, pair.draft) if drafter == "draft" else (pair.target,)
    for model in models:
        if tree_steps_refusal(model):
            return tree_steps_refusal(model)
    if drafter != "none" and profile.proposer.draft_p_min > 0:
        return "do not take draft_p_min yet"
    return ""


def batch_rows(sampling) -> tuple[str, ...]:
    """The logits-row parts a batch is built with (core/round/batch_rows.py): those the run's
    settings use. A prompt's own settings (core/profile.py PROMPT_SETTINGS) name neither, so the
    profile's stand for every row; the rows that do not use a part share it, bit for bit."""
    return ("penalties",) * uses_penalties(sampling) + ("min_tokens",) * (sampling.min_tokens > 0)


def shaped(rows: list[dict], spec) -> list[dict]:
    """The batch rows a run of these speculation settings chooses among (target-only's always):
    tree_width 1 the chains', auto every shape's, a set width with tree_nodes auto that width's, a
    set tree its own shape's, each where measured (else the chains': a set tree's shape standing,
    Engine.batch_profile)."""
    def width(r):
        return r.get("tree_width", 1)

    if spec.tree_width == AUTO:
        return rows
    chains = [r for r in rows if not r["k"] or width(r) == 1]
    if spec.tree_width == 1:
        return chains
    if spec.tree_nodes == AUTO:  # a set width's trees, any node budget measured (else the chains')
        own = [r for r in rows if not r["k"] or width(r) == spec.tree_width]
        return own if any(r["k"] for r in own) else chains
    own = [r for r in rows if not r["k"] or (width(r), r.get("tree_nodes")) == (spec.tree_width, spec.nodes)]
    return own if any(r["k"] for r in own) else chains


def tree_reach(k: int, width: int, nodes: int) -> int:
    """The drafts a chain would need for a round's rows past a row's position (its n + 1 target
    rows, the (k - 1) w nodes its draft steps); a chain's own k."""
    return k if width <= 1 else max(k, nodes + 1, (k - 1) * width + 1)


def batch_refusal(profile: Profile, spread: bool = False) -> str:
    """Why this run cannot decode prompts in batches ("" where it can). spread: a model lies over
    several GPUs (its step crosses devices; a batch's caches do not yet)."""
    spec, kind = profile.speculation, profile.proposer.kind
    model = profile.proposer.drafter(kind)  # hybrid: the model it drafts with where lookup finds nothing
    if kind not in ("draft", "eagle", "ngram", "hybrid", "none") or model not in ("draft", "eagle", "none"):
        what = f"the {kind} proposer" + (f" with {model} (hybrid_with)" if kind == "hybrid" else "")
        return (f"are drafted by the draft model, an EAGLE-3 head (eagle), prompt lookup (ngram) or hybrid only, "
                f"not by {what}")
    if spread:
        return "need each model on one GPU, and this run spreads one over several"
    trees = spec.tree_width != "auto" and spec.tree_width > 1  # auto: chains at batch
    if trees and kind == "hybrid" and spec.hybrid_merge != "never":
        return (f"take hybrid's trees with hybrid_merge = never only (each row the lookup's trie or the model's "
                f"tree), not {spec.hybrid_merge}")
    if trees and kind != "ngram" and profile.proposer.draft_p_min > 0:  # as one request's trees (tree_refusal)
        return "take no draft_p_min with token trees yet"
    return ""


def tree_shape(spec) -> dict:
    """The round's tree as reports give it: width 1 is a chain of k nodes."""
    return {"tree_width": spec.tree_width, "tree_nodes": spec.nodes if spec.tree_width > 1 else spec.k}


def device_name(device: torch.device) -> str:
    """The device as bench's environment names it (the key of its measured facts)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return name or platform.machine()


def target_only(profile: Profile) -> Profile:
    return replace(profile, proposer=replace(profile.proposer, kind="none"))


def make_backend(device: torch.device, profile, progress=None, models=()) -> Backend:
    """The CUDA backend on a CUDA device with CUDA graphs on (gpu/ imported only then), else torch.
    models: the loaded models; one with weights off the GPUs (a device_map that offloads to the CPU
    or disk) runs on the torch backend, whose eager forwards accelerate's hooks feed. A model over
    several GPUs takes the CUDA backend (gpu/stages.py)."""
    offloaded = any(p.device.type != "cuda" for model in models if model is not None for p in model.parameters())
    if device.type == "cuda" and profile.speculation.cuda_graphs and not offloaded:
        from specgen.gpu.backend import CudaBackend  # noqa: PLC0415 (gpu/ only with CUDA)

        return CudaBackend(device, profile, progress)
    return TorchBackend(device)
