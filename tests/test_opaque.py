"""gpu/opaque.py: inside torch.compile the step kernels are operators of their own.

What is checked: while dynamo traces, linear / gate_up and the norms each record one
`specgen::` operator node (never a copy of the Triton kernel); the operators pass torch's own
checks of their schemas and fake implementations; and a compiled call computes bit for bit what
the uncompiled call does, the cache write included, on the CPU through the Triton interpreter
(the operators launch the same kernels; tests/test_gpu.py compiles runners on a GPU).
"""

from __future__ import annotations

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from gpu_helpers import kernels, runner
from specgen.gpu import linear, norm, opaque
from specgen.gpu.linear_table import packaged

DT = torch.float32
TABLE = packaged()  # runners pass their table (read before any trace: dynamo would trace the file read)


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE, DT)

    return dict(
        x=r(3, 64), w=r(96, 64, scale=0.1), gate=r(128, 64, scale=0.1), up=r(128, 64, scale=0.1),
        residual=r(3, 96), nw=r(64) + 1.0, query=r(1, 4, 3, 32), key=r(1, 2, 256, 32), value=r(1, 2, 256, 32),
        k_new=r(1, 2, 3, 32), v_new=r(1, 2, 3, 32), cos=r(1, 3, 32), sin=r(1, 3, 32),
        position=torch.tensor(40, device=DEVICE), counters=torch.zeros(1 << 10, dtype=torch.int32, device=DEVICE),
    )


def _layerish(t, key, value):
    """A decoder layer's linear and norm calls in one function: what a compiled layer traces.
    (gpu/attention.py no longer routes itself here: compile is on its way out.)"""
    normed, summed = norm.add_rms_norm(t["x"], t["x"], t["nw"], 1e-5)
    projected = linear.linear(normed, t["w"], residual=t["residual"], split_k=True, counters=t["counters"],
                              config=(True, 16, 32, 4, 1, 2))  # split-K: two chunks of K
    mlp = linear.gate_up(norm.rms_norm(summed, t["nw"], 1e-5), t["gate"], t["up"], "silu", table=TABLE)
    return projected, mlp


def test_dynamo_records_one_operator_per_kernel_call():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    t = _inputs()
    torch._dynamo.reset()
    try:
        torch.compile(_layerish, backend=record, fullgraph=True)(t, t["key"].clone(), t["value"].clone())
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1
    calls = [str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"]
    specgen = [c for c in calls if c.startswith("specgen.")]
    assert specgen == ["specgen.norm.default", "specgen.linear.default", "specgen.norm.default",
                       "specgen.linear.default"], calls
    assert not [c for c in calls if "triton_kernel_wrapper" in c], calls


def test_compiled_calls_equal_uncompiled_ones_bit_for_bit():
    t = _inputs(1)
    key, value = t["key"].clone(), t["value"].clone()
    want = _layerish(t, key, value)
    key2, value2 = t["key"].clone(), t["value"].clone()
    torch._dynamo.reset()
    try:
        got = torch.compile(_layerish, fullgraph=True)(t, key2, value2)
    finally:
        torch._dynamo.reset()
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert not t["counters"].any()  # split-K's counters are left zero


@pytest.mark.parametrize("name", ["linear", "norm", "norm-add-norm", "norm-add", "attention"])
def test_operators_pass_torchs_checks(name):
    t = _inputs(2)
    cases = {
        "linear": (torch.ops.specgen.linear.default,
                   (t["x"], t["gate"], t["up"], None, None, None, opaque.pack((False, 16, 32, 4, 1)), 1, False)),
        "norm": (torch.ops.specgen.norm.default, (t["x"], t["x"], t["nw"], 1e-5, False, False, False, None, 0.0)),
        # Gemma 2's layer: norm, add, norm; and norm, add
        "norm-add-norm": (torch.ops.specgen.norm.default,
                          (t["x"], t["x"], t["nw"], 1e-5, False, True, True, t["nw"], 1e-6)),
        "norm-add": (torch.ops.specgen.norm.default, (t["x"], t["x"], t["nw"], 1e-5, False, True, True, None, 0.0)),
        "attention": (torch.ops.specgen.attention.default,
                      (t["query"], t["key"].clone(), t["value"].clone(), t["position"], 0.125, 0, t["k_new"],
                       t["v_new"], t["cos"], t["sin"], 0.0, False)),
    }
    op, args = cases[name]
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.slow
@pytest.mark.skip(reason="gpu/attention.py no longer routes itself through gpu/opaque.py while dynamo traces "
                         "(compile is being removed); dynamo cannot trace the interpreted attention kernel")
def test_a_compiled_runner_with_the_real_kernels_equals_the_plain_one(tmp_path):
    """Steps of 3 and 1 tokens through compiled layers on the interpreted kernels: the logits are
    the uncompiled runner's, bit for bit, and every layer took the compiled call."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(DEVICE).eval()
    steps = dict(attention=True, linear=True, rope=True, norm=True, split_k=True)

    def run(each):
        out = []
        with torch.inference_mode():
            each.reset()
            each.forward(torch.arange(7, device=DEVICE), want_logits=False)
            for n in (3, 1):
                logits = torch.zeros(n, 96, device=DEVICE)
                with each.step_context(n):
                    each.step(torch.arange(n, device=DEVICE) + 3, logits)
                out.append(logits)
        return out

    torch._dynamo.reset()
    try:
        fast = runner(model, kernels=kernels(**steps), capacity=128, compile=True, compile_cache_folder=str(tmp_path))
        got = run(fast)
        assert fast.compiled.layers == 2
    finally:
        torch._dynamo.reset()
    want = run(runner(model, kernels=kernels(**steps), capacity=128))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
