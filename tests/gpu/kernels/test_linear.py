"""gpu/kernels/linear.py: the weight-streaming linear kernel against F.linear, and inside specgen's own
model step (gpu/ops.py's table).

A matrix product is a floating-point reduction whose order differs between the kernel (fp32
accumulation over K tiles) and the reference, so they agree to a tolerance: float32 within 2e-5
relative to the output's scale; 16-bit outputs within two rounding steps of it. The fused gate/up
path keeps the unfused module's rounding steps, so it is held to the same bound as each projection
(plus one rounding step per step it chains). Inside a model, a runner with the kernel and one
without must give the same logits (float32, 1e-4 relative) and greedy tokens, and prefill (more than
MAX_ROWS rows) and calls from outside a runner must not take the kernel at all.
On CPU the kernel runs in the Triton interpreter (tests/triton_cpu.py).
"""

from __future__ import annotations

from dataclasses import replace

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels, resolved, runner
from specgen.gpu.kernels import linear as L
from specgen.gpu.tuning import linear_table as T
from specgen.gpu.kernels.reference import gate_up_reference
from specgen.gpu.workspace import Workspace

CASES = [  # rows, N, K, bias
    (1, 40, 96, False),
    (1, 96, 1024, True),  # K a multiple of every BLOCK_K: the unmasked loop
    (5, 33, 200, True),  # odd N, K not a multiple of BLOCK_K
    (9, 64, 512, False),
    (16, 17, 70, False),
]


def _data(rows, n, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    u = torch.randn(n, k, generator=gen) / k ** 0.5
    b = torch.randn(n, generator=gen)
    return [t.to(dtype).to(DEVICE) for t in (x, w, u, b)]


def _step(values: torch.Tensor, dtype) -> float:
    """One rounding step of `dtype` at the scale of the largest value."""
    bits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]
    return 2.0 ** (torch.floor(torch.log2(values.float().abs().max())).item() + 1 - bits)


PATHS = {"dot": (True, 16, 64, 4, 2), "gemv": (False, 4, 128, 4, 1)}  # forced configurations


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("path", [None, "dot", "gemv"])
def test_linear_matches_reference_float32(case, path):
    rows, n, k, bias = case
    x, w, _, b = _data(rows, n, k, torch.float32)
    out = L.linear(x, w, b if bias else None, PATHS.get(path))
    ref = torch.nn.functional.linear(x.double(), w.double(), b.double() if bias else None)
    assert out.shape == (rows, n) and out.dtype == torch.float32
    assert (out - ref).abs().max().item() <= 2e-5 * ref.abs().max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES[1:3])
def test_linear_matches_reference_16_bit(case, dtype):
    rows, n, k, bias = case
    x, w, _, b = _data(rows, n, k, dtype, seed=1)
    out = L.linear(x, w, b if bias else None)
    exact = torch.nn.functional.linear(x.double(), w.double(), b.double() if bias else None)
    assert out.dtype == dtype
    assert (out.double() - exact).abs().max().item() <= 2 * _step(exact, dtype)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["dot", "gemv"])
def test_gate_up_matches_reference(activation, dtype, path):
    for rows, n, k, _ in CASES[:4]:
        x, w, u, _ = _data(rows, n, k, dtype, seed=2)
        out = L.gate_up(x, w, u, activation, PATHS[path] if path == "dot" or rows == 1 else None)
        ref = gate_up_reference(x.double(), w.double(), u.double(), activation)
        assert out.shape == (rows, n) and out.dtype == dtype
        bound = 2e-5 * ref.abs().max().item() if dtype == torch.float32 else 4 * _step(ref, dtype)
        assert (out.double() - ref).abs().max().item() <= bound, (rows, n, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("config", [None, PATHS["gemv"], (True, 32, 64, 4, 2, 3)])
def test_residual_epilogue_is_the_add_after_the_projection(config, dtype):
    """linear(..., residual=r) is r + linear(...) bit for bit: the projection rounded to the
    model's dtype as the plain call stores it, then one rounded add (a decoder layer's), in every
    path: one program per block, matrix-vector tiles, split-K's last program."""
    counters = L.split_k_counters(Workspace(DEVICE))
    for rows, n, k, bias in CASES[:4]:
        x, w, _, b = _data(rows, n, k, dtype, seed=7)
        residual = torch.randn(rows, n, generator=torch.Generator().manual_seed(rows)).to(dtype).to(DEVICE) * 4
        plain = L.linear(x, w, b if bias else None, config, counters=counters)
        fused = L.linear(x, w, b if bias else None, config, counters=counters, residual=residual)
        assert fused.dtype == dtype and torch.equal(fused, residual + plain), (rows, n, k)
    with pytest.raises(AssertionError, match="residual"):
        L.linear(x, w, residual=residual[:, :-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [(1, 96, 512, True), (5, 70, 300, False)])
def test_split_k_sums_the_chunks_as_one_program_does(case, dtype):
    """K in 2 or 3 chunks (the last one short when K is not a multiple of the tile): the last
    program of each column block sums the partials in chunk order. Same bound as one program per
    block against the reference, bitwise the same on a repeat (whichever program arrives last),
    and the arrival counters are back at zero for the next call (a graph replays the same buffer)."""
    rows, n, k, bias = case
    x, w, u, b = _data(rows, n, k, dtype, seed=5)
    exact = torch.nn.functional.linear(x.double(), w.double(), b.double() if bias else None)
    gated = gate_up_reference(x.double(), w.double(), u.double(), "silu")
    bound = 2e-5 * exact.abs().max().item() if dtype == torch.float32 else 2 * _step(exact, dtype)
    gated_bound = 2e-5 * gated.abs().max().item() if dtype == torch.float32 else 4 * _step(gated, dtype)
    counters = L.split_k_counters(Workspace(DEVICE))
    for split in (2, 3):
        config = (True, 32, 64, 4, 2, split)
        outs = [L.linear(x, w, b if bias else None, config, counters=counters) for _ in range(2)]
        gates = [L.gate_up(x, w, u, "silu", config, counters=counters) for _ in range(2)]
        assert int(counters.abs().sum()) == 0
        assert torch.equal(outs[0], outs[1]) and torch.equal(gates[0], gates[1])
        assert (outs[0].double() - exact).abs().max().item() <= bound
        assert (gates[0].double() - gated).abs().max().item() <= gated_bound


def test_package_table_lists_every_real_pairs_projections():
    """The package's table holds a configuration pair for each projection of the real pairs that
    benchmarks/family_pairs.py builds (targets, drafts, the EAGLE-3 heads of Llama 3.1, Qwen2.5
    and Qwen3 that its --head builds) and of the bench pair; its plain
    configurations never split K, so a device where split-K does not pay runs none."""
    from transformers import AutoConfig

    from specgen.gpu.tuning import tune
    from tiny_models import family_pairs

    table = T.packaged()
    listed = {shape: (plain, split) for shape, plain, split in table.entries}
    configs = [dict(model.config) for family in family_pairs().FAMILIES.values() for model in (family.target, family.draft)]
    for values in configs:
        config = AutoConfig.for_model(values.pop("model_type"), **values)
        assert set(T.model_shapes(config)) <= set(listed), config.model_type
    for name in ("llama-3.1", "qwen2.5", "qwen3"):
        assert set(T.head_shapes(family_pairs().head_config(family_pairs().FAMILIES[name]))) <= set(listed), name
    for (n, k, gated), (plain, split) in listed.items():
        assert len(plain) == 5 and len(split) in (5, 6)
        assert table.pick(n, k, gated, split_k=False) == plain and table.pick(n, k, gated, split_k=True) == split


def test_rules_choose_by_shape_for_unlisted_shapes():
    """Shapes no table lists: long-K, gated and few-column projections split K where split-K is on;
    narrow outputs over a long K split it in more chunks; nothing splits with split-K off."""
    shapes = {(4096, 14336, False): T.SPLIT_LONG_K, (14336, 4096, True): T.SPLIT_GATED,
              (4096, 4096, False): T.SPLIT_FEW_COLUMNS, (6144, 4096, False): T.WIDE,
              (128256, 4096, False): T.WIDE, (1024, 4096, False): T.SPLIT_NARROW, (1024, 1024, False): T.NARROW,
              (100, 60, False): T.NARROW}
    for (n, k, gated), expected in shapes.items():
        assert T.rule(n, k, gated, True) == expected, (n, k, gated)
        assert T.rule(n, k, gated, False) == (T.NARROW if n <= 2048 else T.WIDE)


def test_split_k_without_counters_is_refused():
    x, w, _, _ = _data(1, 96, 512, torch.float32)
    with pytest.raises(AssertionError):
        L.linear(x, w, None, (True, 32, 64, 4, 2, 2))


def test_leading_dims_and_strided_rows():
    """[batch, tokens, K] inputs as the model passes them, and rows that are a strided view."""
    x, w, _, b = _data(6, 24, 80, torch.float32, seed=3)
    wide = torch.zeros(6, 160, device=DEVICE)
    wide[:, :80] = x
    view = wide[:, :80]  # row stride 160
    assert not view.is_contiguous()
    ref = torch.nn.functional.linear(x, w, b)
    assert torch.allclose(L.linear(view, w, b), ref, atol=1e-5, rtol=0)
    out = L.linear(x.view(2, 3, 80), w, b)
    assert out.shape == (2, 3, 24)
    assert torch.allclose(out.view(6, 24), ref, atol=1e-5, rtol=0)


def test_too_many_rows_is_refused():
    """More than a batch's verification (BATCH_ROWS) is the reference's: the kernel refuses it."""
    x, w, _, _ = _data(L.BATCH_ROWS + 1, 8, 16, torch.float32)
    with pytest.raises(AssertionError):
        L.linear(x, w)


def test_float32_tiles_take_fewer_stages_where_16_bit_ones_fit():
    """The table's picks are tuned for 16-bit weights: Llama 3.1 8B's q+k+v pick (64 columns, 256
    of K, 4 stages) keeps 3 x 40 KiB of tiles in bf16, but 3 x 80 KiB = 240 KiB in float32, past
    an sm_90's 227 KiB; it runs on 3 stages instead, and a gate_up pair of tiles on fewer still."""
    assert L.fitting_stages(4, 64, 256, False, 2) == 4
    assert L.fitting_stages(4, 64, 256, False, 4) == 3
    assert L.fitting_stages(4, 64, 256, True, 4) == 2
    for stages in (2, 3, 4, 5):
        kept = L.fitting_stages(stages, 64, 128, True, 4)
        assert 2 <= kept <= stages and ((kept - 1) * (16 + 128) * 128 * 4 <= L.SHARED_BYTES or kept == 2)


def test_tall_tiles_take_fewer_stages_where_16_row_ones_fit():
    """Every bf16 pick of the package keeps its stages in 16-row tiles; a 64-row gate_up tile of the
    8B's (64, 128) pick, which asked for 262,144 bytes at 4 stages on an H200, takes 3."""
    for (_, _, gated), plain, split in L.packaged().entries:
        for dot, block_n, block_k, _, stages, *_ in (plain, split):
            assert not dot or L.fitting_stages(stages, block_n, block_k, gated, 2) == stages
    assert L.fitting_stages(4, 64, 128, True, 2, block_m=64) == 3


def test_tiles_grow_with_the_rows_up_to_64():
    assert [L.tile_rows(rows) for rows in (1, 5, 16, 17, 32, 33, 40, 64, 65, 512)] == [16, 16, 16, 32, 32, 64, 64,
                                                                                       64, 64, 64]


@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a CUDA GPU (shared memory is the GPU's)")
def test_float32_runs_the_8b_projection_picks():
    """Each Llama 3.1 8B projection's table pick launches in float32 (the bench's float32 check)."""
    for n, k, gated in ((6144, 4096, False), (14336, 4096, True), (4096, 14336, False)):
        x, w, _, _ = _data(5, n, k, torch.float32)
        config = L.packaged().pick(n, k, gated, False, 5)
        out = L.gate_up(x, w, w, "silu", config) if gated else L.linear(x, w, config=config)
        assert out.shape == (5, n) and bool(torch.isfinite(out).all())


def _tiny(family: str):
    from transformers import (Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    classes = {"llama": (LlamaConfig, LlamaForCausalLM, {}),
               "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),  # q/k/v biases
               "gemma2": (Gemma2Config, Gemma2ForCausalLM, {"hidden_activation": "gelu_pytorch_tanh", "head_dim": 16})}
    config_cls, model_cls, extra = classes[family]
    config = config_cls(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                        initializer_range=0.5, bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(3)
    return model_cls(config).to(DEVICE).eval()


def _count_launches(monkeypatch) -> list:
    calls = []
    real = L._launch
    monkeypatch.setattr(L, "_launch", lambda x, *a: calls.append(x.numel() // x.shape[-1]) or real(x, *a))
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("family,act", [("llama", "silu"), ("qwen2", "silu"), ("gemma2", "gelu_pytorch_tanh")])
def test_runner_with_kernel_equals_torch(family, act, monkeypatch):
    """A 30-token prefill, then 1- and 5-token steps with rollbacks in between: same logits."""
    model = _tiny(family)
    calls = _count_launches(monkeypatch)
    fast = runner(model, kernels=kernels(linear=True))
    plain = runner(model, kernels=kernels())
    assert {layer.mlp.activation for layer in fast.model.model.layers} == {act}
    calls.clear()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 96, (30,), generator=gen)
    script = [5, 1, -3, 5, 1, -2, 5]  # feed n tokens, or roll back n
    feeds = [torch.randint(0, 96, (abs(n),), generator=gen) for n in script]
    outputs = []
    for each in (fast, plain):
        each.reset()
        logits = [each.forward(prompt.to(DEVICE)).clone()]
        for n, ids in zip(script, feeds):
            if n < 0:
                each.truncate(each.length + n)
            else:
                logits.append(each.forward(ids.to(DEVICE)).clone())
        outputs.append(logits)
    # per layer: q+k+v, o, gate+up, down; then lm_head; only the fast runner's forwards (its prefill
    # too: at most MAX_ROWS rows)
    feeds = [30] + [n for n in script if n > 0]
    assert calls == [n for n in feeds for _ in range(2 * 4 + 1)]
    for got, want in zip(*outputs):
        assert (got - want).abs().max().item() < 1e-4 * max(1.0, want.abs().max().item())
        assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("split_k", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_captured_graphs_with_kernel_match_eager(dtype, split_k, monkeypatch):
    """Captured 1- and 5-token steps through the kernel against eager cuBLAS steps; with split_k,
    every projection in two K chunks (the tiny model's shapes never pick it): graph replays reuse
    the arrival counters, which each call must leave at zero."""
    model = _tiny("llama").to(dtype)
    policy = replace(resolved(model, linear="kernel"), split_k=split_k)  # on whatever this GPU's bandwidth says
    if split_k:  # the tiny model's shapes (q+k+v, o, gate+up, down, lm_head) in a table
        shapes = [(128, 64, False), (64, 64, False), (128, 64, True), (64, 128, False), (96, 64, False)]
        split = (True, 32, 16, 4, 2, 2)
        policy = replace(policy, linear_table=T.LinearTable(tuple((shape, T.NARROW, split) for shape in shapes)))
    fast = runner(model, kernels=policy, shapes=(1, 5), use_graphs=True)
    assert fast.graphs and fast.kernels.linear and fast.kernels.attention
    plain = runner(model, kernels=kernels())
    gen = torch.Generator().manual_seed(5)
    feeds = [torch.randint(0, 96, (n,), generator=gen).cuda() for n in (20, 1, 5, 5, 1, 3)]
    tol = 1e-4 if dtype == torch.float32 else 0.1
    agree = []
    for each in (fast, plain):
        each.reset()
        agree.append([each.forward(ids).clone() for ids in feeds])
    for got, want in zip(*agree):
        assert (got - want).abs().max().item() < tol * max(1.0, want.abs().max().item())
        if dtype == torch.float32:
            assert torch.equal(got.argmax(-1), want.argmax(-1))
    if split_k:
        counters = fast.ops.counters  # split-K's arrival counters by device
        assert counters and all(int(c.abs().sum()) == 0 for c in counters.values())
