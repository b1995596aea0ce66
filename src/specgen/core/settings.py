"""The resolved settings of a run, as frozen dataclasses.

core/profile.py fills these from a TOML profile plus CLI overrides; everything downstream
(models, decode loop, verifier) reads only these objects, never raw TOML or argv.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelSpec:
    """Where a checkpoint lives and how to load it."""

    path: str  # local folder, or a hub id resolved from the local cache only
    revision: str | None = None
    dtype: str = "auto"  # auto = float32 on CPU, bfloat16 on CUDA; or float32 / bfloat16 / float16
    device: str = "auto"  # auto = cuda if available else cpu; or cpu / cuda / cuda:N
    device_map: str | None = None  # accelerate device_map ("auto", "balanced", ...); overrides device
    trust_remote_code: bool = False
    # with a device_map: the most each device may hold, as (device, size) pairs: ("0", "70GiB"),
    # ("cpu", "64GiB"); a TOML table in the profile (docs/profiles.md)
    max_memory: tuple[tuple[str, str], ...] | None = None


PROPOSER_KINDS = ("draft", "ngram", "hybrid", "eagle", "mtp", "none")
MODEL_PROPOSERS = ("draft", "eagle", "mtp")  # what hybrid may pair with prompt lookup
# the kinds that draft token trees, and who drafts them on the device (core/engine.py tree_refusal;
# mtp: its layer's growing cache takes a level's rows after the levels before, eagerly)
TREE_PROPOSERS = ("draft", "eagle", "ngram", "hybrid", "mtp")
TREE_DRAFTERS = ("draft", "eagle", "mtp", "none")


@dataclass(frozen=True)
class ProposerSpec:
    # draft (the [draft] model) | ngram (prompt lookup) | hybrid (n-gram where it matches, else
    # `hybrid_with`) | eagle (an EAGLE-3 head on the target's hidden states, from `head`) | mtp (the
    # target checkpoint's own multi-token-prediction layers) | none (target-only)
    kind: str = "draft"
    ngram_min: int = 1
    ngram_max: int = 4
    draft_p_min: float = 0.0  # adaptive: stop drafting when the draft's own p(next) < this (0 = off)
    adaptive_k: bool = False  # adapt k between rounds from recent acceptance (bounded by k)
    head: str = ""  # the EAGLE-3 head's folder (speculators or EAGLE-3 format); relative to the profile
    hybrid_with: str = "draft"  # the model proposer hybrid drafts with where lookup finds nothing

    def drafter(self, kind: str | None = None) -> str:
        """Who drafts on the device for `kind` (default: this spec's): draft, eagle, mtp or none."""
        kind = kind or self.kind
        if kind == "hybrid":
            return self.hybrid_with
        return kind if kind in MODEL_PROPOSERS else "none"

    @property
    def uses_draft(self) -> bool:
        """Whether this proposer runs the [draft] model (so it must be configured and loaded)."""
        return self.drafter() == "draft"


AUTO = "auto"
MAX_TREE_WIDTH = 8  # the widest tree_width a profile may ask for
MAX_TREE_NODES = 63  # the most tree_nodes: 64 target rows with the root (the kernels' step limit)


def tree_envelope(k: int, width: int) -> int:
    """The nodes a token tree of depth k and this width can hold: the root's children, then each
    later level's w best nodes' children (core/round/tree.py)."""
    return width + (k - 1) * width * width


@dataclass(frozen=True)
class SpeculationSpec:
    k: int = 4  # draft tokens per round, 1..32
    draft_sampling: str = "auto"  # auto | argmax | sample | temperature: how the draft picks its proposals
    cuda_graphs: bool = True
    pipeline: str = "auto"  # auto | on | off: queue a round before the one before it is read (core/decode.py)
    # children a draft node may have; 1 = a chain (core/round/tree.py); auto = chosen per run from
    # what `specgen bench` measured on this machine (core/tree_cost.py), a chain where nothing was
    tree_width: int | str = 1
    # tokens the target verifies per round besides the root; 0 = k; auto = chosen as tree_width is
    tree_nodes: int | str = 0
    # hybrid trees where the lookup finds continuations: never | always | auto merge them with the
    # model's tree (core/drafters/merge_rule.py: never measured fastest on an H200)
    hybrid_merge: str = "never"

    @property
    def nodes(self) -> int:
        """The tree's node budget: tree_nodes, or k where 0 (a resolved spec: no auto left,
        Engine.resolve)."""
        return self.tree_nodes or self.k

    @property
    def auto_tree(self) -> bool:
        """Whether the tree's shape is to be chosen from measured facts (tree_width or tree_nodes auto)."""
        return AUTO in (self.tree_width, self.tree_nodes)


# The fusions [kernels] disable may turn off, for ablation (each is on wherever it applies):
# rope: rotary and the cache write inside the attention kernel; norm: RMSNorm (and Gemma's add
# between two norms) in the norm kernel; head: an EAGLE-3 head's calls on the target's kernel
# table; step_io: a step's inputs and outputs in one launch each; dependent_launch: programmatic
# dependent launch between step kernels; split_k: the linear kernel splitting K where bandwidth
# pays; round: the round's own Triton kernels (warp, argmax, verify, noise, commit).
FUSIONS = ("rope", "norm", "head", "step_io", "dependent_launch", "split_k", "round")


@dataclass(frozen=True)
class KernelSpec:
    """Which GPU kernels a run uses (gpu/policy.py resolves it): the two a user chooses, the
    tuned tables' folder, and fusions turned off."""

    attention: str = "auto"  # auto | kernel | sdpa
    linear: str = "auto"  # auto | kernel | torch
    tables: str = ""  # folder of `specgen tune-kernels`' tables; "" = specgen's in the user cache
    disable: tuple[str, ...] = ()  # FUSIONS to turn off


@dataclass(frozen=True)
class SamplingSpec:
    """vLLM SamplingParams meanings; temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = -1  # -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 128
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    logprobs_mode: str = "warped"  # warped (the distribution tokens are drawn from) | raw (the model's)
    # How a sampled round turns the target's p and the proposals into tokens: rejection sampling
    # (the most accepted drafts; the text depends on k and the proposer) or gumbel (noise fixed per
    # (seed, position, token): the text of target-only decoding, whatever k and the proposer).
    coupling: str = "rejection"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class RuntimeSpec:
    """How this process runs, whatever the models."""

    # CPU threads for torch's ops; 0 = auto: half the CPUs this process may use, at least 1.
    # Not torch's default (every core): its threads wait for each other at every op, so one
    # busy core elsewhere slows every round to the pace of the slowest thread.
    threads: int = 0
    # Fetch a hub id that is not in the local cache. Off: specgen never opens a network connection
    # (not even the metadata requests huggingface_hub makes for cached files).
    download: bool = False
    # Which code runs the models: auto = specgen's own model step (core/step/) on the CPU where it
    # covers the checkpoint, which starts seconds sooner than transformers' modeling code, and
    # transformers for everything else; transformers = always transformers.
    modeling: str = "auto"
    # Prompts of a --prompts-file decoded at once, each in a row of its own (generate); auto: the
    # batch size `specgen bench --batch-size` measured fastest, capped by memory and the prompts
    # (core/batch_cost.py), 1 where nothing was measured.
    batch_size: int | str = 1
    # Folder of the facts `specgen bench` measured on this machine (step costs by rows, draft costs
    # by width, per-depth acceptance, batches' tokens/s: core/measured.py), which tree_width /
    # tree_nodes auto and batch_size auto read;
    # "" = specgen's folder in the user cache ($XDG_CACHE_HOME/specgen, else ~/.cache/specgen).
    measured: str = ""


@dataclass(frozen=True)
class Profile:
    name: str
    source: str  # file the profile came from ("<built-in>" style names for packaged ones)
    target: ModelSpec
    draft: ModelSpec | None = None
    proposer: ProposerSpec = field(default_factory=ProposerSpec)
    speculation: SpeculationSpec = field(default_factory=SpeculationSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    kernels: KernelSpec = field(default_factory=KernelSpec)
    # the dotted keys the command line set, so that a message names the option rather than the
    # profile's key (core/profile.py's origin); not a setting: equal settings compare equal
    options: frozenset[str] = field(default=frozenset(), compare=False)
