"""gpu/kernels/step_io.py: a step's inputs (positions, embedding rows, rotary rows) and outputs (the logits
in float32, the position's advance) in one kernel each, against their torch references and
against a runner's steps without them, bit for bit. On CPU in the Triton interpreter."""

from __future__ import annotations

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels, runner
from specgen.gpu.kernels import step_io
from specgen.gpu.kernels.reference import step_finish_reference, step_inputs_reference
from specgen.gpu.runner import MAX_GRAPH_TOKENS

STEP_KERNELS = dict(attention=True, linear=True, rope=True, norm=True)


@pytest.mark.parametrize("n", [1, 5, MAX_GRAPH_TOKENS])
@pytest.mark.parametrize("parts", ["all", "embedding", "scaled", "rows", "positions"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_inputs_equal_the_reference(n, parts, dtype):
    gen = torch.Generator().manual_seed(n)
    weight = torch.randn(300, 1100, generator=gen).to(dtype).to(DEVICE)  # more columns than one block
    table = torch.randn(200, 2 * 48, generator=gen).to(dtype).to(DEVICE)
    ids = torch.randint(0, 300, (n,), generator=gen).to(DEVICE)
    position = torch.tensor(200 - MAX_GRAPH_TOKENS - 3, device=DEVICE)
    weight = weight if parts in ("all", "embedding", "scaled") else None
    table = table if parts in ("all", "rows") else None
    # Gemma-2-2B's sqrt(2304) = 48 is exact; sqrt(3584) is not, so products round (ties included)
    scale = float(torch.tensor(3584**0.5).to(dtype)) if parts == "scaled" else None
    positions = torch.full((MAX_GRAPH_TOKENS,), -1, dtype=torch.long, device=DEVICE)
    embeds = torch.zeros(MAX_GRAPH_TOKENS, 1100, dtype=dtype, device=DEVICE)
    rows = torch.zeros(MAX_GRAPH_TOKENS, 96, dtype=dtype, device=DEVICE)
    step_io.inputs(ids, position, positions, weight, embeds if weight is not None else None, table,
                   rows if table is not None else None, scale=scale)
    want_positions, want_embeds, want_rows = step_inputs_reference(ids, position, weight, table, scale)
    if scale is not None:  # the reference is the module's own product
        assert torch.equal(want_embeds, weight[ids] * torch.tensor(3584**0.5, device=DEVICE).to(dtype))
    assert torch.equal(positions[:n], want_positions) and bool((positions[n:] == -1).all())
    assert want_embeds is None or torch.equal(embeds[:n], want_embeds)
    assert want_rows is None or torch.equal(rows[:n], want_rows)


@pytest.mark.parametrize("fill", [True, False], ids=["batch", "tree"])
def test_inputs_of_several_sequences_equal_the_reference(fill):
    """Three sequences of 4 rows: a batch's pending positions (each sequence from its own start)
    written, or a tree's positions read as given; the embedding and rotary rows follow them."""
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(50, 40, generator=gen).to(DEVICE)
    table = torch.randn(100, 8, generator=gen).to(DEVICE)
    ids = torch.randint(0, 50, (12,), generator=gen).to(DEVICE)
    starts = torch.tensor([5, 60, 0], device=DEVICE)
    given = torch.randint(0, 100, (12,), generator=gen).to(DEVICE)
    positions = torch.full((16,), -1, dtype=torch.long, device=DEVICE) if fill else given.clone()
    embeds, rows = torch.zeros(16, 40, device=DEVICE), torch.zeros(16, 8, device=DEVICE)
    step_io.inputs(ids, starts, positions, weight, embeds, table, rows, per=4, fill=fill)
    want = step_inputs_reference(ids, starts, weight, table, per=4, positions=None if fill else given)
    assert torch.equal(positions[:12], want[0]) and torch.equal(embeds[:12], want[1]) and torch.equal(rows[:12], want[2])
    if fill:
        assert positions[:12].tolist() == [5, 6, 7, 8, 60, 61, 62, 63, 0, 1, 2, 3]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("width", [700, 1500, 2100])  # cut, equal, padded
def test_finish_equals_the_reference(dtype, width):
    gen = torch.Generator().manual_seed(width)
    logits = (torch.randn(5, 1500, generator=gen) * 30).to(dtype).to(DEVICE)
    out = torch.full((5, width), float("-inf"), device=DEVICE)
    position = torch.tensor(41, device=DEVICE)
    step_io.finish(logits, out, position, 5)
    want, want_position = step_finish_reference(logits, width, torch.tensor(41, device=DEVICE), 5)
    assert torch.equal(out, want) and int(position) == int(want_position) == 46


def _tiny(family: str):
    import transformers

    extra = {"attn_logit_softcapping": 50.0, "sliding_window": 8} if family == "Gemma2" else {}
    config = getattr(transformers, f"{family}Config")(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, initializer_range=0.5,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(3)
    return getattr(transformers, f"{family}ForCausalLM")(config).to(DEVICE).to(torch.bfloat16).eval()


def _steps(each, width: int) -> list:
    out = []
    with torch.inference_mode():
        each.reset()
        each.forward(torch.arange(9, device=DEVICE), want_logits=False)
        for n in (5, 1, 5, 2):
            logits = torch.full((n, width), float("-inf"), device=DEVICE)
            with each.step_context(n):
                each.step(torch.arange(n, device=DEVICE) * 7 % 96, logits)
            out.append((logits, int(each.position)))
            each.position.sub_(1)  # a rejection's rollback
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family, width", [  # Gemma 2: its embedding scale and soft-capping
    ("Llama", 128),  # padding columns of -inf after the vocabulary
    ("Gemma2", 96),  # the vocabulary
])
def test_runner_steps_are_bit_for_bit_those_without_it(family, width):
    model = _tiny(family)
    plain = runner(model, kernels=kernels(**STEP_KERNELS), capacity=128, width=width)
    fused = runner(model, kernels=kernels(**STEP_KERNELS, step_io=True), capacity=128, width=width)
    launched = []
    real = step_io.inputs
    step_io.inputs = lambda *args, **kw: launched.append(kw.get("scale")) or real(*args, **kw)
    try:
        steps = _steps(fused, width)
    finally:
        step_io.inputs = real
    assert launched and all((scale is not None) == (family == "Gemma2") for scale in launched)  # Gemma's sqrt(H)
    for (want, at), (got, position) in zip(_steps(plain, width), steps):
        assert torch.equal(got, want) and position == at


