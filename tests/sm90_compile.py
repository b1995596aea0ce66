"""Compile every Triton kernel that specgen's GPU wrappers launch for an H100/H200 (sm_90), on a CPU.

Why: CI has no GPU, so there the kernels only run in the Triton interpreter (tests/triton_cpu.py),
which does not type-check. A kernel whose loop-carried variable changes type ("Loop-carried variable
x has initial type int32 but is re-assigned to int64 in loop") or shape passes every CPU test and
fails on its first GPU launch. This script calls the wrappers (gpu/kernels/attention.py, linear.py,
norm.py, step_io.py, topw.py, tree_build.py, tree_merge.py, verify.py, warp.py) with CPU tensors, but with
JITFunction.run replaced: each launch is specialised as Triton specialises a GPU launch (its own
binder: an int argument equal to 1 becomes a constant, pointer alignment becomes a divisibility
attribute), compiled for GPUTarget("cuda", 90, 32) up to STAGE, and not run. Outputs are garbage
(torch.empty), which nothing reads.

STAGE (SPECGEN_SM90_STAGE, default ttir): the errors above come from the front end (AST -> Triton
IR): about 0.1 s a variant, 7 s for the ~80 variants below on a 2-core CPU (11 s with the imports).
"ttgir" adds the sm_90 layout, matmul and pipelining passes (up to 4 s a variant, ~30 s in all);
"llir" adds the lowering to LLVM IR (108 s in all); "ptx" and "cubin" add LLVM and ptxas (cubin:
triton.compile itself, tens of seconds a variant). The stages are the nvidia backend's own
(backend.add_stages), run in triton.compile's order; when this Triton's internals differ from
3.9's, the script reports a skip with the reason.

The GPU code path: TRITON_INTERPRET is removed from the environment before Triton is imported, so
@triton.jit makes JITFunction objects and each kernel module's INTERPRETED is False: the bf16
tl.dot paths compile (F32_DOT = False) and warp.py picks the tile sizes of compiled kernels.

Run by tests/gpu/kernels/test_sm90_compile.py; by hand: `python tests/sm90_compile.py`. Prints one JSON object,
the last line of stdout: {"triton", "stage", "skip" (null or why), "kernels" (every top-level
*_kernel JITFunction of the listed modules), "variants" (one per distinct compile: kernel,
constexprs, specialized (runtime arguments Triton made constants), options, scenario, status,
error, seconds), "scenario_errors", "selfcheck", "seconds"}.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
import traceback

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported: JITFunction, not the interpreter

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from specgen.gpu.workspace import Workspace  # noqa: E402  (torch only)

START = time.perf_counter()
STAGE = os.environ.get("SPECGEN_SM90_STAGE", "ttir")
ERROR_CHARS = 3000  # of each error message kept in the report


# -- the compile harness --------------------------------------------------------------------------


class Harness:
    """Replaces JITFunction.run: specialise the launch as on a GPU, compile it up to STAGE for sm_90,
    record the outcome once per distinct variant, launch nothing."""

    def __init__(self):
        # Triton internals (3.9); a missing name or another signature raises here -> skip, with the reason
        from triton import knobs
        from triton.backends.compiler import GPUTarget, Language
        from triton.compiler.compiler import ASTSource, make_backend
        from triton.runtime.jit import create_function_from_signature
        from triton._C.libtriton import ir

        self.target = GPUTarget("cuda", 90, 32)
        self.backend = make_backend(self.target)
        self.ASTSource, self.ir, self.knobs = ASTSource, ir, knobs
        self.make_binder = create_function_from_signature  # (signature, params, backend) -> binder
        self.pack_args = JITFunction._pack_args  # (fn, backend, kwargs, bound, specialization, options)
        make_ir = list(inspect.signature(ASTSource.make_ir).parameters)
        if make_ir != ["self", "target", "options", "codegen_fns", "module_map", "context"]:
            raise TypeError(f"ASTSource.make_ir{tuple(make_ir[1:])}")
        stages = {}
        self.backend.add_stages(stages, self.backend.parse_options({"enable_fp_fusion": True}), Language.TRITON)
        if STAGE not in stages:
            raise ValueError(f"SPECGEN_SM90_STAGE={STAGE!r} is none of the nvidia backend's stages {list(stages)}")
        self.binders = {}  # JITFunction -> Triton's argument binder for it
        self.variants = {}  # key -> record
        self.scenario = None  # label of the wrapper call in progress

    def launch(self, fn, args, kwargs):
        kwargs = dict(kwargs, debug=kwargs.get("debug", fn.debug) or self.knobs.runtime.debug)  # as JITFunction.run
        if fn not in self.binders:
            self.binders[fn] = self.make_binder(fn.signature, fn.params, self.backend)
        bound, specialization, launch_options = self.binders[fn](*args, **kwargs)
        options, signature, constexprs, attrs = self.pack_args(fn, self.backend, kwargs, bound, specialization,
                                                               launch_options)
        key = (fn.fn.__module__, fn.__name__, repr(sorted(signature.items())), repr(sorted(constexprs.items())),
               repr(sorted(attrs.items())), repr(options))
        if key in self.variants:
            return
        declared = {p.name for p in fn.params if p.is_constexpr}
        named = {fn.params[path[0]].name if len(path) == 1 else repr(path): value for path, value in constexprs.items()}
        record = {
            "kernel": f"{fn.fn.__module__}.{fn.__name__}",
            "constexprs": {k: _plain(v) for k, v in named.items() if k in declared},
            "specialized": {k: _plain(v) for k, v in named.items() if k not in declared},
            "signature": {k: v for k, v in signature.items() if v != "constexpr"},
            "options": {k: getattr(options, k) for k in ("num_warps", "num_stages", "num_ctas")},
            "scenario": self.scenario,
        }
        begin = time.perf_counter()
        try:
            self.compile(fn, options, signature, constexprs, attrs)
            record.update(status="ok", error=None)
        except Exception as error:  # noqa: BLE001  (every compile error is a result)
            record.update(status="error", error=_error_text(error))
        record["seconds"] = round(time.perf_counter() - begin, 3)
        self.variants[key] = record

    def compile(self, fn, options, signature, constexprs, attrs):
        """triton.compile's pipeline for an AST source, without its cache, stopping after STAGE."""
        src = self.ASTSource(fn, signature, constexprs, attrs)
        if STAGE == "cubin":  # everything: the real thing (its cache included)
            triton.compile(src, target=self.target, options=options.__dict__)
            return
        context = self.ir.context()
        self.ir.load_dialects(context)
        self.backend.load_dialects(context)
        module = src.make_ir(self.target, options, self.backend.get_codegen_implementation(options),
                             self.backend.get_module_map(), context)
        stages = {}
        self.backend.add_stages(stages, options, src.language)
        metadata = {"target": self.target, **options.__dict__}
        for name, stage in stages.items():  # ttir, ttgir, llir, ptx, cubin
            module = stage(module, metadata)
            if name == STAGE:
                return


def _error_text(error: BaseException) -> str:
    """The error and its causes, outermost first: an error inside a @triton.jit helper is raised
    as a CompilationError at the call site whose cause holds the helper's own line and message."""
    parts = []
    while error is not None and len(parts) < 8:
        parts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return "\n-- caused by --\n".join(parts)[-ERROR_CHARS:]


def _plain(value):
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


HARNESS = None


def _run(self, *args, grid, warmup=False, **kwargs):  # JITFunction.run
    HARNESS.launch(self, args, kwargs)


# -- self-check: the harness reports the bug class it exists for ----------------------------------


@triton.jit
def _selfcheck_int64_loop_kernel(ptr, n):
    total = 0  # int32 ...
    for i in range(n):
        total += tl.load(ptr + i)  # ... re-assigned to int64 (ptr is int64): a GPU compile error
    tl.store(ptr, total)


@triton.jit
def _selfcheck_shape_loop_kernel(ptr, n):
    total = tl.load(ptr)  # a scalar ...
    for i in range(n):
        total += tl.load(ptr + tl.arange(0, 16))  # ... re-assigned to a [16] block
    tl.store(ptr + tl.arange(0, 16), total)


@triton.jit
def _selfcheck_ok_kernel(ptr, n):
    total = tl.zeros([], tl.int64)  # the fixed form of the first: compiles
    for i in range(n):
        total += tl.load(ptr + i)
    tl.store(ptr, total)


SELFCHECK = {  # kernel -> whether it must compile
    _selfcheck_int64_loop_kernel: False,
    _selfcheck_shape_loop_kernel: False,
    _selfcheck_ok_kernel: True,
}


def selfcheck() -> dict:
    """{name: {expect, status, error}} of the kernels above, launched as the wrappers' kernels are."""
    out = {}
    for kernel, compiles in SELFCHECK.items():
        HARNESS.scenario = "selfcheck"
        kernel[(1,)](torch.zeros(16, dtype=torch.int64), 16, enable_fp_fusion=True)
        record = [r for r in HARNESS.variants.values() if r["kernel"].endswith("." + kernel.__name__)][-1]
        out[kernel.__name__] = {"expect": "ok" if compiles else "error", "status": record["status"],
                                "error": record["error"]}
    for key in [k for k, r in HARNESS.variants.items() if r["scenario"] == "selfcheck"]:
        del HARNESS.variants[key]
    return out


# -- the wrappers' launches: realistic shapes and every compile-time branch -----------------------

BF16, F32 = torch.bfloat16, torch.float32


def attention_scenarios(attention):
    """decode_attention as a Llama-3-8B layer calls it (32 heads, 8 KV heads, dim 128, batch 1):
    1-token steps and k = 4 verifications (5 tokens), a cache of one 64-key split and one of 4
    splits (merged by _combine_kernel), with the rotary embedding and cache write in the kernel or
    not; then a sliding window (Mistral), float16, and the block sizes of other shapes."""
    batch = 1

    def call(dtype, tokens, capacity, rope, window=0, heads=32, kv_heads=8, dim=128, dependent=False):
        # query and new keys as the model makes them: [B, q, H, D] transposed, not contiguous
        query = torch.empty(batch, tokens, heads, dim, dtype=dtype).transpose(1, 2)
        key = torch.empty(batch, kv_heads, capacity, dim, dtype=dtype)
        value = torch.empty_like(key)
        position = torch.tensor(capacity - tokens)  # int64, the last positions of the cache
        new = None
        if rope:
            k_new = torch.empty(batch, tokens, kv_heads, dim, dtype=dtype).transpose(1, 2)
            v_new = torch.empty(batch, tokens, kv_heads, dim, dtype=dtype).transpose(1, 2)
            cos = torch.empty(1, tokens, dim, dtype=dtype)
            new = (k_new, v_new, cos, torch.empty_like(cos))
        attention.decode_attention(query, key, value, position, dim ** -0.5, window, new, dependent=dependent)

    for dtype in (BF16, F32):
        for tokens in (1, 5):
            for capacity, splits in ((64, 1), (256, 4)):  # SPLIT_KEYS = 64 keys a split
                for rope in (False, True):
                    label = f"attention {str(dtype)[6:]} tokens={tokens} splits={splits} rope={rope}"
                    yield label, lambda a=(dtype, tokens, capacity, rope): call(*a)
    yield "attention bfloat16 tokens=5 splits=4 rope=True window=4096", lambda: call(BF16, 5, 256, True, window=4096)
    yield "attention float16 tokens=5 splits=4 rope=True", lambda: call(torch.float16, 5, 256, True)
    for tokens, capacity, rope in ((1, 256, True), (5, 64, False)):  # gpu/kernels/dependent.py's wait and release
        yield (f"attention bfloat16 tokens={tokens} capacity={capacity} rope={rope} dependent",
               lambda a=(tokens, capacity, rope): call(BF16, *a, dependent=True))

    def tree(rope, batch=3, tokens=32, capacity=256, heads=32, kv_heads=8, dim=128, dtype=BF16, window=0, softcap=0.0,
             dependent=False):
        """a token tree's rows (core/step/rows.py's tails), each sequence its own start: tiles of
        several tokens (4 at group 4), the prefix's blocks shared, the blocks past the start a token at a
        time"""
        query = torch.empty(batch, tokens, heads, dim, dtype=dtype).transpose(1, 2)
        key = torch.empty(batch, kv_heads, capacity, dim, dtype=dtype)
        tail, depth = torch.zeros(batch, tokens, tokens, dtype=torch.int64), torch.ones(batch, tokens, dtype=torch.int64)
        new = None
        if rope:
            k_new = torch.empty(batch, tokens, kv_heads, dim, dtype=dtype).transpose(1, 2)
            cos = torch.empty(batch, tokens, dim, dtype=dtype)
            new = (k_new, torch.empty_like(k_new), cos, torch.empty_like(cos))
        attention.decode_attention(query, key, torch.empty_like(key), torch.zeros(batch, dtype=torch.int64),
                                   dim ** -0.5, window, new, softcap, dependent=dependent, tail=tail, depth=depth)

    for rope in (False, True):
        yield f"attention bfloat16 tree tokens=32 batch=3 splits=4 rope={rope}", lambda r=rope: tree(r)
    yield "attention bfloat16 tree tokens=17 batch=1 splits=4 rope=True dependent", lambda: tree(True, 1, 17, dependent=True)
    yield "attention float32 tree tokens=33 batch=1 splits=4 rope=True", lambda: tree(True, 1, 33, dtype=F32)
    yield ("attention bfloat16 tree tokens=33 batch=2 splits=4 rope=True window=4096 softcap=50 Gemma-2-9B",
           lambda: tree(True, 2, 33, heads=16, kv_heads=8, dim=256, window=4096, softcap=50.0))
    yield ("attention bfloat16 tree tokens=9 batch=1 splits=1 rope=False group 1",
           lambda: tree(False, 1, 9, capacity=64, heads=8, kv_heads=8))
    for heads, kv_heads, dim, model in ((28, 4, 128, "Qwen2-7B: 35 rows, BLOCK_M 64"),
                                        (8, 1, 256, "head dim 256: BLOCK_N 32"), (32, 8, 64, "Llama-3.2-1B")):
        yield (f"attention bfloat16 tokens=5 splits=4 rope=True {model}",
               lambda a=(heads, kv_heads, dim): call(BF16, 5, 256, True, heads=a[0], kv_heads=a[1], dim=a[2]))


def linear_scenarios(linear):
    """linear / gate_up in each configuration the rules pick, WIDE (N > 2048) and NARROW (N <= 2048),
    and the register path (GEMV, a tuned table's choice); one row tile, several (20 and 64 rows);
    K a multiple of BLOCK_K or not (EVEN_K); with a bias (Qwen2's q/k/v); gate_up with silu and
    gelu_tanh; bf16 and float32."""
    gemv = (False, 2, 1024, 4, 1)
    cases = [  # rows, N, K, bias, config
        (1, 4096, 256, False, None),  # WIDE, EVEN_K
        (5, 4096, 200, True, None),  # WIDE, K not a multiple of BLOCK_K, bias
        (20, 4096, 256, False, None),  # WIDE, two row tiles
        (1, 1024, 256, True, gemv),  # GEMV, bias
        (1, 1024, 200, False, gemv),  # GEMV, not EVEN_K
        (64, 1024, 256, False, gemv),  # GEMV, 64 row tiles
        (5, 1024, 256, False, None),  # NARROW
        (5, 1024, 200, True, None),  # NARROW, not EVEN_K, bias
    ]
    for dtype in (BF16, F32):
        name = str(dtype)[6:]
        for rows, n, k, bias, config in cases:
            def call(rows=rows, n=n, k=k, bias=bias, dtype=dtype, config=config):
                weight = torch.empty(n, k, dtype=dtype)
                b = torch.empty(n, dtype=dtype) if bias else None
                linear.linear(torch.empty(rows, k, dtype=dtype), weight, b, config)

            yield f"linear {name} rows={rows} N={n} K={k} bias={bias} config={config}", call
        for activation, (rows, n, k) in [("silu", (1, 4096, 256)), ("silu", (5, 4096, 200)),
                                          ("gelu_tanh", (5, 4096, 256)), ("gelu_tanh", (1, 1024, 200))]:
            def call(rows=rows, n=n, k=k, activation=activation, dtype=dtype):
                x = torch.empty(1, rows, k, dtype=dtype)  # [B, q, hidden] as the MLP gets it
                linear.gate_up(x, torch.empty(n, k, dtype=dtype), torch.empty(n, k, dtype=dtype), activation)

            yield f"gate_up {name} {activation} rows={rows} N={n} K={k}", call
        for split, (rows, n, k) in [(2, (1, 4096, 512)), (3, (20, 4096, 700))]:  # K in chunks (split-K)
            config = (True, 32, 256, 4, 4, split)

            def call(rows=rows, n=n, k=k, dtype=dtype, config=config):
                x = torch.empty(rows, k, dtype=dtype)
                counters = linear.split_k_counters(Workspace("cpu"))
                linear.linear(x, torch.empty(n, k, dtype=dtype), torch.empty(n, dtype=dtype), config, counters=counters)
                linear.gate_up(x, torch.empty(n, k, dtype=dtype), torch.empty(n, k, dtype=dtype), "silu", config,
                               counters=counters)

            yield f"linear and gate_up {name} split_k={split} rows={rows} N={n} K={k}", call
    for split in (1, 4):  # launched dependent on the kernel before (gpu/kernels/dependent.py)
        def call(split=split):
            x, counters = torch.empty(1, 2048, dtype=BF16), linear.split_k_counters(Workspace("cpu"))
            for config in ((True, 32, 128, 4, 4, split), (False, 2, 1024, 4, 1)):  # tensor cores, matrix-vector
                linear.linear(x, torch.empty(2048, 2048, dtype=BF16), None, config, counters=counters,
                              residual=torch.empty(1, 2048, dtype=BF16), dependent=True)
            linear.gate_up(x, torch.empty(8192, 2048, dtype=BF16), torch.empty(8192, 2048, dtype=BF16), "silu",
                           (True, 16, 256, 4, 4, split), counters=counters, dependent=True)
            linear.gate_up(x, torch.empty(8192, 2048, dtype=BF16), torch.empty(8192, 2048, dtype=BF16), "silu",
                           (False, 2, 1024, 4, 1), dependent=True)

        yield f"linear and gate_up bfloat16 dependent split_k={split}", call


def norm_scenarios(norm):
    """rms_norm (Llama's form and Gemma's), add_rms_norm and Gemma 2's offset_norm_add (with and
    without the second norm), one row and five, bf16 and float32, launched plainly and dependent."""
    for dtype in (BF16, F32):
        for rows in (1, 5):
            for dependent in (False, True):
                def call(rows=rows, dtype=dtype, dependent=dependent):
                    x, weight = torch.empty(rows, 2048, dtype=dtype), torch.empty(2048, dtype=dtype)
                    norm.rms_norm(x, weight, 1e-5, dependent)
                    norm.rms_norm(x, weight, 1e-6, dependent, offset=True)
                    norm.add_rms_norm(x, torch.empty_like(x), weight, 1e-5, dependent)
                    norm.offset_norm_add(x, torch.empty_like(x), weight, 1e-6, (weight, 1e-6), dependent)
                    norm.offset_norm_add(x, torch.empty_like(x), weight, 1e-6, None, dependent)

                yield f"norm {str(dtype)[6:]} rows={rows} dependent={dependent}", call


def step_io_scenarios(step_io):
    """A step's inputs with the embedding (Gemma's scaled one too) and rotary rows, then its finish,
    plainly and dependent."""
    for dependent in (False, True):
        for scale in (None, 48.0):
            def call(dependent=dependent, scale=scale):
                ids, position = torch.zeros(5, dtype=torch.int64), torch.tensor(3)
                positions = torch.empty(5, dtype=torch.int64)
                step_io.inputs(ids, position, positions, torch.empty(100, 2048, dtype=BF16),
                               torch.empty(5, 2048, dtype=BF16), torch.empty(64, 128, dtype=BF16),
                               torch.empty(5, 128, dtype=BF16), dependent=dependent, scale=scale)
                step_io.finish(torch.empty(5, 1000, dtype=BF16), torch.empty(5, 1000), position, 5, dependent=dependent)

            yield f"step_io dependent={dependent} scale={scale}", call

    def rows(fill):  # three sequences' rows: a batch's pending positions, or a tree's given ones
        ids, starts = torch.zeros(12, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
        step_io.inputs(ids, starts, torch.empty(12, dtype=torch.int64), torch.empty(100, 2048, dtype=BF16),
                       torch.empty(12, 2048, dtype=BF16), torch.empty(64, 128, dtype=BF16),
                       torch.empty(12, 128, dtype=BF16), per=4, fill=fill)

    for fill in (True, False):
        yield f"step_io rows fill={fill}", lambda f=fill: rows(f)


def verify_scenarios(verify):
    """Greedy and random verification of a k = 4 proposal: a vocabulary in one segment (100) and one
    in 38 segments (Qwen2's 151936, SEGMENTED), with draft probabilities or without (n-gram drafts)."""
    k, batch = 4, 1

    def common():
        draft = torch.zeros(k, dtype=torch.int64)
        cu = torch.tensor([k], dtype=torch.int32)
        return draft, cu, Workspace("cpu")

    def greedy():
        draft, cu, workspace = common()
        verify.verify_greedy(draft, cu, torch.zeros(k + batch, dtype=torch.int64), k, workspace)

    def dependent():
        draft, cu, workspace = common()
        verify.verify_greedy(draft, cu, torch.zeros(k + batch, dtype=torch.int64), k, workspace, dependent=True)
        verify.verify_random(draft, cu, torch.empty(k, 128256), torch.empty(k + batch, 128256), torch.empty(k),
                             torch.empty(batch, 128256), k, workspace, dependent=True)

    yield "verify_greedy k=4", greedy
    yield "verify_greedy and verify_random k=4 dependent", dependent
    for vocab in (100, 151936):
        for with_q in (True, False):
            def call(vocab=vocab, with_q=with_q):
                draft, cu, workspace = common()
                q = torch.empty(k, vocab) if with_q else None
                verify.verify_random(draft, cu, q, torch.empty(k + batch, vocab), torch.empty(k),
                                     torch.empty(batch, vocab), k, workspace)

            yield f"verify_random vocab={vocab} draft_probs={with_q}", call


def warp_scenarios(warp, argmax):
    """warp over the 5 rows of a k = 4 verification: greedy, temperature only, top-k / top-p through
    the parallel cut search (parallel_cut: one compile for <= 32 chunks, one for more), min-p through the
    one-program search, penalties and bad masks ([V] and [N, V]), the race (expo), bf16 and float32
    logits, and small vocabularies in one register tile (tiny models)."""
    from specgen.core.sampling.warp import PenaltyRows, WarpParams

    rows = 5
    defaults = dict(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                    presence_penalty=0.0, frequency_penalty=0.0)

    def call(vocab, dtype, penalties=False, bad_mask=None, race=False, dependent=False, **values):
        def column(name):
            value = values.get(name, defaults[name])
            value = value if isinstance(value, list) else [value]
            return torch.tensor([value[i % len(value)] for i in range(rows)],
                                dtype=torch.int32 if name == "top_k" else torch.float32)

        params = WarpParams(**{name: column(name) for name in defaults})
        penalty = None
        if penalties:
            penalty = PenaltyRows(torch.zeros(rows, vocab, dtype=torch.int32),
                                  torch.zeros(rows, vocab, dtype=torch.bool))
        mask = None
        if bad_mask is not None:  # "vocab": [V], "rows": [N, V]
            mask = torch.zeros(*([rows] if bad_mask == "rows" else []), vocab, dtype=torch.bool)
        expo = torch.empty(rows, vocab) if race else None
        race_out = torch.empty(rows, dtype=torch.int64) if race else None
        warp.warp(torch.empty(rows, vocab, dtype=dtype), params, penalty, mask, Workspace("cpu"), expo, race_out,
                  dependent=dependent)

    yield "warp 151936 bf16 greedy race", lambda: call(151936, BF16, race=True, temperature=0.0)
    yield "warp 151936 f32 temperature race", lambda: call(151936, F32, race=True, temperature=0.8)
    yield ("warp 151936 bf16 top_k+top_p penalties bad_mask[V] race",
           lambda: call(151936, BF16, penalties=True, bad_mask="vocab", race=True, temperature=0.7, top_k=50,
                        top_p=0.9, repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2))
    yield "warp 32000 f32 top_p", lambda: call(32000, F32, temperature=0.8, top_p=0.95)
    # gpu/kernels/dependent.py's wait and release in each warp kernel: the parallel and one-program searches
    yield ("warp 128256 bf16 top_k+top_p race dependent",
           lambda: call(128256, BF16, race=True, dependent=True, temperature=0.8, top_k=50, top_p=0.9))
    yield "warp 128256 bf16 min_p dependent", lambda: call(128256, BF16, dependent=True, temperature=1.0, min_p=0.05)
    yield "warp 128256 bf16 min_p (one-program cut)", lambda: call(128256, BF16, temperature=1.0, min_p=0.05)
    yield ("warp 100 f32 all options bad_mask[N,V] race",
           lambda: call(100, F32, penalties=True, bad_mask="rows", race=True, temperature=[0.7, 1.3], top_k=[40, 3],
                        top_p=[0.9, 0.6], min_p=[0.05, 0.01], repetition_penalty=1.2))
    yield ("warp 4096 bf16 mixed greedy/sampled rows",
           lambda: call(4096, BF16, temperature=[0.0, 0.9, 1.2], top_k=[-1, 30, -1], top_p=[1.0, 0.9, 0.5]))
    # a greedy draft's pick: one row of float32 logits, in segments and merged, or one segment
    yield "argmax 128256 f32", lambda: argmax.argmax(torch.empty(1, 128256), torch.empty(1, dtype=torch.int64),
                                                    Workspace("cpu"))
    yield "argmax 4096 f32", lambda: argmax.argmax(torch.empty(1, 4096), torch.empty(1, dtype=torch.int64),
                                                 Workspace("cpu"))
    yield "argmax 128256 f32 dependent", lambda: argmax.argmax(torch.empty(1, 128256), torch.empty(1, dtype=torch.int64),
                                                              Workspace("cpu"), dependent=True)


def tree_scenarios(tree_walk, compact):
    """A k = 4, width 2, 8-node tree round's walks (greedy; sibling and recursive over 128256 ids,
    recursive with point-mass lanes, and dependent), and the compaction of a 16-layer bf16 cache (head dim 64, 128)."""
    k, w, rows, vocab = 4, 2, 9, 128256
    children = torch.zeros(1, rows, w, dtype=torch.int64)
    tokens = torch.zeros(1, rows, dtype=torch.int64)
    limit = torch.tensor([k], dtype=torch.int32)
    sampled = (torch.empty(1, rows, vocab), torch.empty(1, k, w), torch.empty(1, vocab))

    def walks(dependent):
        workspace = Workspace("cpu")
        tree_walk.greedy_walk(children, tokens, tokens, limit, k, workspace, dependent=dependent)
        probs, uniforms, expo = sampled
        tree_walk.sibling_walk(children, tokens, probs, uniforms, expo, limit, k, workspace, dependent=dependent)
        tree_walk.recursive_walk(children, children, tokens, probs, torch.empty(1, rows, vocab), uniforms, expo,
                                 limit, k, workspace, dependent=dependent)
        tree_walk.recursive_walk(children, children, tokens, probs, torch.empty(1, rows, vocab), uniforms, expo,
                                 limit, k, workspace, dependent=dependent,
                                 point=torch.zeros(1, rows, w, dtype=torch.bool))  # a merged tree's

    def move(dim, dependent=False):
        planes = torch.empty(2, 16, 1, 8, 256, dim, dtype=BF16)
        src = torch.zeros(1, k, dtype=torch.int64)
        compact.compact(planes, torch.empty(1, 256, dtype=torch.int64), src, src, dependent=dependent)

    yield "tree walks k=4 w=2", lambda: walks(False)
    yield "tree walks k=4 w=2 dependent", lambda: walks(True)
    yield "compact bf16 d=64", lambda: move(64)
    yield "compact bf16 d=128 dependent", lambda: move(128, dependent=True)


def tree_build_scenarios(tree_build):
    """Three k = 4, width 3 trees' construction in one stack (a program per row; one row draws its
    children, which the selection reads per row): the roots' level, a middle level (the next
    frontier), the last level, and the selection; and a k = 1 stack's (no stepped nodes); plainly
    and dependent."""
    from specgen.core.round.tree import TreeStack

    for dependent in (False, True):
        for k in (4, 1):
            def call(dependent=dependent, k=k):
                trees = TreeStack(3, k, 3, 12 if k > 1 else 2, torch.device("cpu"))
                trees.draws[1] = True
                start = torch.zeros(3, dtype=torch.int64)
                kids, logq = torch.zeros(9, 3, dtype=torch.int64), torch.zeros(9, 3)
                tree_build.expand(trees, 0, kids[:3], logq[:3], start, start, dependent=dependent)
                for level in (1, 3) if k > 1 else ():  # a middle level and the last
                    tree_build.expand(trees, level, kids, logq, start, dependent=dependent)
                tree_build.select(trees, start, dependent=dependent)

            yield f"tree_build k={k} dependent={dependent}", call


def tree_merge_scenarios(tree_merge):
    """A hybrid round's merged tree (gpu/kernels/tree_merge.py): a k = 4, width 3, 12-node model
    tree and a staged trie, and a k = 1 one (no ancestor walk); and the widest envelope (k = 6,
    width 8, 63 nodes: 64 rows, a pool of 328 over its blocks of 64); plainly and dependent."""
    from types import SimpleNamespace

    from specgen.core.round.tree import Tree

    for dependent in (False, True):
        for k, w, n in ((4, 3, 12), (1, 3, 3), (6, 8, 63)):
            def call(dependent=dependent, k=k, w=w, n=n):
                tree = Tree(k, w, n, torch.device("cpu"), drawn=True)
                lookup = SimpleNamespace(children=torch.full((n + 1, w), -1, dtype=torch.int64),
                                         ids=torch.zeros(n, dtype=torch.int64),
                                         parents=torch.zeros(n + 1, dtype=torch.int64))
                point = torch.zeros(n + 1, w, dtype=torch.bool)
                tree_merge.merge(tree, lookup, torch.zeros(1, dtype=torch.int64), point, Workspace("cpu"),
                                 dependent=dependent)

            yield f"tree_merge k={k} w={w} n={n} dependent={dependent}", call


def topw_scenarios(topw):
    """A tree's children: the top-w of a root's [1, 128256] and a level's [3, 32000] log q, with w
    from 1 to 8, with Exp(1) noise per row and shared, plainly and dependent."""
    for dependent in (False, True):
        for rows, vocab, w, noise in ((1, 128256, 2, None), (3, 32000, 3, "rows"), (3, 32000, 8, "shared"),
                                      (1, 4096, 1, None)):
            def call(rows=rows, vocab=vocab, w=w, noise=noise, dependent=dependent):
                expo = None if noise is None else torch.empty(rows if noise == "rows" else 1, vocab)
                topw.top_w(torch.empty(rows, vocab), expo, w, Workspace("cpu"), dependent=dependent)

            yield f"topw [{rows}, {vocab}] w={w} noise={noise} dependent={dependent}", call


# -- main -------------------------------------------------------------------------------------------


def kernels(modules) -> list[str]:
    """Every top-level @triton.jit kernel (name ending in _kernel) of the modules."""
    return sorted(f"{m.__name__}.{name}" for m in modules for name, obj in vars(m).items()
                  if isinstance(obj, JITFunction) and name.endswith("_kernel") and obj.fn.__module__ == m.__name__)


def main() -> dict:
    global HARNESS
    report = {"triton": triton.__version__, "stage": STAGE, "skip": None}
    try:
        HARNESS = Harness()
    except Exception as error:  # noqa: BLE001
        report["skip"] = f"no sm_90 compile harness with triton {triton.__version__}: {type(error).__name__}: {error}"
        return report
    JITFunction.run = _run

    from specgen.gpu.kernels import (argmax, attention, compact, cuts, linear, norm, step_io, topw, tree_build,
                                     tree_merge, tree_walk, verify, warp)
    # the code path an H100 takes (see the module docstring)
    assert not (attention.INTERPRETED or linear.INTERPRETED or warp.INTERPRETED), "TRITON_INTERPRET leaked"

    report["selfcheck"] = selfcheck()
    scenario_errors = {}
    for scenarios in (attention_scenarios(attention), linear_scenarios(linear), verify_scenarios(verify),
                      warp_scenarios(warp, argmax), norm_scenarios(norm), step_io_scenarios(step_io),
                      tree_scenarios(tree_walk, compact), tree_build_scenarios(tree_build), tree_merge_scenarios(tree_merge),
                      topw_scenarios(topw)):
        for label, call in scenarios:
            HARNESS.scenario = label
            try:
                call()
            except Exception:  # noqa: BLE001  (a wrapper that fails before its launch)
                scenario_errors[label] = traceback.format_exc()[-ERROR_CHARS:]
    report["kernels"] = kernels((attention, linear, verify, warp, cuts, argmax, norm, step_io, tree_walk, compact, tree_build,
                                 tree_merge, topw))
    report["variants"] = list(HARNESS.variants.values())
    report["scenario_errors"] = scenario_errors
    return report


if __name__ == "__main__":
    result = main()
    result["seconds"] = round(time.perf_counter() - START, 2)
    sys.stdout.flush()
    print(json.dumps(result))
