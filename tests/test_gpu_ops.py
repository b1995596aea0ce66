"""gpu/ops.py: specgen's own model step on the Triton kernel table, against the same step on the
torch reference (core/step/ops.py), inside GraphRunner. On the CPU the kernels run in Triton's
interpreter, whose products are summed per row as tensor cores compute them, so the row
invariance that bit-exact greedy decoding needs is checked here too; on a GPU the real kernels."""

from __future__ import annotations

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels, runner
from specgen.core.models import load_model
from specgen.core.settings import ModelSpec
from specgen.core.step.model import OwnedModel
from specgen.gpu.ops import TritonOps
from tiny_models import build_family

TOLERANCE = 3e-4  # as tests/test_families.py's RUNNER_TOLERANCE: float32 rounding reaches ~3e-5
EVERY = dict(attention=True, linear=True, rope=True, norm=True, step_io=True)


@pytest.fixture(scope="module", params=["llama-3.1", pytest.param("qwen2.5", marks=pytest.mark.slow),
                                        pytest.param("qwen3", marks=pytest.mark.slow), "gemma-2"])
def family(request, tmp_path_factory):
    return request.param, build_family(tmp_path_factory.mktemp("ops"), request.param)


def _owned(folder) -> OwnedModel:
    model = load_model(ModelSpec(str(folder), dtype="float32", device=str(DEVICE)))
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
