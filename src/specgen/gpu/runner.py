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
import inspect
import os
import time
from dataclasses import dataclass

import torch

from specgen.core.compile_cache import cache_dir, check_writable
from specgen.gpu import stages
from specgen.gpu.kernels import ResolvedKernels
from specgen.gpu.workspace import Workspace

WARMUP_STEPS = 3  # eager runs before capture: cuBLAS handles, lazy allocations, torch.compile
SLACK = 64  # positions past the longest request: where warm-ups and padded steps may write
MAX_GRAPH_TOKENS = 64  # longest captured step
PREFILL_CHUNK = 64  # the graph runner also captures this shape: prompts replay it chunk by chunk
MAX_CHUNKS = 8  # longer prompts (more than 512 tokens) prefill eagerly, where compute dominates
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")  # set, then restored, by compile_cache

# `autotune`: inductor benchmarks Triton GEMM templates against cuBLAS and tunes reduction
# configurations (docs/benchmarks.md, "Tried and not kept": faster 1-token steps on a Llama-3-8B
# shape, at about twice the compile time).
AUTOTUNE = {"coordinate_descent_tuning": True, "max_autotune_gemm": True}


@contextlib.contextmanager
def inductor_settings(settings: dict):
    """torch._inductor.config values set for the duration (compiles happen lazily, at first call)."""
    if not settings:
        yield
        return
    import torch._inductor.config as config

    with config.patch(settings):
        yield


@contextlib.contextmanager
def compile_cache(folder: str = ""):
    """cache_dir(folder) as inductor's cache for the duration, and the environment as it was after.

    Inductor has no config value for its cache folder: it reads $TORCHINDUCTOR_CACHE_DIR whenever
    it opens the cache (and writes its own default there when unset), so the variable is set only
    around the runner's steps, where its compiles happen, and restored after (removed when the
    user had not set it). Compile workers get the variable with each job, so they follow. The
    first Triton kernel inductor builds sets $TRITON_CACHE_DIR, when unset, to the triton/ folder
    below the cache, for good: restored too, so that later Triton compiles (specgen's own kernels
    outside compiled steps) keep Triton's own cache, as in a run without compile.
    """
    saved = {name: os.environ.get(name) for name in CACHE_VARIABLES}
    path = cache_dir(folder)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_VARIABLES[0]] = str(path)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def capturing(graph: torch.cuda.CUDAGraph, device: torch.device):
    """torch.cuda.graph on a capture stream of `device`. torch's own default capture stream is one
    per process, made on whichever GPU was current at its first capture: a later capture for
    another GPU would switch to that one and record its kernels there, where the round's events
    never wait for them (a pair on GPU 0 after a capture on GPU 1 read its tokens unfinished)."""
    return torch.cuda.graph(graph, stream=torch.cuda.Stream(device))


@functools.cache
def _slot_layer_class():
    from transformers.cache_utils import StaticLayer

    class SlotLayer(StaticLayer):
        """A StaticLayer that writes at the shared position instead of its own counter."""

        def __init__(self, capacity: int, position: torch.Tensor, steps: torch.Tensor, mirrors=None):
            super().__init__(max_cache_len=capacity)
            self.position = position  # [] int64, shared by every layer
            self.steps = steps  # [capacity] int64: 0, 1, 2, ...
            self.mirrors = mirrors  # device -> (position, steps) of a model over several GPUs

        def lazy_initialization(self, key_states, *args, **kwargs):
            super().lazy_initialization(key_states, *args, **kwargs)
            if self.mirrors is not None:  # this layer's device: read the position's copy there
                self.position, self.steps = self.mirrors[key_states.device]

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


def slot_cache(config, capacity: int, position: torch.Tensor, steps: torch.Tensor, mirrors: dict | None = None):
    """A transformers Cache of full-length SlotLayers (sliding-window layers too: their window is
    applied by the model's mask on absolute positions, so a full layer is correct, only larger).
    mirrors: a model over several GPUs: each layer reads the (position, steps) of its own device."""
    from transformers.cache_utils import Cache

    layer = _slot_layer_class()
    layers = config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[layer(capacity, position, steps, mirrors) for _ in range(layers)])


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | stages.SegmentedGraph
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

    capacity: positions the cache holds (grown by reserve(), which re-captures); kernels: which
    kernels its steps use (gpu/kernels.py resolve); workspace: the device's kernel scratch (split-K
    counters); compile: also torch.compile the model's decoder layers (gpu/compiled.py; kernels
    cached on disk, see cache_dir) in every step but those of the captured shapes in plain_shapes;
    autotune: compile with AUTOTUNE's inductor settings; use_graphs=False runs every step eagerly
    over the same cache (the fallback for models that cannot be captured, and the CPU test path);
    progress(done, total, what): start-up callback. The kernels apply to this runner's calls only,
    not to other users of the same model object.
    """

    def __init__(self, model, width: int, capacity: int, *, kernels: ResolvedKernels, workspace: Workspace,
                 shapes=(), compile: bool = False, autotune: bool = False, use_graphs: bool = True,
                 progress=None, name: str = "model", compile_cache_folder: str = "", tap=None,
                 plain_shapes=()):
        self.model = model
        self.tap = tap  # core/heads.py's AuxTap: armed in every forward and capture of this runner
        self.width = width  # logits columns handed out, as in EagerRunner
        # home: where its inputs, logits and position live (the round's device); the weights may
        # lie on other GPUs too (gpu/stages.py carries each step there and back)
        self.device = workspace.device
        self.stages = None
        self.stage_counters: dict = {}  # split-K counters of the other devices
        if self.device.type == "cuda" and stages.spread(model, self.device):
            self.stages = stages.Stages(model, self.device, self._entered)
            compile = False  # the backend says so in its notes
        self.kernels = kernels
        self.workspace = workspace
        self.name = name
        self.progress = progress
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.shapes = sorted(set(shapes))
        self.graphs: dict[int, _Graph] = {}
        self.switch = None  # the model's rewire.LinearSwitch, with the linear kernel
        self.counters = None  # split-K's arrival counters: taken before any capture or compile holds them
        from specgen.core.step.model import OwnedModel

        # specgen's own model (core/step/): its steps run on gpu/ops.py's table; no module is rewired
        self.owned = isinstance(model, OwnedModel)
        self.ops = None
        if self.owned:
            self.ops = self._owned_ops(kernels, workspace)
            compile = False  # the loader picks transformers' modules for compiled runs
        elif kernels.attention or kernels.linear:
            from specgen.gpu import linear, rewire

            if kernels.attention:
                rewire.switch_attention(model)
                if kernels.rope:
                    rewire.install_rope(model)
            if kernels.linear:
                self.switch = rewire.install_linear(model, kernels.linear_table)
                if kernels.norm:
                    rewire.install_norm(model, self.switch)
                if kernels.split_k:
                    self.counters = linear.split_k_counters(workspace)
                    if self.stages is not None:
                        self.stage_counters = {d: linear.split_k_counters(Workspace(d))
                                               for d in self.stages.devices if d != self.device}
        # A step's inputs (gpu/rewire.py): its rotary embeddings read tables, which _allocate fills
        # for the cache's positions; with the attention kernel in every call, no mask is built.
        from specgen.gpu import rewire

        self.rotary = [] if self.owned else rewire.install_rotary(model)
        self.tables = {}
        self.io = StepIO(model, self.device, self.rotary) if kernels.step_io and not self.owned else None
        self.step_mask = None
        if kernels.attention and not self.owned and rewire.mask_free(model):
            self.step_mask = torch.zeros(rewire.STEP_MASK_SHAPE, dtype=torch.bool, device=self.device)
        self.cache_position = "cache_position" in inspect.signature(type(model).forward).parameters
        from specgen.core.models import cache_keyword

        self.cache_keyword = None if self.owned else cache_keyword(type(model).forward)
        self.compiled = None  # gpu/compiled.py's CompiledLayers, with compile
        # With compile, captured shapes whose graphs hold the uncompiled step: the backend names its
        # prefill chunk, which spares each start one dynamo trace (and inductor load) per model;
        # the chunk's kernels are the same ones, and rounds call the compiled layers.
        self.plain_shapes = frozenset(plain_shapes)
        self.cache_folder = compile_cache_folder
        self.inductor = AUTOTUNE if compile and autotune else {}
        if compile:
            check_writable(self.cache_folder)
            from specgen.gpu import compiled

            with compile_cache(self.cache_folder):  # importing inductor already writes its default folder into os.environ
                self.compiled = compiled.install(model)
        self.length = 0
        self.capacity = 0
        self.generation = 0
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
        self.generation += 1  # graphs captured elsewhere check this
        self.capacity = capacity
        self.position = torch.zeros((), dtype=torch.long, device=self.device)
        self.steps = torch.arange(capacity, device=self.device)
        self.ids = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.long, device=self.device)
        mirrors = self.stages.allocate(self.position, self.steps) if self.stages is not None else None
        if self.owned:
            self.cache = self.model.new_cache(1, capacity)
            self.ops.tabulate(self.model.inv_freq, self.model.dtype, capacity)
        else:
            self.cache = slot_cache(self.model.config, capacity, self.position, self.steps, mirrors)
        from specgen.gpu.rewire import RotaryTable

        dtype = self.model.get_input_embeddings().weight.dtype
        self.tables = {module: RotaryTable(module, capacity, dtype) for module in self.rotary}
        if self.io is not None:
            self.io.rows_for(self.tables.get(self.io.rotary))  # sized before any capture holds it
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
            self.graphs[n] = self._capture(n)  # compiled layers compile in its warm-ups
        if shapes and self.progress is not None:
            self.progress(len(shapes), len(shapes), f"{self.name}: ready")
        self.setup_seconds += time.perf_counter() - start

    def _linear_context(self):
        """gpu/linear.py's path for this runner's forwards (with the linear kernel)."""
        if self.switch is None:
            return contextlib.nullcontext()
        return self.switch.engaged(self.kernels.split_k, self.counters, norm=self.kernels.norm,
                                   dependent=self.kernels.dependent_launch)

    @contextlib.contextmanager
    def step_context(self, tokens: int):
        """What every warm-up and capture of a `tokens`-token step runs in, this runner's own and a
        round's: the linear kernel's switch and, when compiling, the compiled layers (but for the
        plain shapes), the inductor settings and cache."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._linear_context())
            from specgen.gpu.rewire import rotary_tables

            stack.enter_context(rotary_tables(self.tables))
            if self.tap is not None:
                stack.enter_context(self.tap.armed())
            if self.compiled is not None and tokens not in self.plain_shapes:
                stack.enter_context(self.compiled.engaged())
                stack.enter_context(inductor_settings(self.inductor))
                stack.enter_context(compile_cache(self.cache_folder))
            yield

    def _owned_ops(self, kernels: ResolvedKernels, workspace: Workspace):
        from specgen.gpu import linear
        from specgen.gpu.ops import TritonOps

        if kernels.split_k:
            self.counters = linear.split_k_counters(workspace)
        if kernels.linear:
            for layer in self.model.model.layers:
                layer.self_attn.fuse()
        with torch.inference_mode():
            self.positions = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.long, device=self.device)  # a step's rows
        return TritonOps(kernels, self.counters)

    def _owned_step(self, ids: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """The owned model's logits [n or keep, V] for ids [n] after the position (not advanced)."""
        from specgen.core.step.rows import chain_at

        buffer = self.positions if ids.shape[0] <= MAX_GRAPH_TOKENS else None
        rows = chain_at(ids.unsqueeze(0), self.position, self.steps, buffer)
        return self.model.step(rows, self.cache, self.ops, keep)[0]

    @torch.inference_mode()
    def _eager(self, ids: torch.Tensor, want_logits: bool) -> torch.Tensor | None:
        if self.owned:
            with self.tap.armed() if self.tap is not None else contextlib.nullcontext():
                logits = self._owned_step(ids, keep=0 if want_logits else 1)
            self.position.add_(ids.shape[0])
            self.length += ids.shape[0]
            return _fit(logits, self.width) if want_logits else None
        with self._linear_context(), self.tap.armed() if self.tap is not None else contextlib.nullcontext():
            positions = {}
            if self.stages is not None:
                self.stages.sync_positions()  # the cache's layers read their device's copy
                # given, not derived by the model from the cache's length, which lies on another device
                at = self.position + self.steps[:ids.shape[0]]
                positions = {"position_ids": at.unsqueeze(0), **({"cache_position": at} if self.cache_position else {})}
            with self._stepping():
                logits = self._call(input_ids=ids.unsqueeze(0), **{self.cache_keyword: self.cache}, use_cache=True,
                                    logits_to_keep=0 if want_logits else 1, **positions, **self._attention_args())
        n = ids.shape[0]
        self.position.add_(n)
        self.length += n
        return _fit(logits[0], self.width) if want_logits else None

    def _stepping(self):
        """A forward's span: with Stages, it starts and ends on the home device."""
        return self.stages.step() if self.stages is not None else contextlib.nullcontext()

    def _call(self, **inputs) -> torch.Tensor:
        """The model's logits for `inputs`, on the home device."""
        logits = self.model(**inputs).logits
        return self.stages.bring(self.device, logits) if self.stages is not None else logits

    def crossings(self) -> dict[str, str]:
        """Per captured step of a model over several devices, what its replay runs (describe())."""
        return {f"{n}-token step": g.graph.summary() for n, g in sorted(self.graphs.items())
                if isinstance(g.graph, stages.SegmentedGraph)}

    def _entered(self, device: torch.device) -> None:
        """Stages moved a step to `device`: the linear kernel takes that device's split-K counters."""
        if self.switch is not None and self.switch.active and self.counters is not None:
            self.switch.counters = self.stage_counters.get(device, self.counters)

    def step(self, ids: torch.Tensor, logits_out: torch.Tensor) -> torch.Tensor:
        """The captured step: forward at the shared position, logits into the owned buffer, advance."""
        with self._stepping():
            return self._step(ids, logits_out)

    def _step(self, ids: torch.Tensor, logits_out: torch.Tensor) -> torch.Tensor:
        n = ids.shape[0]
        if self.owned:
            logits = self._owned_step(ids)
            from specgen.gpu import step_io

            if self.kernels.step_io:
                step_io.finish(logits, logits_out, self.position, n, dependent=self.kernels.dependent_launch)
            else:
                cols = min(logits.shape[-1], self.width)
                logits_out[:, :cols].copy_(logits[:, :cols])
                self.position.add_(n)
            return logits
        if self.io is None:
            inputs = {"input_ids": ids.unsqueeze(0), **self._step_inputs(self.position + self.steps[:n])}
            logits = self._call(**{self.cache_keyword: self.cache}, use_cache=True, **inputs,
                                **self._attention_args())[0]
            cols = min(logits.shape[-1], self.width)
            logits_out[:, :cols].copy_(logits[:, :cols])
            self.position.add_(n)
            return logits
        from specgen.gpu import step_io

        io = self.io
        table = self.tables.get(io.rotary)
        step_io.inputs(ids, self.position, io.positions, io.weight(), io.embeds, *io.rows_for(table),
                       dependent=self.kernels.dependent_launch, scale=io.scale)
        inputs = self._step_inputs(io.positions[:n])
        if io.embeds is not None:
            inputs["inputs_embeds"] = io.embeds[:n].unsqueeze(0)
        else:
            inputs["input_ids"] = ids.unsqueeze(0)
        if table is not None:
            rows = io.rows[:n].view(1, n, 2, -1)
            table.current = (rows[..., 0, :], rows[..., 1, :])  # the views table.lookup would return
        try:
            logits = self._call(**{self.cache_keyword: self.cache}, use_cache=True, **inputs,
                                **self._attention_args())[0]
        finally:
            if table is not None:
                table.current = None
        step_io.finish(logits, logits_out, self.position, n, dependent=self.kernels.dependent_launch)
        return logits

    def _step_inputs(self, positions: torch.Tensor) -> dict:
        """What the model would derive from the cache per step, handed over instead: the positions
        (one add, where the model launches an arange and an add, twice on transformers versions
        with cache_position; or gpu/step_io.py's) and, with the kernel in every attention call,
        the mask placeholder."""
        inputs = {"position_ids": positions.unsqueeze(0)}
        if self.cache_position:
            inputs["cache_position"] = positions
        if self.step_mask is not None:
            inputs["attention_mask"] = self.step_mask
        return inputs

    def _attention_args(self) -> dict:
        """What the model hands on to gpu/rewire.py's attention: where the step's first token sits,
        whether the kernel rotates and writes the new keys itself, and whether it launches
        dependent on the kernel before (only when it does, so that compiled layers see no new key)."""
        if not self.kernels.attention:
            return {}
        return {"specgen_position": self.position, **({"specgen_rope": True} if self.kernels.rope else {}),
                **({"specgen_dependent": True} if self.kernels.dependent_launch else {})}

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
        if self.stages is not None:
            graph = stages.SegmentedGraph()
            with graph.capturing(self.device), self.stages.recording(graph), self.step_context(n):
                raw = self.step(ids, logits)
        else:
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, self.device), self.step_context(n):
                raw = self.step(ids, logits)
        self.position.fill_(self.length)
        return _Graph(graph, logits, raw)


class StepIO:
    """gpu/step_io.py's buffers for one runner's steps, and which inputs its kernel takes over: the
    embedding (a plain nn.Embedding or Gemma's scaled one, without hooks, on the runner's device,
    of a model whose forward takes inputs_embeds; else the model embeds the ids) and the rotary
    rows (of the model's one tabled rotary embedding; with none or several, each module gathers
    its own)."""

    def __init__(self, model, device: torch.device, rotary: list):
        embed = model.get_input_embeddings()
        takes = "inputs_embeds" in inspect.signature(type(model).forward).parameters
        from specgen.gpu.rewire import unhooked

        plain = type(embed) is torch.nn.Embedding or scaled_embedding(embed)
        self.embed = embed if takes and plain and unhooked(embed) and embed.weight.device == device else None
        # Gemma's scale as its forward multiplies by it: the float32 buffer in the weight's dtype
        self.scale = (float(embed.embed_scale.to(embed.weight.dtype)) if self.embed is not None
                      and scaled_embedding(embed) else None)
        # (a table off the home device, in a model over several GPUs: its module gathers its own)
        self.rotary = rotary[0] if len(rotary) == 1 and rotary[0].inv_freq.device == device else None
        # Inference tensors, as the model's own embedding and gathers return inside a step: a
        # compiled layer (gpu/compiled.py) guards on that too, and would trace layer 0 again.
        with torch.inference_mode():
            self.positions = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.long, device=device)
            self.embeds = None
            if self.embed is not None:
                weight = self.embed.weight
                self.embeds = torch.zeros(MAX_GRAPH_TOKENS, weight.shape[1], dtype=weight.dtype, device=device)
        self.rows = None  # [MAX_GRAPH_TOKENS, 2 * D], sized by the first table

    def weight(self) -> torch.Tensor | None:
        return self.embed.weight if self.embed is not None else None

    def rows_for(self, table) -> tuple:
        """(the table's rows, the buffer the kernel gathers them into), or (None, None)."""
        if table is None:
            return None, None
        flat = table.rows()
        if self.rows is None or self.rows.shape[1] != flat.shape[1] or self.rows.dtype != flat.dtype:
            with torch.inference_mode():
                self.rows = torch.zeros(MAX_GRAPH_TOKENS, flat.shape[1], dtype=flat.dtype, device=flat.device)
        return flat, self.rows


def scaled_embedding(module) -> bool:
    """Gemma's scaled embedding (transformers' Gemma2TextScaledWordEmbedding and its kin): an
    nn.Embedding whose forward returns the rows times its `embed_scale` buffer in the weight's
    dtype, which gpu/step_io.py's gather computes too (tests/test_step_io.py checks it against the
    module). Older transformers scale in the model's forward, with a plain nn.Embedding."""
    base = type(module)
    return (base.__name__.endswith("ScaledWordEmbedding") and base.__bases__ == (torch.nn.Embedding,)
            and isinstance(getattr(module, "embed_scale", None), torch.Tensor) and module.embed_scale.numel() == 1)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
