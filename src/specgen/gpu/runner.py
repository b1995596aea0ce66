"""A runner over a static KV cache whose fixed-shape steps replay as CUDA graphs.

Same protocol as core/runner.py's EagerRunner: reset(), forward(ids) -> logits, truncate(n).

Why not transformers' StaticCache as it is: each of its layers keeps its own device counter and
advances it on every update, graph warm-ups and replays included. Captured steps then write K/V
where that counter points, not where the sequence is, and attend over stale entries (the probe's
0.5 logit differences), and warm-ups push the counter past the end (its index_copy_ asserts).
SlotCache keeps ONE position tensor for all layers, owned by the runner: a forward writes at
position + arange(n), the model derives position ids and the causal mask from it, and the runner
advances it after the forward. Rollback is position.fill_(n): no copy, no free, no host sync.

Every static buffer (input ids, logits out, the position) is allocated before capture and held
by the runner; each graph keeps its own raw output alive, so nothing it writes can be freed.
Logits returned by forward() are the graph's output buffer: valid until the next forward of the
same shape.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

WARMUP_STEPS = 3  # eager runs before capture: cuBLAS handles, lazy allocations, torch.compile
SLACK = 64  # positions past the longest request: where warm-ups and padded steps may write
MAX_GRAPH_TOKENS = 64  # longest captured step
PREFILL_CHUNK = 64  # the fast path also captures this shape: prompts replay it chunk by chunk
MAX_CHUNKS = 8  # longer prompts (more than 512 tokens) prefill eagerly, where compute dominates


# SDPA backends for captured steps, by step length (None: PyTorch's own order). Measured on an H200
# (benchmarks/profile_steps.py, bench-shaped target, static cache, docs/benchmarks.md): cuDNN
# (PyTorch's first choice on sm90) takes 5 us a layer for 1 token but 23 us for 5 tokens, and is
# still the best of the three: the memory-efficient kernel takes 34 us for either, the math path
# is slower without torch.compile and the same with it. The switch stays for other GPUs/torch.
STEP_ATTENTION_ONE: tuple[str, ...] | None = None
STEP_ATTENTION_MANY: tuple[str, ...] | None = None

# Steps of up to 64 tokens attend through gpu/attention.py's kernel over the live keys only, where
# the model's attention allows it (attention.supports); SPECGEN_ATTENTION=sdpa turns it off.
DECODE_ATTENTION = os.environ.get("SPECGEN_ATTENTION", "kernel") != "sdpa"
# Linear layers of steps (up to gpu/linear.py's MAX_ROWS tokens) run through its weight-streaming
# kernel on CUDA; SPECGEN_LINEAR=torch keeps F.linear (cuBLAS).
LINEAR_KERNEL = os.environ.get("SPECGEN_LINEAR", "kernel") != "torch"
# With the attention kernel, Llama / Mistral / Qwen2 / Qwen3 steps also hand it the query and new keys
# before their rotary embedding, and it rotates them and writes the cache (attention.install_rope):
# two fewer kernels a layer. On the H200 it took a Llama-3-8B step from 4.594 to 4.510 ms (1.215x to
# 1.182x the bandwidth floor; docs/benchmarks.md, "Rotary embedding and cache write inside the
# attention kernel"). SPECGEN_ROPE=torch keeps the model's own rotary and cache update.
ROPE_IN_KERNEL = os.environ.get("SPECGEN_ROPE", "kernel") != "torch"


def step_attention(tokens: int):
    """The context a captured step of `tokens` tokens runs in (see STEP_ATTENTION_*)."""
    names = STEP_ATTENTION_ONE if tokens == 1 else STEP_ATTENTION_MANY
    if not names:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, name) for name in names]
    try:
        return sdpa_kernel(backends, set_priority=True)
    except TypeError:  # older torch: no priority order, only the allowed set
        return sdpa_kernel(backends)


# `autotune`: inductor benchmarks Triton GEMM templates against cuBLAS and tunes reduction
# configurations. Measured on a Llama-3-8B shape on an H200 (docs/benchmarks.md): the 1-token
# step falls from 5.41 to 4.65 ms (1.44x to 1.23x the bandwidth floor), at 172 s of compile
# instead of 94 s; the 5-token step stays at 5.5 ms.
AUTOTUNE = {"coordinate_descent_tuning": True, "max_autotune_gemm": True}


PERSISTENT = "specgen.persistent_reductions"  # an inductor_settings key of our own, see below


@contextlib.contextmanager
def inductor_settings(settings: dict):
    """torch._inductor.config values set for the duration (compiles happen lazily, at first call).
    The key PERSISTENT (an int) makes inductor keep rows of up to that many elements in registers
    (one pass) for reductions it would otherwise loop over, see persistent_reductions()."""
    if not settings:
        yield
        return
    import torch._inductor.config as config

    settings = dict(settings)
    limit = settings.pop(PERSISTENT, 0)
    with config.patch(settings), persistent_reductions(limit):  # dotted names too ("triton.multi_kernel")
        yield


@contextlib.contextmanager
def persistent_reductions(limit: int):
    """Inductor's choice between a persistent reduction (the whole row in registers, one pass) and
    a looped one, widened to rows of up to `limit` elements. Its own threshold is 1024 for inner
    reductions: a Llama-3-8B decode step's residual add + RMSNorm over 4096 values is then a
    looped kernel that reads its row twice. Installed as inductor's choices handler."""
    if not limit:
        yield
        return
    from torch._inductor.virtualized import V

    base = type(V.choices)

    class Wider(base):
        @staticmethod
        def should_use_persistent_reduction(*args, **kwargs) -> bool:
            if base.should_use_persistent_reduction(*args, **kwargs):
                return True
            features = kwargs["features"] if "features" in kwargs else args[0]
            cooperative = kwargs.get("cooperative_reduction", args[1] if len(args) > 1 else False)
            import torch._inductor.config as config

            if cooperative or not config.triton.persistent_reductions:
                return False
            return V.graph.sizevars.statically_known_leq(features.reduction_numel, limit)

    with V.set_choices_handler(Wider()):
        yield


def cache_dir() -> Path:
    """Where torch.compile keeps its kernels between runs (TORCHINDUCTOR_CACHE_DIR wins if set)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specgen" / "inductor"
    path = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(default)))
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def _slot_layer_class():
    from transformers.cache_utils import StaticLayer

    class SlotLayer(StaticLayer):
        """A StaticLayer that writes at the shared position instead of its own counter."""

        def __init__(self, capacity: int, position: torch.Tensor, steps: torch.Tensor):
            super().__init__(max_cache_len=capacity)
            self.position = position  # [] int64, shared by every layer
            self.steps = steps  # [capacity] int64: 0, 1, 2, ...

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            index = self.steps[: key_states.shape[-2]] + self.position
            self.keys.index_copy_(2, index, key_states)
            self.values.index_copy_(2, index, value_states)
            return self.keys, self.values

        def get_seq_length(self):
            return self.position

    return SlotLayer


def slot_cache(config, capacity: int, position: torch.Tensor, steps: torch.Tensor):
    """A transformers Cache of full-length SlotLayers (sliding-window layers too: their window is
    applied by the model's mask on absolute positions, so a full layer is correct, only larger)."""
    from transformers.cache_utils import Cache

    layer = _slot_layer_class()
    layers = config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[layer(capacity, position, steps) for _ in range(layers)])


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [n, width] float32: written by every replay
    raw: torch.Tensor  # the model's own output inside the graph's pool, kept alive with it


def _fit(logits: torch.Tensor, width: int) -> torch.Tensor:
    """[n, cols] -> [n, width] float32: cut extra (padding) columns, or pad with -inf."""
    cols = logits.shape[-1]
    if cols == width:
        return logits.float()
    if cols > width:
        return logits[:, :width].float()
    pad = logits.new_full((logits.shape[0], width - cols), float("-inf"), dtype=torch.float32)
    return torch.cat([logits.float(), pad], dim=-1)


class GraphRunner:
    """forward(ids) feeds tokens after the cached ones; graphs replay the shapes in `shapes`.

    capacity: positions the cache holds (grown by reserve(), which re-captures); compile: also
    torch.compile the step (kernels cached on disk, see cache_dir); progress(done, total, what):
    start-up callback; use_graphs=False runs every step eagerly over the same cache (the fallback
    for models that cannot be captured, and the CPU test path); attention: use gpu/attention.py's
    kernel for steps (None: on CUDA where the model allows it, see DECODE_ATTENTION); linear: run
    linear layers of short steps through gpu/linear.py (None: on CUDA, see LINEAR_KERNEL; only this
    runner's calls take it, not other users of the same model object); autotune: compile with
    AUTOTUNE's inductor settings; inductor: more torch._inductor.config values for its compiles
    (benchmarks/bench_shapes.py --inductor).
    """

    def __init__(self, model, width: int, capacity: int, shapes=(), compile: bool = False,
                 progress=None, use_graphs: bool = True, name: str = "model", attention: bool | None = None,
                 autotune: bool = False, linear: bool | None = None, inductor: dict | None = None):
        self.model = model
        self.width = width  # logits columns handed out, as in EagerRunner
        self.device = model.get_output_embeddings().weight.device
        self.name = name
        self.progress = progress
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.shapes = sorted(set(shapes))
        self.graphs: dict[int, _Graph] = {}
        self.attention = use_kernel(model) if attention is None else attention
        if self.attention:
            _switch_attention(model)
            from specgen.gpu import attention as attention_module

            if ROPE_IN_KERNEL:
                attention_module.install_rope(model)
            else:
                attention_module.uninstall_rope(model)
        self.linear = use_linear(model) if linear is None else linear
        if self.linear:
            from specgen.gpu import linear as linear_module

            linear_module.install(model)
            linear_module.tune(self.device)
            linear_module.counters(self.device)  # split-K's: before any capture or compile holds them
        self.step = self._step
        self.autotune = compile and autotune
        self.inductor = {**(AUTOTUNE if self.autotune else {}), **(inductor or {})} if compile else {}
        if compile:
            cache_dir()
            _raise_recompile_limit()
            self.step = torch.compile(self._step, dynamic=False)
        self.length = 0
        self.capacity = 0
        self.setup_seconds = 0.0
        self._allocate(capacity)

    # -- protocol -------------------------------------------------------------------------------

    def reset(self) -> None:
        self.position.fill_(0)
        self.length = 0

    def truncate(self, length: int) -> None:
        if length < self.length:
            self.position.fill_(length)
            self.length = length

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, want_logits: bool = True) -> torch.Tensor | None:
        """ids: [n] int64 -> logits [n, width] float32 (None when want_logits is False).

        A step replays the smallest captured shape that holds it, padded: the padding tokens sit
        after the real ones, so no real row sees them, and the position is set back to the real
        length, so their K/V lies beyond it like a rejected draft's. Longer feeds (prefill) of up
        to MAX_CHUNKS chunks replay the largest shape chunk by chunk; longer ones run eagerly.
        """
        n = ids.shape[0]
        if n == 0:
            return None
        shape = self._shape_for(n)
        if shape is None:
            return self._eager(ids.to(self.device), want_logits)
        if n > shape:
            rows = []  # each replay overwrites the graph's logits: copy them out in between
            for at in range(0, n, shape):
                logits = self._replay(ids[at:at + shape], shape)
                if want_logits:
                    rows.append(logits.clone())
            return torch.cat(rows) if want_logits else None
        logits = self._replay(ids, shape)
        return logits if want_logits else None

    def add_shapes(self, shapes) -> None:
        """Capture steps of more shapes (a decoder with another k): outside any round."""
        missing = sorted(set(shapes) - set(self.shapes))
        if missing:
            self.shapes = sorted(set(self.shapes) | set(missing))
            self._capture_all(missing)

    def reserve(self, positions: int) -> None:
        """Make room for a request that may reach `positions`: re-allocate and re-capture if needed."""
        if positions + SLACK > self.capacity:
            self._allocate(_round_up(positions + SLACK, 512))

    # -- internals ------------------------------------------------------------------------------

    def _shape_for(self, n: int) -> int | None:
        """The captured shape an n-token feed replays (chunked when n is larger), or None: eager."""
        if not self.graphs:
            return None
        fits = [shape for shape in self.graphs if shape >= n]
        if fits:
            return min(fits)
        largest = max(self.graphs)
        return largest if n <= largest * MAX_CHUNKS else None

    def _replay(self, ids: torch.Tensor, shape: int) -> torch.Tensor:
        """Run the `shape`-token graph on ids ([n <= shape]) padded with stale ids: logits [n, width]."""
        n = ids.shape[0]
        graph = self.graphs[shape]
        self.ids[:n].copy_(ids, non_blocking=True)
        graph.graph.replay()  # advances the position by `shape`
        self.length += n
        if n < shape:
            self.position.fill_(self.length)
        return graph.logits[:n]

    def _allocate(self, capacity: int) -> None:
        start = time.perf_counter()
        self.graphs = {}  # old graphs point at the old cache
        self.generation = getattr(self, "generation", 0) + 1  # graphs captured elsewhere check this
        self.capacity = capacity
        self.position = torch.zeros((), dtype=torch.long, device=self.device)
        self.steps = torch.arange(capacity, device=self.device)
        self.ids = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.long, device=self.device)
        self.cache = slot_cache(self.model.config, capacity, self.position, self.steps)
        self._eager(self.ids[:1], want_logits=False)  # allocates every layer's K/V before capture
        self.reset()
        self.setup_seconds += time.perf_counter() - start
        self._capture_all(self.shapes)

    def _capture_all(self, shapes) -> None:
        shapes = [n for n in shapes if n <= MAX_GRAPH_TOKENS] if self.use_graphs else []
        start = time.perf_counter()
        for i, n in enumerate(shapes):
            if self.progress is not None:
                self.progress(i, len(shapes), f"{self.name}: {n}-token step")
            with inductor_settings(self.inductor):  # a shape compiles in its warm-ups
                self.graphs[n] = self._capture(n)
        if shapes and self.progress is not None:
            self.progress(len(shapes), len(shapes), f"{self.name}: ready")
        self.setup_seconds += time.perf_counter() - start

    def linear_context(self):
        """gpu/linear.py's path on or off for this runner's forwards."""
        from specgen.gpu import linear as linear_module

        return linear_module.active(self.linear)

    @contextlib.contextmanager
    def step_context(self, tokens: int):
        """What every warm-up and capture of an n-token step runs in, this runner's own and a
        fused round's: the SDPA backend choice and the linear kernel switch."""
        with step_attention(tokens), self.linear_context():
            yield

    @torch.inference_mode()
    def _eager(self, ids: torch.Tensor, want_logits: bool) -> torch.Tensor | None:
        with self.linear_context():
            out = self.model(input_ids=ids.unsqueeze(0), past_key_values=self.cache, use_cache=True,
                             logits_to_keep=0 if want_logits else 1, **self._attention_args())
        n = ids.shape[0]
        self.position.add_(n)
        self.length += n
        return _fit(out.logits[0], self.width) if want_logits else None

    def _step(self, ids: torch.Tensor, logits_out: torch.Tensor) -> torch.Tensor:
        """The captured step: forward at the shared position, logits into the owned buffer, advance."""
        logits = self.model(input_ids=ids.unsqueeze(0), past_key_values=self.cache, use_cache=True,
                            **self._attention_args()).logits[0]
        cols = min(logits.shape[-1], self.width)
        logits_out[:, :cols].copy_(logits[:, :cols])
        self.position.add_(ids.shape[0])
        return logits

    def _attention_args(self) -> dict:
        """What the model hands on to gpu/attention.py: where the step's first token sits."""
        return {"specgen_position": self.position} if self.attention else {}

    @torch.inference_mode()
    def _capture(self, n: int) -> _Graph:
        """Warm up and capture the n-token step, writing into the scratch end of the cache."""
        ids = self.ids[:n]
        ids.zero_()
        logits = torch.full((n, self.width), float("-inf"), dtype=torch.float32, device=self.device)
        scratch = self.capacity - n  # never a live position (reserve keeps SLACK free)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), self.step_context(n):
            for _ in range(WARMUP_STEPS):
                self.position.fill_(scratch)
                self.step(ids, logits)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.position.fill_(scratch)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), self.step_context(n):
            raw = self.step(ids, logits)
        self.position.fill_(self.length)
        return _Graph(graph, logits, raw)


def use_kernel(model) -> bool:
    """The decode-attention kernel by default: on CUDA, for models whose attention it computes."""
    if not DECODE_ATTENTION or model.get_output_embeddings().weight.device.type != "cuda":
        return False
    from specgen.gpu.attention import supports

    return supports(model.config) is None


def use_linear(model) -> bool:
    """gpu/linear.py's kernel by default: on CUDA (see LINEAR_KERNEL)."""
    weight = model.get_output_embeddings().weight
    return LINEAR_KERNEL and weight.device.type == "cuda" and weight.dtype in (torch.bfloat16, torch.float16, torch.float32)


def _switch_attention(model) -> None:
    """Make the model call gpu/attention.py (SDPA whenever a call does not pass the position)."""
    from specgen.gpu.attention import register

    name = register()
    if model.config._attn_implementation == name:
        return
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # older transformers: the config attribute is what the attention layers read
        model.config._attn_implementation = name


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _raise_recompile_limit() -> None:
    """One compiled step per (runner, shape): more entries than dynamo's default limit of 8."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
