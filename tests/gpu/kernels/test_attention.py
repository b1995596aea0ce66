"""gpu/kernels/attention.py: the decode-attention kernel against its torch reference, and inside models
through specgen's own model step (gpu/ops.py's table).

Attention is a floating-point reduction whose order differs between the kernel (key blocks, online
softmax, split merge) and the reference (one softmax over the masked cache), so the two agree to a
tolerance, not bit for bit: float32 within 2e-6 absolute on unit-scale inputs (observed ~3e-7), 16-bit
within one output rounding step. Inside a model, runners with the kernel and with SDPA must give the
same logits (float32, within RUNNER_TOLERANCE) and the same greedy tokens, over prefill, steps of 1 and
k+1 tokens, and rollbacks: the position the kernel reads is the runner's own.
On CPU the kernels run in the Triton interpreter (tests/triton_cpu.py).
"""

from __future__ import annotations

from triton_cpu import DEVICE, INTERPRETED  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels, resolved, runner
from specgen.gpu.kernels import attention
from specgen.gpu.kernels.attention import decode_attention
from specgen.gpu.policy import attention_unsupported
from specgen.gpu.kernels.reference import decode_attention_reference, rope_attention_reference, rotate_reference

CASES = [  # batch, heads, kv heads, tokens, head dim, capacity, position, window
    (1, 12, 4, 5, 64, 640, 300, 0),  # bench-target shape, 10 splits, k = 4 verification
    (1, 4, 4, 1, 64, 64, 5, 0),  # 1-token step, no GQA, one split
    (1, 8, 2, 3, 80, 1024, 700, 0),  # head dim not a power of two, 16 splits
    (1, 4, 1, 2, 32, 8192, 5000, 0),  # a long cache: 64 splits of 128 keys
    (1, 8, 2, 9, 64, 600, 250, 100),  # sliding window reaching back into an earlier split
    (2, 4, 2, 20, 32, 256, 100, 0),  # batch 2, rows over one tile
    (1, 2, 1, 40, 16, 300, 0, 0),  # first step of a sequence, 40 tokens x 2 heads: two row tiles
    (1, 8, 2, 5, 64, 512, 508, 7),  # last positions of the cache, tiny window
]


def _inputs(case, dtype, seed=0):
    batch, heads, kv_heads, tokens, dim, capacity, position, _ = case
    gen = torch.Generator().manual_seed(seed)
    # query as the model makes it: [B, q, H, D] transposed, so not contiguous
    query = torch.randn(batch, tokens, heads, dim, generator=gen).transpose(1, 2)
    key = torch.randn(batch, kv_heads, capacity, dim, generator=gen)
    value = torch.randn(batch, kv_heads, capacity, dim, generator=gen)
    return [t.to(dtype).to(DEVICE) for t in (query, key, value)] + [torch.tensor(position, device=DEVICE)]


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference_float32(case):
    query, key, value, position = _inputs(case, torch.float32)
    window = case[-1]
    scale = query.shape[-1] ** -0.5
    out = decode_attention(query, key, value, position, scale, window)
    ref = decode_attention_reference(query, key, value, position, scale, window)
    assert out.shape == ref.shape == (case[0], case[3], case[1], case[4])
    assert (out - ref).abs().max().item() < 2e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_matches_reference_16_bit(dtype):
    case = CASES[0]
    query, key, value, position = _inputs(case, dtype, seed=1)
    out = decode_attention(query, key, value, position, 0.125)
    ref = decode_attention_reference(query, key, value, position, 0.125)
    assert out.dtype == dtype
    step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10  # one rounding step of values < 2
    assert (out.float() - ref.float()).abs().max().item() <= 2 * step


@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_kernel_ignores_keys_past_each_token(softcap):
    """Garbage after the live keys (stale drafts, unwritten slots) must not leak into the output,
    also through soft-capping (which bends the garbage's scores before the mask)."""
    case = CASES[0]
    query, key, value, position = _inputs(case, torch.float32)
    before = decode_attention(query, key, value, position, 0.125, softcap=softcap)
    live = int(position) + case[3]
    key[:, :, live:] = 1e4
    value[:, :, live:] = float("nan")
    after = decode_attention(query, key, value, position, 0.125, softcap=softcap)
    assert torch.equal(before, after)


SOFTCAP = 2.0  # a cap that bends unit-scale scores: Gemma 2's 50 would barely touch random inputs


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[7]], ids=["global", "window", "window-at-the-end"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_softcapped_kernel_matches_reference(case, dtype):
    """Soft-capping (Gemma 2's attention, which alternates windowed and global layers): kernel and
    reference agree within the uncapped tolerances, and the cap moves the output by far more, so a
    kernel that ignored it (or capped after the mask, or unscaled scores) would fail."""
    query, key, value, position = _inputs(case, dtype, seed=2)
    window, scale = case[-1], 3 * case[4] ** -0.5  # scores of a few units: most of them bent by the cap
    out = decode_attention(query, key, value, position, scale, window, softcap=SOFTCAP)
    ref = decode_attention_reference(query, key, value, position, scale, window, softcap=SOFTCAP)
    uncapped = decode_attention_reference(query, key, value, position, scale, window)
    assert out.dtype == dtype and out.shape == ref.shape
    tol = 2e-6 if dtype == torch.float32 else 2 * 2.0 ** -7
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (uncapped.float() - ref.float()).abs().max().item() > 100 * tol


# Max logit difference between a kernel runner and an SDPA runner on the tiny models below (logits up
# to ~15, weights at initializer_range 0.5, so rounding grows through the layers). Observed
# (benchmarks/bench_kernels.py attention --runner): up to 3.2e-5 in the CPU interpreter; on an H200 up to 8.7e-5 with the
# model's rotary and 1.1e-4 with the kernel's, whose rotation rounds once (FMA) where PyTorch's
# rounds three times (kernel-rotary vs model-rotary: up to 3.9e-5 there, 0 in the interpreter).
# A fault (a stale or missing key, a window off by one) moves these logits by 1e-2 or more.
RUNNER_TOLERANCE = 3e-4


def _tiny(family: str, **extra):
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
               "qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    config_cls, model_cls = classes[family]
    config = config_cls(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                        initializer_range=0.5, bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(3)
    return model_cls(config).to(DEVICE).eval()


def _feed(runner, ids: list[int]) -> torch.Tensor:
    return runner.forward(torch.tensor(ids, dtype=torch.long, device=DEVICE)).clone()


SMALL_CACHE = 192  # three attention splits: the feeds below stay under 64 positions
SCRIPT = [5, 1, -3, 5, 1, 1, -2, 5]  # after a 14-token prompt: feed n tokens, or roll back n


def _run_script(runner) -> list[torch.Tensor]:
    """Logits of each feed: the 14-token prompt, then SCRIPT's steps and rollbacks."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 96, (14,), generator=gen).tolist()
    feeds = [torch.randint(0, 96, (abs(n),), generator=gen).tolist() for n in SCRIPT]
    runner.reset()
    logits = [_feed(runner, prompt)]
    for n, ids in zip(SCRIPT, feeds):
        if n < 0:
            runner.truncate(runner.length + n)
        else:
            logits.append(_feed(runner, ids))
    return logits


@pytest.mark.slow
@pytest.mark.parametrize("rope", [False, True], ids=["model-rotary", "kernel-rotary"])
@pytest.mark.parametrize("family,extra", [("llama", {}), ("mistral", {"sliding_window": 10}), ("qwen2", {}),
                                          ("qwen3", {"head_dim": 16})])
def test_runner_with_kernel_equals_sdpa(family, extra, rope, monkeypatch):
    """A 14-token prefill, then 1- and 5-token steps with rollbacks in between: same logits, with
    the model's own rotary + cache update or with both inside the kernel ([kernels] rope)."""
    calls = []
    real = attention.decode_attention
    rotated = []
    monkeypatch.setattr(attention, "decode_attention",
                        lambda *a, **kw: calls.append(a[0].shape[2]) or rotated.append(kw.get("rope") is not None)
                        or real(*a, **kw))

    model = _tiny(family, **extra)
    kernel = runner(model, capacity=SMALL_CACHE, kernels=kernels(attention=True, rope=rope))
    sdpa = runner(model, capacity=SMALL_CACHE, kernels=kernels())  # same model: no kwarg -> SDPA
    outputs = [_run_script(kernel), _run_script(sdpa)]
    steps = [1, 14] + [n for n in SCRIPT if n > 0]  # allocation, prefill (<= 64), steps
    assert calls == [n for n in steps for _layer in range(2)]  # the kernel runner's, every layer
    # with [kernels] rope the kernel rotates and writes the new keys itself (gpu/ops.py)
    assert rotated == [rope] * len(calls)
    for feed, (got, want) in enumerate(zip(*outputs)):
        assert got.shape == want.shape
        diff = (got - want).abs().max().item()
        assert diff < RUNNER_TOLERANCE, f"feed {feed}: max logit diff {diff:.3g}, logits up to {want.abs().max().item():.3g}"
        assert torch.equal(got.argmax(-1), want.argmax(-1)), f"feed {feed}: greedy tokens differ"


@pytest.mark.slow
def test_runner_comparison_catches_a_window_off_by_one(monkeypatch):
    """RUNNER_TOLERANCE is loose enough for rounding, tight enough for a fault: a kernel whose sliding
    window is one key short (Mistral, window 10) lands far outside it."""
    real = attention.decode_attention
    monkeypatch.setattr(attention, "decode_attention",
                        lambda q, k, v, position, scale, window=0, *rest, **kw: real(q, k, v, position, scale, window - 1,
                                                                                     *rest, **kw))
    model = _tiny("mistral", sliding_window=10)
    faulty = _run_script(runner(model, capacity=SMALL_CACHE, kernels=kernels(attention=True, rope=True)))
    right = _run_script(runner(model, capacity=SMALL_CACHE, kernels=kernels()))
    assert (faulty[0] - right[0]).abs().max().item() > 100 * RUNNER_TOLERANCE  # the prompt: 14 > 10 keys


def test_unsupported_attention_is_refused_with_the_reason():
    from transformers import Gemma2Config, LlamaConfig

    assert attention_unsupported(LlamaConfig(hidden_size=64, num_attention_heads=4)) is None
    assert "head_dim" in attention_unsupported(LlamaConfig(hidden_size=1024, num_attention_heads=2))
    chunked = LlamaConfig(hidden_size=64, num_attention_heads=4)
    chunked.attention_chunk_size = 8
    assert "attention_chunk_size" in attention_unsupported(chunked)
    # soft-capping is the kernel's softcap; the final logits' cap is the model's own
    gemma2 = Gemma2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    assert gemma2.attn_logit_softcapping and gemma2.final_logit_softcapping
    assert attention_unsupported(gemma2) is None


@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")
@pytest.mark.cuda
def test_kernel_matches_reference_bf16_on_gpu_graph():
    """On the GPU, captured in a CUDA graph and replayed at a moved position."""
    case = (1, 32, 8, 5, 128, 1024, 400, 0)
    query, key, value, position = _inputs(case, torch.bfloat16)
    decode_attention(query, key, value, position, 128 ** -0.5)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(query, key, value, position, 128 ** -0.5)
    for at in (400, 17, 1018):
        position.fill_(at)
        graph.replay()
        ref = decode_attention_reference(query, key, value, position, 128 ** -0.5)
        assert (out.float() - ref.float()).abs().max().item() <= 2 * 2.0 ** -7


FAMILIES = {  # transformers config class, extra config: tiny, GQA, windows shorter than the sequence
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": 10}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 10}),  # soft-capping
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_families_step_like_eager_steps(family):
    """Each family through a runner as the fast path builds it (captured steps on a GPU, the
    attention kernel, the other kernels as `auto` resolves them) against eager steps with the
    reference table over the same cache (SDPA; for Gemma 2, soft-capped as its eager attention),
    rollbacks included. (Families the owned step does not cover run transformers' modules eagerly:
    tests/core/step/test_step.py.)"""
    import transformers
    from transformers import AutoModelForCausalLM

    name, extra = FAMILIES[family]
    config = getattr(transformers, name)(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.5, bos_token_id=None,
        eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(4)
    model = AutoModelForCausalLM.from_config(config).to(DEVICE).eval()  # its default attention
    assert attention_unsupported(model.config) is None
    fast = runner(model, capacity=SMALL_CACHE, kernels=resolved(model, attention="kernel"), shapes=(1, 5),
                  use_graphs=True)
    assert fast.kernels.rope
    reference = runner(model, capacity=SMALL_CACHE, kernels=kernels())
    assert bool(fast.graphs) == (torch.device(DEVICE).type == "cuda")
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 96, (14,), generator=gen).tolist()
    steps = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (5, 1, 5, 1, 5)]
    results = []
    for each in (fast, reference):
        each.reset()
        out = [_feed(each, prompt)]
        for ids in steps:
            out.append(_feed(each, ids))
            each.truncate(each.length - 2)  # a rejection: roll back over stale K/V
        results.append(out)
    for got, want in zip(*results):
        assert (got - want).abs().max().item() < 1e-3 * max(1.0, want.abs().max().item())


class _EagerGraph:
    """Stands in for a captured CUDA graph on CPU: replay() runs the captured step eagerly."""

    def __init__(self, runner, n: int, logits: torch.Tensor):
        self.runner, self.n, self.logits = runner, n, logits

    def replay(self):
        with torch.inference_mode():
            self.runner.step(self.runner.ids[:self.n], self.logits)


@pytest.mark.slow
def test_padded_and_chunked_replays_equal_exact_feeds():
    """Feeds shorter than a captured shape replay it padded, prompts replay the largest shape chunk
    by chunk; the real rows' logits, the length and the position match exact eager feeds."""
    from specgen.gpu.runner import _Graph

    model = _tiny("llama")
    replayed = runner(model, capacity=SMALL_CACHE, kernels=kernels(attention=True, rope=True))
    for n in (1, 5, 16):
        logits = torch.full((n, 96), float("-inf"), device=DEVICE)
        replayed.graphs[n] = _Graph(_EagerGraph(replayed, n, logits), logits, None)
    exact = runner(model, capacity=SMALL_CACHE, kernels=kernels(attention=True, rope=True))
    gen = torch.Generator().manual_seed(2)
    script = [20, 3, 1, -2, 5, 2, 18]  # 20: chunks of 16 + 4 (padded); 3, 2: padded into 5
    feeds = [torch.randint(0, 96, (abs(n),), generator=gen).tolist() for n in script]
    for each in (replayed, exact):
        each.reset()
    for n, ids in zip(script, feeds):
        if n < 0:
            for each in (replayed, exact):
                each.truncate(each.length + n)
            continue
        got, want = _feed(replayed, ids), _feed(exact, ids)
        assert got.shape == want.shape == (n, 96)
        assert (got - want).abs().max().item() < 1e-4
        assert replayed.length == exact.length and int(replayed.position) == int(exact.position) == exact.length
    assert replayed._shape_for(16 * 8 + 1) is None  # past MAX_CHUNKS chunks: eager


ROPE_CASES = [  # batch, heads, kv heads, tokens, head dim, capacity, position, window
    (1, 12, 4, 5, 64, 640, 300, 0),  # k = 4 verification, 10 splits
    (1, 4, 4, 1, 64, 64, 5, 0),  # 1-token step, one split
    (1, 8, 2, 5, 32, 512, 62, 0),  # the 5 new keys straddle two 64-key splits
    (1, 8, 2, 9, 64, 600, 250, 100),  # sliding window
    (2, 4, 2, 3, 16, 256, 100, 0),  # batch 2 with per-sequence cos/sin
]


def _rope_inputs(case, dtype, seed=0):
    batch, heads, kv_heads, tokens, dim, capacity, position, _ = case
    query, key, value, position_t = _inputs(case, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    # new keys/values as the projections make them: [B, q, KVH, D] transposed
    k_new = torch.randn(batch, tokens, kv_heads, dim, generator=gen).transpose(1, 2).to(dtype).to(DEVICE)
    v_new = torch.randn(batch, tokens, kv_heads, dim, generator=gen).transpose(1, 2).to(dtype).to(DEVICE)
    angles = (position + torch.arange(tokens))[:, None] * 10000.0 ** (-torch.arange(dim // 2) / (dim // 2))
    angles = torch.cat([angles, angles], dim=-1)[None].expand(batch, tokens, dim)
    angles = angles + 0.1 * torch.arange(batch)[:, None, None]  # a different embedding per sequence
    cos, sin = (f(angles).to(dtype).contiguous().to(DEVICE) for f in (torch.cos, torch.sin))
    return query, key, value, position_t, k_new, v_new, cos, sin


@pytest.mark.parametrize("case", ROPE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kernel_rotates_writes_the_cache_and_attends(case, dtype):
    """The kernel's rotary embedding and cache write against the reference: the cache after the
    call holds the rotated new keys and the new values at position + t (bit for bit in float32 up
    to the rotation's rounding), nothing else changes, and the output matches."""
    query, key, value, position, k_new, v_new, cos, sin = _rope_inputs(case, dtype)
    window, scale = case[-1], case[4] ** -0.5
    ref, ref_key, ref_value = rope_attention_reference(query, k_new, v_new, cos, sin, key, value,
                                                                 position, scale, window)
    out = decode_attention(query, key, value, position, scale, window, (k_new, v_new, cos, sin))
    assert torch.equal(value, ref_value)  # values are copied as they are
    step = 2e-6 if dtype == torch.float32 else 2.0 ** -7
    scale_of = ref_key.float().abs().amax().item()
    assert (key.float() - ref_key.float()).abs().max().item() <= step * max(1.0, scale_of)
    if dtype == torch.float32:
        assert (key - ref_key).abs().max().item() < 1e-5
    assert out.shape == ref.shape
    tol = 2e-5 if dtype == torch.float32 else 4 * 2.0 ** -7
    assert (out.float() - ref.float()).abs().max().item() < tol


def test_rope_kernel_equals_rotating_first():
    """Rotating inside the kernel equals rotating with the reference, writing the cache, then the
    plain kernel (float32)."""
    case = ROPE_CASES[2]
    query, key, value, position, k_new, v_new, cos, sin = _rope_inputs(case, torch.float32, seed=3)
    scale = case[4] ** -0.5
    fused_key, fused_value = key.clone(), value.clone()
    fused = decode_attention(query, fused_key, fused_value, position, scale, 0, (k_new, v_new, cos, sin))
    at = int(position) + torch.arange(case[3], device=DEVICE)
    key[:, :, at] = rotate_reference(k_new, cos, sin)
    value[:, :, at] = v_new
    plain = decode_attention(rotate_reference(query, cos, sin), key, value, position, scale)
    assert (fused_key - key).abs().max().item() < 1e-5 and torch.equal(fused_value, value)
    assert (fused - plain).abs().max().item() < 1e-5


# ---------------------------------------------------------------- token trees and batches
# core/step/rows.py's layout: per sequence a start, per row a tail of slots in path order. A tree
# node must get bitwise what a one-token chain step at its position gets over a cache holding its
# path in place, and a batch's row what its sequence alone gets.

TREE_CASES = [  # nodes, width, depth, start, capacity, window, softcap, rope
    (1, 1, 1, 5, 64, 0, 0.0, False),  # one node: a one-token step
    (6, 1, 6, 60, 128, 0, 0.0, True),  # a chain as a tree, across the split (and block) boundary at 64
    (4, 4, 1, 63, 128, 0, 0.0, False),  # siblings on both sides of nothing: all at position 63
    (12, 3, 4, 62, 192, 8, 0.0, True),  # a window over the prefix's end and the tail
    (32, 4, 6, 125, 192, 0, 1.0, False),  # 32 nodes, soft-capped, the tail crossing 128
    (9, 2, 5, 0, 64, 3, 1.0, True),  # no prefix: the tree is all a row sees
]


def _tree_inputs(case, dtype, seed=0, batch=1, heads=4, kv_heads=2, starts=None, dim=16):
    from rows_helpers import random_tree
    from specgen.core.step import rows as rowsets

    nodes, width, depth, start, capacity, window, softcap, rope = case
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor(random_tree(nodes, width, depth, seed))
    starts = starts or [start + 3 * b for b in range(batch)]
    batch = len(starts)
    rows = rowsets.tree(torch.zeros(batch, nodes, dtype=torch.long), parents, starts)
    query = torch.randn(batch, nodes, heads, dim, generator=gen).transpose(1, 2)
    key, value = (torch.randn(batch, kv_heads, capacity, dim, generator=gen) for _ in range(2))
    new = [torch.randn(batch, nodes, kv_heads, dim, generator=gen).transpose(1, 2) for _ in range(2)]
    angles = torch.randn(batch, nodes, dim, generator=gen)
    trig = [angles.cos(), angles.sin()]
    cast = lambda ts: [t.to(dtype).to(DEVICE) for t in ts]  # noqa: E731
    extra = tuple(cast(new + trig)) if rope else None
    return rows, *cast([query, key, value]), extra


def _paths(rows):
    return rows.start.to(DEVICE), rows.tail.to(DEVICE), rows.depth.to(DEVICE)


def _assert_tree_matches_reference(rows, query, key, value, extra, window, softcap):
    """float32: the kernel over a tree's rows against the reference's masked softmax (the mask is
    Rows.seen's), the cache after the call holding each node's rotated key at its slot."""
    start, tail, depth = _paths(rows)
    scale = query.shape[-1] ** -0.5
    if extra is None:
        ref = decode_attention_reference(query, key, value, start, scale, window, softcap, tail, depth)
    else:
        ref, ref_key, ref_value = rope_attention_reference(query, *extra, key, value, start, scale, window, softcap,
                                                           tail, depth)
    out = decode_attention(query, key, value, start, scale, window, extra, softcap, tail=tail, depth=depth)
    assert (out - ref).abs().max().item() < 2e-5
    if extra is not None:
        assert (key - ref_key).abs().max().item() < 1e-5 and torch.equal(value, ref_value)


def _assert_nodes_equal_one_token_steps(rows, query, key, value, extra, window, softcap):
    """Each node of each sequence: its output from the tree's call equals, bit for bit, a one-token
    chain step at its position over its sequence's cache holding its path in place (its ancestors'
    keys moved to the slots after the prefix), with the kernel's rotary and cache write when given."""
    from rows_helpers import path

    start, tail, depth = _paths(rows)
    scale = query.shape[-1] ** -0.5
    tree_key, tree_value = key.clone(), value.clone()
    together = decode_attention(query, tree_key, tree_value, start, scale, window, extra, softcap,
                                tail=tail, depth=depth)
    for b in range(rows.batch):
        parents = _parents(rows, b)
        s = int(rows.start[b])
        for node in range(rows.count):
            line = path(parents, node)
            alone_key, alone_value = tree_key[b:b + 1].clone(), tree_value[b:b + 1].clone()  # rotated keys
            for d, ancestor in enumerate(line[:-1]):
                alone_key[:, :, s + d] = tree_key[b:b + 1, :, s + ancestor]
                alone_value[:, :, s + d] = tree_value[b:b + 1, :, s + ancestor]
            at = torch.tensor(s + len(line) - 1, device=DEVICE)
            one = None if extra is None else tuple(x[b:b + 1, :, node:node + 1] if i < 2 else x[b:b + 1, node:node + 1]
                                                   for i, x in enumerate(extra))
            if one is None:  # the node's own key too: in place at its position
                alone_key[:, :, s + len(line) - 1] = tree_key[b:b + 1, :, s + node]
                alone_value[:, :, s + len(line) - 1] = tree_value[b:b + 1, :, s + node]
            alone = decode_attention(query[b:b + 1, :, node:node + 1], alone_key, alone_value, at, scale, window, one,
                                     softcap)
            assert torch.equal(alone[0, 0], together[b, node]), (b, node)


@pytest.mark.parametrize("case", TREE_CASES, ids=["one", "chain", "siblings", "window", "32-softcap", "no-prefix"])
def test_tree_kernel_matches_reference(case):
    """float32: the kernel over a tree's rows against the reference, the cache write included."""
    rows, query, key, value, extra = _tree_inputs(case, torch.float32)
    _assert_tree_matches_reference(rows, query, key, value, extra, case[5], case[6])


@pytest.mark.parametrize("case", TREE_CASES, ids=["one", "chain", "siblings", "window", "32-softcap", "no-prefix"])
def test_tree_nodes_equal_one_token_steps_on_their_paths(case):
    """bf16: each node's output equals, bit for bit, a one-token chain step at its position over a
    cache that holds its path in place, with the kernel's rotary and cache write when the case has them."""
    rows, query, key, value, extra = _tree_inputs(case, torch.bfloat16, seed=1)
    _assert_nodes_equal_one_token_steps(rows, query, key, value, extra, case[5], case[6])


def _parents(rows, b: int = 0) -> list[int]:
    """Sequence b's tree as a parent list from its tails: each node's next-to-last tail entry."""
    s = int(rows.start[b])
    return [int(rows.tail[b, i, int(rows.depth[b, i]) - 2]) - s if int(rows.depth[b, i]) > 1 else -1
            for i in range(rows.count)]


# Tree tiles that hold several tokens (16 rows: 16, 8, 5 or 4 tokens at groups 1, 2, 3, 4; a
# token's heads over two tiles at group 80): the splits before the start's are walked by shared
# programs of several such tiles, the splits from the start's on by each token's own programs.
SHARED_TILE_CASES = {  # name: (heads, kv heads, starts, (nodes, width, depth, _, capacity, window, softcap, rope))
    # group 1: 20 tokens over two tiles, the start just before the block and split boundary at 64,
    # a window of 3 whose first key is on either side of it
    "group1-two-tiles": (2, 2, [63], (20, 3, 5, 0, 128, 3, 0.0, True)),
    # group 2, no prefix: the tree is all a row sees; a window and soft-capping
    "group2-no-prefix": (4, 2, [0], (12, 2, 4, 0, 64, 3, 1.0, False)),
    # group 4, three tiles of 4 tokens; two sequences with their own starts; window, soft-capping, rotary
    "group4-batch": (8, 2, [62, 127], (9, 3, 4, 0, 192, 8, 1.0, True)),
    # group 3: tokens straddle tiles; three sequences, one of them tails across 128, one at start 64
    "group3-straddle": (6, 2, [125, 3, 64], (11, 2, 5, 0, 192, 0, 0.0, False)),
    # splits of 128 keys (4160 slots): tails across a block boundary inside a split (192) and across
    # a split boundary (256); a window reaching back over a block boundary; rotary
    "blocks-in-splits": (4, 1, [190, 254], (8, 2, 6, 0, 4160, 70, 0.0, True)),
    # group 2, 30 tokens: four shared tiles, rotary; the first sequence has two splits wholly before
    # its start (a shared program a tile over both), the second four (two programs a tile, of two
    # splits each: at least two runs from four splits on), the third ten (three programs a tile, over
    # three, three and four splits: attention.shared_runs)
    "group2-four-tiles": (4, 2, [130, 260, 650], (30, 3, 5, 0, 704, 0, 0.0, True)),
    # group 80 > 64 rows: a token's heads over two tiles (64 + 16 rows), one token a tile
    "group80": (80, 1, [62], (5, 2, 4, 0, 128, 0, 1.0, True)),
}


@pytest.mark.parametrize("name", sorted(SHARED_TILE_CASES))
def test_tree_tiles_of_several_tokens_keep_each_nodes_bits(name):
    """bf16: every node equals its one-token step on its path (torch.equal); float32: the kernel
    agrees with the reference."""
    heads, kv_heads, starts, case = SHARED_TILE_CASES[name]
    window, softcap = case[5], case[6]
    if name == "group2-four-tiles":  # the splits before each start: one run, two, three
        assert [attention.shared_runs(s // attention.SPLIT_KEYS) for s in starts] == [1, 2, 3]
    rows, query, key, value, extra = _tree_inputs(case, torch.bfloat16, seed=5, heads=heads, kv_heads=kv_heads,
                                                  starts=starts)
    _assert_nodes_equal_one_token_steps(rows, query, key, value, extra, window, softcap)
    rows, query, key, value, extra = _tree_inputs(case, torch.float32, seed=6, heads=heads, kv_heads=kv_heads,
                                                  starts=starts)
    _assert_tree_matches_reference(rows, query, key, value, extra, window, softcap)


@pytest.mark.cuda
@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", ["llama-3-8b", "llama-3-8b-rope", "gemma-2-9b"])
def test_tree_tiles_keep_each_nodes_bits_on_gpu(shape):
    """Tensor-core products at real widths, bf16: a 33-node tree verification (Llama-3-8B's
    attention: 32 heads, 8 KV heads, 4 tokens a tile; Gemma-2-9B's: head dim 256, key blocks of 32,
    a window and soft-capping), three sequences of their own starts over a 2048-slot cache (32 or 64
    splits; tails across a split and a block boundary; shared programs of one tile and of several), every node torch.equal to its one-token
    step on its path, and near the reference."""
    heads, kv_heads, dim, window, softcap, rope = {"llama-3-8b": (32, 8, 128, 0, 0.0, False),
                                                   "llama-3-8b-rope": (32, 8, 128, 0, 0.0, True),
                                                   "gemma-2-9b": (16, 8, 256, 300, 50.0, True)}[shape]
    case = (33, 4, 6, 0, 2048, window, softcap, rope)
    args = dict(heads=heads, kv_heads=kv_heads, starts=[1022, 381, 126], dim=dim)
    rows, query, key, value, extra = _tree_inputs(case, torch.bfloat16, seed=7, **args)
    _assert_nodes_equal_one_token_steps(rows, query, key, value, extra, window, softcap)
    start, tail, depth = _paths(rows)
    floats = [x.float() for x in (query, key, value)]
    if rope:
        ref, _, _ = rope_attention_reference(floats[0], *(x.float() for x in extra), *floats[1:], start, dim ** -0.5,
                                             window, softcap, tail, depth)
    else:
        ref = decode_attention_reference(*floats, start, dim ** -0.5, window, softcap, tail, depth)
    out = decode_attention(query, key, value, start, dim ** -0.5, window, extra, softcap, tail=tail, depth=depth)
    assert (out.float() - ref).abs().max().item() < 4 * 2.0 ** -7


@pytest.mark.parametrize("layout", ["chains", "trees"])
@pytest.mark.parametrize("batch", [1, 3])
def test_batch_rows_equal_each_sequence_alone(layout, batch):
    """B sequences, each its own start (3 apart, across the split at 64) and cache row, chains or
    trees, with the kernel's rotary and a window: every sequence's rows equal, bit for bit, its
    rows computed in a call of its own (bf16)."""
    from specgen.core.step import rows as rowsets

    case = (6, 2, 4, 58, 128, 6, 0.0, True)
    rows, query, key, value, extra = _tree_inputs(case, torch.bfloat16, seed=2, batch=batch)
    if layout == "chains":
        rows = rowsets.batch(rows.ids, rows.start)
    start = rows.start.to(DEVICE)
    tail, depth = (None, None) if rows.tail is None else (rows.tail.to(DEVICE), rows.depth.to(DEVICE))
    together_key, together_value = key.clone(), value.clone()
    together = decode_attention(query, together_key, together_value, start, 0.25, 6, extra, tail=tail, depth=depth)
    for b in range(batch):
        one = lambda x: x[b:b + 1]  # noqa: E731
        alone_key, alone_value = one(key).clone(), one(value).clone()
        alone = decode_attention(one(query), alone_key, alone_value, one(start), 0.25, 6, tuple(map(one, extra)),
                                 tail=None if tail is None else one(tail), depth=None if depth is None else one(depth))
        assert torch.equal(alone[0], together[b]) and torch.equal(alone_key[0], together_key[b]), b
    ref, _, _ = rope_attention_reference(query.float(), *(x.float() for x in extra), key.float(), value.float(), start,
                                         0.25, 6, 0.0, tail, depth)
    assert (together.float() - ref).abs().max().item() < 4 * 2.0 ** -7


# Empty splits: a split program whose split starts past every row of its tile's last key (and past
# the launch's new keys) writes nothing, and the merge reads each row's splits up to the one holding
# its last key only, loading the others as an empty split's (log-sum-exp -inf, output 0.0). So a
# row's output must not depend on how many splits follow its last one: with the split boundaries
# fixed (SPLIT_KEYS keys a split up to 64 x 64 slots), a row whose keys lie in the first one or two
# splits gets bitwise the same output from a 4096-slot cache (63 or 62 empty splits, merged) as from
# a 64-slot one (one split: the output written directly) or a 128-slot one (two splits, none empty).
# (A merge of one partial, or of two, in any order of adding the empty ones' zeros, is exact.)
BIG = 4096  # 64 splits of 64 keys: the most the merge reads
EMPTY_SPLITS = {  # name: (layout, heads, kv heads, starts, (nodes, width, depth, _, _, window, softcap, rope))
    # chains of several tokens, GQA (8 tokens x 2 heads a tile), the kernel's rotary
    "chain-gqa-rope": ("chain", 8, 2, [40], (9, 1, 9, 0, 0, 0, 0.0, True)),
    # group 3: tokens straddle tiles; a window and soft-capping; two sequences of their own starts
    "chain-window-softcap": ("chain", 6, 2, [50, 2], (12, 1, 12, 0, 0, 5, 1.0, True)),
    # no GQA, one token at the split's last key
    "one-token": ("chain", 4, 4, [63], (1, 1, 1, 0, 0, 0, 0.0, False)),
    # a tree, 4 tokens a tile (group 4), each tile's programs exit in the empty splits
    "tree": ("tree", 8, 2, [5], (12, 3, 4, 0, 0, 0, 1.0, True)),
    # trees of two sequences, a window, no rotary (the cache holds the keys)
    "tree-batch-window": ("tree", 4, 2, [3, 40], (9, 2, 5, 0, 0, 3, 0.0, False)),
}
TWO_SPLITS = {  # the same, every row's keys in the splits [0, 64) and [64, 128)
    "chain-gqa-rope": ("chain", 8, 2, [60, 100], (9, 1, 9, 0, 0, 0, 0.0, True)),
    "chain-window-softcap": ("chain", 6, 2, [58], (12, 1, 12, 0, 0, 70, 1.0, True)),
    "tree": ("tree", 8, 2, [61, 20], (12, 3, 4, 0, 0, 0, 0.0, True)),
}


def _split_inputs(spec, dtype, seed):
    """(rows, query, key, value, extra) over a BIG-slot cache; chains laid out as chains."""
    from specgen.core.step import rows as rowsets

    layout, heads, kv_heads, starts, case = spec
    case = (*case[:4], BIG, *case[5:])
    rows, query, key, value, extra = _tree_inputs(case, dtype, seed=seed, heads=heads, kv_heads=kv_heads,
                                                  starts=starts)
    if layout == "chain":
        rows = rowsets.batch(rows.ids, rows.start)
    return rows, query, key, value, extra


def _over(rows, query, key, value, extra, window, softcap, capacity):
    """(output, keys, values) of a call over copies of the cache's first `capacity` slots."""
    start = rows.start.to(DEVICE)
    tail, depth = (None, None) if rows.tail is None else (rows.tail.to(DEVICE), rows.depth.to(DEVICE))
    key, value = key[:, :, :capacity].clone(), value[:, :, :capacity].clone()
    out = decode_attention(query, key, value, start, query.shape[-1] ** -0.5, window, extra, softcap, tail=tail,
                           depth=depth)
    return out, key, value


def _assert_empty_splits_change_no_bit(spec, capacity, seed):
    """bf16 and float32: the BIG cache's call equals the `capacity`-slot one,
    output and cache writes, bit for bit; the slots past `capacity` are left as they were; float32
    near the reference (a merge that dropped a split with keys would be far from it)."""
    window, softcap = spec[4][5], spec[4][6]
    for dtype in (torch.bfloat16, torch.float32):
        rows, query, key, value, extra = _split_inputs(spec, dtype, seed)
        small = _over(rows, query, key, value, extra, window, softcap, capacity)
        big = _over(rows, query, key, value, extra, window, softcap, BIG)
        assert torch.equal(big[0], small[0]), dtype
        for got, want, before in zip(big[1:], small[1:], (key, value)):
            assert torch.equal(got[:, :, :capacity], want) and torch.equal(got[:, :, capacity:], before[:, :, capacity:])
    start, tail, depth = rows.start.to(DEVICE), rows.tail, rows.depth
    tail, depth = (None, None) if tail is None else (tail.to(DEVICE), depth.to(DEVICE))
    scale = query.shape[-1] ** -0.5
    if extra is None:
        ref, ref_key, ref_value = decode_attention_reference(query, key, value, start, scale, window, softcap, tail,
                                                             depth), key, value
    else:
        ref, ref_key, ref_value = rope_attention_reference(query, *extra, key, value, start, scale, window, softcap,
                                                           tail, depth)
    assert (big[0] - ref).abs().max().item() < 2e-5
    assert (big[1] - ref_key).abs().max().item() < 1e-5 and torch.equal(big[2], ref_value)


SLOW_SPLITS = {"tree", "tree-batch-window"}  # over 8 s interpreted


def _marked(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_SPLITS else n for n in sorted(names)]


@pytest.mark.parametrize("name", _marked(EMPTY_SPLITS))
def test_empty_splits_equal_a_one_split_cache(name):
    """Every row's keys in the first split: 63 empty splits merged = one split written directly."""
    _assert_empty_splits_change_no_bit(EMPTY_SPLITS[name], 64, seed=21)


@pytest.mark.parametrize("name", _marked(TWO_SPLITS))
def test_empty_splits_equal_a_two_split_cache(name):
    """Rows across the split boundary at 64: 62 empty splits merged = two splits merged."""
    _assert_empty_splits_change_no_bit(TWO_SPLITS[name], 128, seed=22)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["chain", "tree"])
def test_splits_of_a_long_and_a_short_sequence(layout):
    """A batch over BIG slots: one sequence near the cache's end (its rows' keys over all 64 splits,
    the last ones the step's own), one after 3 tokens (its rows in split 0, 63 empty splits), GQA,
    the kernel's rotary, soft-capping. float32: near the reference, cache writes included (a merge
    that dropped any split with keys would not be). bf16: each sequence's rows and cache writes
    equal, bit for bit, its call alone over the same cache, and the short one's its call over 64 slots."""
    spec = (layout, 4, 1, [BIG - 12, 3], (7, 2, 4, 0, 0, 0, 1.0, True))
    rows, query, key, value, extra = _split_inputs(spec, torch.float32, seed=23)
    start = rows.start.to(DEVICE)
    tail, depth = (None, None) if rows.tail is None else (rows.tail.to(DEVICE), rows.depth.to(DEVICE))
    ref, ref_key, ref_value = rope_attention_reference(query, *extra, key, value, start, 0.25, 0, 1.0, tail, depth)
    out, out_key, out_value = _over(rows, query, key, value, extra, 0, 1.0, BIG)
    assert (out - ref).abs().max().item() < 2e-5
    assert (out_key - ref_key).abs().max().item() < 1e-5 and torch.equal(out_value, ref_value)

    from specgen.core.step.rows import Rows

    rows, query, key, value, extra = _split_inputs(spec, torch.bfloat16, seed=24)
    together = _over(rows, query, key, value, extra, 0, 1.0, BIG)
    for b, capacities in ((0, [BIG]), (1, [BIG, 64])):
        one = lambda x: x[b:b + 1]  # noqa: E731
        alone_rows = Rows(*(one(x) for x in (rows.ids, rows.positions, rows.slots, rows.start)),
                          tail=None if rows.tail is None else one(rows.tail),
                          depth=None if rows.depth is None else one(rows.depth))
        for capacity in capacities:
            alone = _over(alone_rows, one(query), one(key), one(value), tuple(map(one, extra)), 0, 1.0, capacity)
            assert torch.equal(alone[0], one(together[0])), (b, capacity)
            for got, want in zip(alone[1:], together[1:]):
                assert torch.equal(got, one(want)[:, :, :capacity]), (b, capacity)
