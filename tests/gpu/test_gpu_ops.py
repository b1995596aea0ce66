"""gpu/ops.py: specgen's own model step on the Triton kernel table, against the same step on the
torch reference (core/step/ops.py), inside GraphRunner. On the CPU the kernels run in Triton's
interpreter, whose products are summed per row as tensor cores compute them, so the row
invariance that bit-exact greedy decoding needs is checked here too (a chain's rows, a token
tree's nodes, a batch's sequences); on a GPU the real kernels (the cuda tests, in bf16)."""

from __future__ import annotations

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels, runner
from specgen.core.models.loading import load_model
from specgen.core.settings import ModelSpec
from specgen.core.step.model import OwnedModel
from specgen.gpu.ops import TritonOps
from rows_helpers import leaves, path
from specgen.core.step import rows as rowsets
from tiny_models import build_family

TOLERANCE = 3e-4  # as tests/core/models/test_families.py's RUNNER_TOLERANCE: float32 rounding reaches ~3e-5
EVERY = dict(attention=True, linear=True, rope=True, norm=True, step_io=True)


@pytest.fixture(scope="module", params=["llama-3.1", pytest.param("qwen2.5", marks=pytest.mark.slow),
                                        pytest.param("qwen3", marks=pytest.mark.slow), "gemma-2"])
def family(request, tmp_path_factory):
    return request.param, build_family(tmp_path_factory.mktemp("ops"), request.param)


def _owned(folder, dtype: str = "float32") -> OwnedModel:
    model = load_model(ModelSpec(str(folder), dtype=dtype, device=str(DEVICE)))
    assert isinstance(model, OwnedModel)
    return model


def _script(each) -> list[torch.Tensor]:
    """A 30-token prompt (past Gemma's 24-token windows), then 5-, 1- and 5-token steps, each rolled
    back by two (a rejection: the next step overwrites their keys)."""
    gen = torch.Generator().manual_seed(0)
    each.reset()
    out = [each.forward(torch.randint(0, 380, (30,), generator=gen).to(DEVICE)).clone()]
    for n in (5, 1, 5):
        out.append(each.forward(torch.randint(0, 380, (n,), generator=gen).to(DEVICE)).clone())
        each.truncate(each.length - 2)
    return out


def test_the_kernel_table_computes_the_references_logits(family):
    """Every kernel of the table (fused q/k/v, rotary and the cache write inside attention, norms,
    Gemma's norm-add-norm, gate/up, the residual adds in the projections' epilogues) against the
    torch reference, through prefill, verification-sized steps and rollbacks."""
    name, folder = family
    width = 380
    fast = runner(_owned(folder / "target"), kernels=kernels(**EVERY), width=width, capacity=192)
    plain = runner(_owned(folder / "target"), kernels=kernels(), width=width, capacity=192)
    assert isinstance(fast.ops, TritonOps) and fast.ops.kernels.attention
    assert fast.model.model.layers[0].self_attn.fused is not None and fast.ops.table is not None
    for step, (got, want) in enumerate(zip(_script(fast), _script(plain))):
        diff = (got - want).abs().max().item()
        assert diff < TOLERANCE, f"{name} feed {step}: max logit diff {diff:.3g}"
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_a_verification_row_is_its_one_token_step(family):
    """A 5-token step's rows equal, bit for bit, the 1-token steps at the same positions over the
    same cache: what makes bf16 greedy speculative output target-only's."""
    name, folder = family
    each = runner(_owned(folder / "target"), kernels=kernels(**EVERY), width=380, capacity=192)
    gen = torch.Generator().manual_seed(1)
    prompt, tokens = (torch.randint(0, 380, (n,), generator=gen).to(DEVICE) for n in (27, 5))
    each.reset()
    each.forward(prompt, want_logits=False)
    together = each.forward(tokens).clone()
    each.truncate(27)
    alone = torch.cat([each.forward(tokens[i:i + 1]).clone() for i in range(5)])
    assert torch.equal(together, alone), f"{name}: max diff {(together - alone).abs().max().item():.3g}"


# ---------------------------------------------------------------- token trees and batches

TREE = [-1, 0, 0, 1]  # width 2, depth 3: paths 0-1-3 and 0-2
BATCH_PARENTS = [[-1, 0, 1], [-1, -1, 0], [-1, 0, 0]]  # each sequence's own tree


def check_tree_nodes(each, parents: list[int], prefix_length: int, vocab: int, seed: int = 2) -> None:
    """Each node of a token tree verified in one step (the runner's table and cache) equals, bit
    for bit, the one-token step at its position after its path's tokens were fed one by one."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab, (prefix_length,), generator=gen).to(DEVICE)
    nodes = torch.randint(0, vocab, (len(parents),), generator=gen).to(DEVICE)
    each.reset()
    each.forward(prefix, want_logits=False)
    with torch.inference_mode():
        rows = rowsets.tree(nodes[None], torch.tensor(parents, device=DEVICE), prefix_length)
        tree = each.model.step(rows, each.cache, each.ops)[0]  # [n, V]
    cols = min(tree.shape[-1], each.width)
    for leaf in leaves(parents):
        each.truncate(prefix_length)
        for node in path(parents, leaf):
            alone = each.forward(nodes[node:node + 1]).clone()[0]
            assert torch.equal(alone[:cols], tree[node, :cols].float()), (leaf, node)


def check_batch_rows(each, lengths: list[int], parents: list[list[int]] | None, vocab: int, seed: int = 3) -> None:
    """Sequences of different lengths in one step (each its own cache row and start, its prefix's
    keys and values random; chains of 3 rows, or each its own tree) give each row bitwise its
    sequence's rows stepped alone over the same cache row."""
    model, ops, capacity = each.model, each.ops, each.cache.capacity
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (len(lengths), 3), generator=gen).to(DEVICE)
    shape = None if parents is None else torch.tensor(parents, device=DEVICE)
    layout = (lambda tokens, start, b=slice(None): rowsets.batch(tokens, start) if shape is None
              else rowsets.tree(tokens, shape[b], start))
    with torch.inference_mode():
        cache = model.new_cache(len(lengths), capacity)
        for layer in cache.keys + cache.values:
            layer.copy_(torch.randn(layer.shape, generator=gen).to(layer.dtype))
        cache.positions.copy_(torch.arange(capacity).expand(len(lengths), capacity))
        alone = []
        for b in range(len(lengths)):
            single = model.new_cache(1, capacity)
            for mine, theirs in ((single.keys, cache.keys), (single.values, cache.values)):
                for layer, source in zip(mine, theirs):
                    layer.copy_(source[b:b + 1])
            single.positions.copy_(cache.positions[b:b + 1])
            alone.append(model.step(layout(ids[b:b + 1], [lengths[b]], slice(b, b + 1)), single, ops)[0])
        together = model.step(layout(ids, lengths), cache, ops)
    for b in range(len(lengths)):
        assert torch.equal(together[b], alone[b]), b


def test_tree_nodes_are_their_one_token_steps(family):
    """A 4-node tree after a 27-token prompt (past Gemma 2's window): every node's logits are the
    one-token step's on its path, bit for bit, through the kernel table. (A cache of one attention
    split keeps the interpreter quick: tests/gpu/kernels/test_attention.py crosses splits.)"""
    name, folder = family
    each = runner(_owned(folder / "target"), kernels=kernels(**EVERY), width=380, capacity=64)
    check_tree_nodes(each, TREE, 27, 380)


def test_batch_rows_are_each_sequence_alone(family):
    """Three sequences (6, 2 and 30 tokens) in one step: chains, or for Gemma 2 and Qwen3 trees
    (one layout a family keeps the interpreter's time down; the kernel tests take both)."""
    name, folder = family
    each = runner(_owned(folder / "target"), kernels=kernels(**EVERY), width=380, capacity=64)
    check_batch_rows(each, [6, 2, 30], BATCH_PARENTS if name in ("gemma-2", "qwen3") else None, 380)


@pytest.mark.cuda
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["llama-3.1", "qwen2.5", "qwen3", "gemma-2"])
def test_tree_and_batch_rows_equal_their_steps_alone_on_gpu(name, tmp_path):
    """bf16 on the GPU, every kernel on and the one-token steps captured: a 32-node tree's nodes
    equal the one-token steps on their paths, and batch rows their sequences alone (torch.equal)."""
    from rows_helpers import random_tree

    each = runner(_owned(build_family(tmp_path, name) / "target", "bfloat16"), kernels=kernels(**EVERY),
                  width=380, capacity=192, shapes=(1, 5), use_graphs=True)
    assert each.graphs
    check_tree_nodes(each, TREE, 27, 380)
    check_tree_nodes(each, random_tree(32, 4, 6, 0), 60, 380)
    for parents in (None, BATCH_PARENTS):
        check_batch_rows(each, [27, 4, 150], parents, 380)
