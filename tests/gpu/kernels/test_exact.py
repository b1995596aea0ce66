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
    """Rows of a 20-row and a 5-row call (tensor-core tiles, or the register path's rows one after
    another) equal the same rows computed alone, for linear (with a bias, K not a multiple of
    BLOCK_K) and gate_up."""
    gen = torch.Generator().manual_seed(4)
    n, k = 24, 40
    x, w, u = (torch.randn(*shape, generator=gen).to(dtype).to(DEVICE) for shape in ((20, k), (n, k), (n, k)))
    b = torch.randn(n, generator=gen).to(dtype).to(DEVICE)
    config, counters = CONFIGS[name], L.split_k_counters(Workspace(DEVICE))
    calls = [lambda rows: L.linear(rows, w, b, config, counters=counters),
             lambda rows: L.gate_up(rows, w, u, "silu", config, counters=counters)]
    for call in calls:
        # rows in the second tensor-core tile and the third register-path group; a short call
        for rows, picks in ((x, (0, 4, 17)), (x[:5], (3, 4))):
            for i, together, alone in _rows(call, rows, picks):
                assert torch.equal(together, alone), (name, i)
    assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("gated", [False, True], ids=["linear", "gate_up"])
def test_matrix_vector_passes_give_every_row_its_bits(gated, dtype):
    """However many rows a matrix-vector pass computes together (1, 2, 4, 8: rows_together's
    choices), each row's output is bitwise the one-row call's: 13 rows are two groups, the second's
    last pass partly past M; K is three pieces, the last one partial; linear with a bias and a
    residual, gate_up with silu."""
    gen = torch.Generator().manual_seed(5)
    n, k, rows = 10, 300, 13
    config = (False, 2, 128, 4, 1)
    x, w, u, r = (torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)
                  for shape in ((rows, k), (n, k), (n, k), (rows, n)))
    b = torch.randn(n, generator=gen).to(dtype).to(DEVICE)

    def call(at, together=None):
        if gated:
            return L.run(x[at], w, u, None, L.ACTIVATIONS["silu"], config, None, None, False, together)
        return L.run(x[at], w, None, b, 0, config, None, r[at], False, together)

    alone = torch.cat([call(slice(i, i + 1)) for i in range(rows)])
    for together in (1, 2, 4, 8):
        assert torch.equal(call(slice(None), together), alone), together
    assert L.rows_together(config, rows, gated) > 1  # the rule shares loads here


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
@pytest.mark.parametrize("gated", [False, True], ids=["linear", "gate_up"])
def test_matrix_vector_rows_equal_single_rows_on_gpu(gated):
    """Compiled for the GPU, the register path gives each row of a call bitwise what a one-row call
    gives: the package's matrix-vector picks (draft picks of every real draft's shapes, and the
    plain picks of targets' shapes) at two rows (a draft round's first step), five (a
    verification), 13 and 32 (a batch's rows: passes of up to 8 rows sharing each weight load),
    and every rows-a-pass count at 13 rows."""
    table = T.packaged()
    shapes = [(shape, config) for shape, config in table.drafts if shape[2] == gated and not config[0]]
    shapes += [(shape, plain) for shape, plain, _ in table.entries if shape[2] == gated and not plain[0]]
    assert shapes, "the package's table has no matrix-vector picks"
    gen = torch.Generator(device="cuda").manual_seed(2)
    for (n, k, _), config in shapes:
        x = torch.randn(32, k, device="cuda", generator=gen).to(torch.bfloat16)
        w, u = (torch.randn(n, k, device="cuda", generator=gen).div_(k ** 0.5).to(torch.bfloat16) for _ in range(2))

        def call(rows, w=w, u=u, config=config, together=None):
            return L.run(rows, w, u if gated else None, None, L.ACTIVATIONS["silu"] if gated else 0, config, None,
                         None, False, together)
        alone = torch.cat([call(x[i:i + 1]) for i in range(32)])
        for count in (2, 5, 13, 32):
            assert torch.equal(call(x[:count]), alone[:count]), ((n, k, gated), config, count)
        for passes in (1, 2, 4, 8):
            assert torch.equal(call(x[:13], together=passes), alone[:13]), ((n, k, gated), config, passes)
