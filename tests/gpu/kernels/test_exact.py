"""Row invariance: each row of a step is computed bitwise the same whatever the number of rows.

What bit-exact greedy decoding rests on: the (k+1)-token verification step must give every position
the logits of the one-token step at that position (torch.equal), so greedy speculative output is
greedy target-only output in bf16 too. Checked here kernel by kernel (gpu/kernels/linear.py in every kind of
configuration a table can hold, gpu/kernels/attention.py with and without rotary, window and soft-capping) and through a
runner (a (k+1)-token step against k+1 one-token steps), on the CPU in the Triton interpreter. The
interpreter cannot show what tensor cores do (its products are numpy's, summed per row: see
gpu/kernels/linear.py); the cuda tests check the same on a GPU at real widths.
"""

from __future__ import annotations

from triton_cpu import DEVICE, INTERPRETED  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels, runner
from specgen.gpu.kernels import linear as L
from specgen.gpu.tuning import linear_table as T
from specgen.gpu.kernels.attention import decode_attention
from specgen.gpu.workspace import Workspace

# every kind of configuration: tensor-core tiles (narrow and wide), the register path, split-K
CONFIGS = {"dot": (True, 16, 32, 4, 2), "wide": (True, 32, 64, 4, 1), "gemv": (False, 4, 64, 4, 1),
           "split": (True, 16, 32, 4, 2, 2)}


def _rows(call, x: torch.Tensor, picks) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(row, that row of a call on all of x, the same row computed in a call of its own)."""
    full = call(x)
    return [(i, full[i], call(x[i:i + 1])[0]) for i in picks]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_linear_rows_do_not_depend_on_the_row_count(name, dtype):
    """Rows of a 70-row, a 20-row and a 5-row call (tensor-core tiles of 64, 32 and 16 rows, or the
    register path's rows one after another) equal the same rows computed alone, for linear (with a
    bias, K not a multiple of BLOCK_K) and gate_up."""
    gen = torch.Generator().manual_seed(4)
    n, k = 24, 40
    x, w, u = (torch.randn(*shape, generator=gen).to(dtype).to(DEVICE) for shape in ((70, k), (n, k), (n, k)))
    b = torch.randn(n, generator=gen).to(dtype).to(DEVICE)
    config, counters = CONFIGS[name], L.split_k_counters(Workspace(DEVICE))
    calls = [lambda rows: L.linear(rows, w, b, config, counters=counters),
             lambda rows: L.gate_up(rows, w, u, "silu", config, counters=counters)]
    for call in calls:
        # the second 64-row tile; a 32-row tile and the third register-path group; a short call
        for rows, picks in ((x, (0, 66, 69)), (x[:20], (0, 4, 17)), (x[:5], (3, 4))):
            for i, together, alone in _rows(call, rows, picks):
                assert torch.equal(together, alone), (name, i)
    assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("name", ["dot", "split"])
def test_a_launch_keeps_each_rows_bits(name, monkeypatch):
    """A tall call in a table's launch (other tile rows, BLOCK_N, warps and stages: linear_table.py)
    gives each row what the row's one-row call gives, 128-row tiles included, with and without split-K."""
    gen = torch.Generator().manual_seed(6)
    n, k = 24, 64
    x, w, u = (torch.randn(*shape, generator=gen).to(torch.bfloat16).to(DEVICE) for shape in ((150, k), (n, k), (n, k)))
    config, counters = CONFIGS[name], L.split_k_counters(Workspace(DEVICE))
    launches = tuple(((n, k, gated), config, row_class, launch) for gated in (False, True)
                     for row_class, launch in ((64, (64, 32, 16, 4, 3)), (128, (128, 16, 32, 8, 2)),
                                               (512, (64, 64, 16, 4, 2))))
    table = T.LinearTable(launches=launches)
    taken = []
    run = L.run
    monkeypatch.setattr(L, "run", lambda *args, **kwargs: taken.append(kwargs.get("launch")) or run(*args, **kwargs))
    calls = [lambda rows: L.linear(rows, w, None, config, counters=counters, table=table),
             lambda rows: L.gate_up(rows, w, u, "silu", config, counters=counters, table=table)]
    for call in calls:
        for rows, picks in ((x[:40], (0, 39)), (x[:70], (0, 66, 69)), (x, (1, 130, 149))):
            for i, together, alone in _rows(call, rows, picks):
                assert torch.equal(together, alone), (name, rows.shape[0], i)
    assert {launch for launch in taken if launch} == {launch for *_, launch in launches}
    assert int(counters.abs().sum()) == 0


ATTENTION = [  # heads, kv heads, dim, capacity, position, window, rope, softcap
    (4, 2, 16, 128, 60, 0, False, 0.0),  # tokens across the split boundary at 64
    (6, 2, 16, 128, 70, 0, True, 0.0),  # group 3 (padded tile), the kernel's rotary and cache write
    (4, 1, 16, 64, 20, 8, False, 0.0),  # sliding window
    (4, 2, 16, 128, 60, 0, False, 1.0),  # soft-capping (Gemma 2's global layers), across a split
    (4, 1, 16, 64, 20, 8, False, 1.0),  # soft-capping with a window (its sliding layers)
]


@pytest.mark.parametrize("case", ATTENTION, ids=["split", "rope", "window", "softcap", "softcap-window"])
def test_attention_tokens_do_not_depend_on_the_step_length(case):
    """A 5-token step's output for each token equals a 1-token step at that token's position (the
    cache written by the kernel, with rope, the same either way), soft-capped or not."""
    heads, kv_heads, dim, capacity, position, window, rope, softcap = case
    gen = torch.Generator().manual_seed(1)
    dtype = torch.bfloat16
    query = torch.randn(1, 5, heads, dim, generator=gen).to(dtype).transpose(1, 2).to(DEVICE)  # [B, H, 5, D]
    key = torch.randn(1, kv_heads, capacity, dim, generator=gen).to(dtype).to(DEVICE)
    value = torch.randn(1, kv_heads, capacity, dim, generator=gen).to(dtype).to(DEVICE)
    new = [torch.randn(1, kv_heads, 5, dim, generator=gen).to(dtype).to(DEVICE) for _ in range(2)]
    angles = torch.randn(1, 5, dim, generator=gen)
    trig = [angles.cos().to(dtype).to(DEVICE), angles.sin().to(dtype).to(DEVICE)]
    scale = dim ** -0.5

    def step(first: int, count: int, cache):
        rows = slice(first, first + count)
        extra = (new[0][:, :, rows], new[1][:, :, rows], trig[0][:, rows], trig[1][:, rows]) if rope else None
        at = torch.tensor(position + first, device=DEVICE)
        return decode_attention(query[:, :, rows], *cache, at, scale, window, extra, softcap=softcap)

    together_cache = (key.clone(), value.clone())
    together = step(0, 5, together_cache)
    alone_cache = (key.clone(), value.clone())
    for t in range(5):
        assert torch.equal(step(t, 1, alone_cache)[:, 0], together[:, t]), t
    assert all(torch.equal(a, b) for a, b in zip(together_cache, alone_cache))


def _tiny_llama(dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(5)
    return LlamaForCausalLM(config).to(dtype).to(DEVICE).eval()


@pytest.mark.slow
@pytest.mark.parametrize("rope", [False, True], ids=["model-rotary", "kernel-rotary"])
def test_runner_step_equals_one_token_steps(rope):
    """A runner with the kernels: the logits of a 5-token step equal, bit for bit, those of 5 one-token
    steps over the same ids, after the same prefill; and a prefill computes the cache the same way
    in one call as in two (it replays whichever captured shape fits, on a GPU)."""
    model = _tiny_llama(torch.bfloat16)
    each = runner(model, kernels=kernels(attention=True, linear=True, rope=rope))
    gen = torch.Generator().manual_seed(2)
    prompt, ids = torch.randint(0, 96, (12,), generator=gen), torch.randint(0, 96, (5,), generator=gen)
    each.reset()
    each.forward(prompt, want_logits=False)
    together = each.forward(ids).clone()
    each.reset()
    each.forward(prompt[:7], want_logits=False)
    each.forward(prompt[7:], want_logits=False)
    alone = torch.cat([each.forward(ids[i:i + 1]).clone() for i in range(5)])
    assert torch.equal(together, alone)


@pytest.mark.slow
def test_gemma2_runner_step_equals_one_token_steps():
    """Gemma 2 (soft-capped attention in the kernel, a window shorter than the sequence on its first
    layer, its own rotary and norms): a 5-token step's bf16 logits equal 5 one-token steps'."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=32,
                          sliding_window=16, max_position_embeddings=1024, initializer_range=0.5,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(5)
    model = Gemma2ForCausalLM(config).to(torch.bfloat16).to(DEVICE).eval()
    each = runner(model, kernels=kernels(attention=True, linear=True), capacity=192)
    gen = torch.Generator().manual_seed(2)
    prompt, ids = torch.randint(0, 96, (20,), generator=gen).to(DEVICE), torch.randint(0, 96, (5,), generator=gen).to(DEVICE)
    each.reset()
    each.forward(prompt, want_logits=False)
    together = each.forward(ids).clone()
    each.truncate(20)
    alone = torch.cat([each.forward(ids[i:i + 1]).clone() for i in range(5)])
    assert torch.equal(together, alone)


def _real_width_config(shape: str):
    """Two layers of a real model's widths: Llama-3-8B, Llama-3.2-1B, Gemma-2-9B (soft-capped
    attention, a sliding window on its first layer, shorter than the tests' 300-token prompt where
    the real one has 4096 keys; (1 + w) norms and rotary in PyTorch)."""
    from transformers import Gemma2Config, LlamaConfig

    if shape == "gemma2-9b":
        return Gemma2Config(vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=2,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
                            sliding_window=256)
    widths = {"8b": (4096, 14336, False), "1b": (2048, 8192, True)}[shape]
    return LlamaConfig(vocab_size=128256, hidden_size=widths[0], intermediate_size=widths[1], num_hidden_layers=2,
                       num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=widths[2])


@pytest.mark.cuda
@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", ["8b", "1b", "gemma2-9b"])
def test_step_rows_equal_one_token_steps_on_gpu(shape):
    """Real widths, bf16, captured graphs with the kernels `auto` resolves: a 5-token step's logits
    equal 5 one-token steps' (2 layers of the Llama-3-8B, Llama-3.2-1B and Gemma-2-9B shapes)."""
    from transformers import AutoModelForCausalLM

    from gpu_helpers import owned, resolved

    config = _real_width_config(shape)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = owned(AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval())
    from specgen.gpu.runner import GraphRunner

    vocab = config.vocab_size
    graphs = GraphRunner(model, vocab, 1024, kernels=resolved(model), workspace=Workspace("cuda"), shapes=(1, 5))
    assert graphs.kernels.attention
    gen = torch.Generator().manual_seed(1)
    prompt, ids = torch.randint(0, vocab, (300,), generator=gen).cuda(), torch.randint(0, vocab, (5,), generator=gen).cuda()
    graphs.forward(prompt, want_logits=False)
    together = graphs.forward(ids).clone()
    graphs.truncate(300)
    alone = torch.cat([graphs.forward(ids[i:i + 1]).clone() for i in range(5)])
    assert torch.equal(together, alone)


@pytest.mark.cuda
@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")
@pytest.mark.parametrize("split_k", [False, True], ids=["plain", "split"])
def test_tall_tensor_core_tiles_keep_each_rows_bits_on_gpu(split_k):
    """Tiles of 32 and 64 rows (a tree's or a batch's rows: tile_rows) give each row bitwise what
    the 16-row tile of a one-row call gives, in the package's tensor-core picks of Llama-3-8B's
    projections and Llama-3.2-1B's, split-K off and on, at 17, 33 and 70 rows (two 64-row tiles)."""
    table = T.packaged()
    counters = L.split_k_counters(Workspace("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(3)
    shapes = [(4096, 4096, False), (6144, 4096, False), (14336, 4096, True), (4096, 14336, False),
              (3072, 2048, False), (8192, 2048, True)]
    for n, k, gated in shapes:
        config = table.pick(n, k, gated, split_k, 70)
        assert config[0], (n, k, config)
        x = torch.randn(70, k, device="cuda", generator=gen).to(torch.bfloat16)
        w, u = (torch.randn(n, k, device="cuda", generator=gen).div_(k ** 0.5).to(torch.bfloat16) for _ in range(2))

        def call(rows, w=w, u=u, config=config):
            if gated:
                return L.gate_up(rows, w, u, "silu", config, counters=counters)
            return L.linear(rows, w, None, config, counters=counters)
        alone = torch.cat([call(x[i:i + 1]) for i in range(70)])
        for count in (17, 33, 70):
            assert torch.equal(call(x[:count]), alone[:count]), ((n, k, gated), config, count)
    assert int(counters.abs().sum()) == 0


@pytest.mark.cuda
@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")
def test_package_launches_keep_each_rows_bits_on_gpu():
    """Every launch the package's table lists (linear_table.py: tall calls in other tiles, the same
    sums) gives each row of a call at both ends of its row class bitwise the one-row call's."""
    launches = T.packaged().launches
    if not launches:
        pytest.skip("the package's table lists no launches")
    counters = L.split_k_counters(Workspace("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(5)
    lower = dict(zip(T.ROW_CLASSES, (T.TALL_FROM, *T.ROW_CLASSES[:-1])))
    for (n, k, gated), config, row_class, launch in launches:
        counts = (lower[row_class] + 1, row_class)
        x = torch.randn(row_class, k, device="cuda", generator=gen).to(torch.bfloat16)
        w, u = (torch.randn(n, k, device="cuda", generator=gen).div_(k ** 0.5).to(torch.bfloat16) for _ in range(2))
        assert T.packaged().launch(n, k, gated, config, row_class) == launch

        def call(rows, w=w, u=u, config=config):
            if gated:
                return L.gate_up(rows, w, u, "silu", config, counters=counters)
            return L.linear(rows, w, None, config, counters=counters)
        alone = torch.cat([call(x[i:i + 1]) for i in range(row_class)])
        for count in counts:
            assert torch.equal(call(x[:count]), alone[:count]), ((n, k, gated), config, launch, count)
        del x, w, u, alone
    assert int(counters.abs().sum()) == 0


@pytest.mark.cuda
@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU")
@pytest.mark.parametrize("gated", [False, True], ids=["linear", "gate_up"])
def test_matrix_vector_rows_equal_single_rows_on_gpu(gated):
    """Compiled for the GPU, the register path gives each row of a call bitwise what a one-row call
    gives: the package's draft picks of every real draft's shapes, at two rows (a draft round's
    first step) and five (a verification, where such a configuration is a target's pick)."""
    shapes = [(shape, config) for shape, config in T.packaged().drafts if shape[2] == gated and not config[0]]
    assert shapes, "the package's table has no matrix-vector draft picks"
    gen = torch.Generator(device="cuda").manual_seed(2)
    for (n, k, _), config in shapes:
        x = torch.randn(5, k, device="cuda", generator=gen).to(torch.bfloat16)
        w, u = (torch.randn(n, k, device="cuda", generator=gen).div_(k ** 0.5).to(torch.bfloat16) for _ in range(2))
        if gated:
            def call(rows, w=w, u=u, config=config):
                return L.gate_up(rows, w, u, "silu", config)
        else:
            def call(rows, w=w, config=config):
                return L.linear(rows, w, None, config)
        for rows in (x[:2], x):
            for i, together, alone in _rows(call, rows, range(rows.shape[0])):
                assert torch.equal(together, alone), ((n, k, gated), config, rows.shape[0], i)
