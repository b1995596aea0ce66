"""gpu/kernels/dependent.py: a step's kernels launched dependent on the kernel before them.

On every machine: a runner resolved with dependent launch hands it to every kernel its steps
launch (and one without it to none), in the prefill's eager calls and in its steps; on the CPU the
spied calls then run the interpreter's kernels without it. With an sm_90+ GPU: a long eager chain
of the kernels, each reading what the one before wrote, and a runner's captured steps give
bitwise what plain launches give (a missing wait would read a buffer before it is written), and so
does a chain of a sampled round's warp and verify kernels.
"""

from __future__ import annotations

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import ast
import functools
import inspect
from pathlib import Path

import pytest
import torch

from gpu_helpers import kernels, runner
from specgen.gpu.kernels import attention
from specgen.gpu.kernels import dependent
from specgen.gpu.kernels import linear
from specgen.gpu.kernels import norm
from specgen.gpu.kernels import step_io
from specgen.gpu.kernels import argmax, warp
from specgen.gpu.workspace import Workspace

HOPPER = DEVICE.type == "cuda" and torch.cuda.get_device_capability(DEVICE)[0] >= 9
STEP_KERNELS = dict(attention=True, linear=True, rope=True, norm=True, step_io=True)
LAUNCHERS = [(linear, "linear"), (linear, "gate_up"), (norm, "rms_norm"),
             (attention, "decode_attention"), (step_io, "inputs"), (step_io, "finish")]
hopper = pytest.mark.skipif(not HOPPER, reason="needs an NVIDIA GPU of compute capability 9.0 or later")


def _tiny(dtype=torch.float32):
    import transformers

    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      initializer_range=0.5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(5)
    return transformers.LlamaForCausalLM(config).to(DEVICE).to(dtype).eval()


def test_options_name_the_attribute_only_when_asked():
    # the interpreter and old Triton never see launch_pdl; fused multiply-adds are always said
    assert dependent.launch_options(False) == {"enable_fp_fusion": True}
    assert dependent.launch_options(True) == {"enable_fp_fusion": True, "launch_pdl": True}
    assert dependent.launch_options(True, fp_fusion=False) == {"enable_fp_fusion": False, "launch_pdl": True}


def _launches(tree: ast.Module):
    """Every kernel launch of a module: calls of the form name[grid](...) where name ends in _kernel."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("_kernel")):
            yield node


def _says_fp_fusion(call: ast.Call) -> bool:
    """The launch spreads launch_options(...) (directly, or through a dict built from it: the
    warp kernels' `launch`), or names enable_fp_fusion itself."""
    for keyword in call.keywords:
        if keyword.arg == "enable_fp_fusion":
            return True
        if keyword.arg is None:
            value = keyword.value
            if isinstance(value, ast.Name) and value.id == "launch":
                return True  # built by launch_options: checked below for the modules that use it
            if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "launch_options"
                   for n in ast.walk(value)):
                return True
    return False


def test_every_launch_says_whether_it_fuses_multiply_adds():
    """Every kernel launch in gpu/kernels passes launch_options (or enable_fp_fusion itself): left to
    Triton's default, a kernel's bits would change with the Triton version (3.10 turns it off) and
    Triton 3.9 warns on stderr. A module whose launches spread a `launch` dict builds it from
    launch_options (warp.py) or takes it from a caller that does (cuts.py, from warp.py)."""
    folder = Path(dependent.__file__).parent
    seen = 0
    for path in sorted(folder.glob("*.py")):
        source = path.read_text()
        for call in _launches(ast.parse(source)):
            seen += 1
            assert _says_fp_fusion(call), f"{path.name}:{call.lineno}: a launch without launch_options"
        if "**launch," in source or "**launch}" in source:
            assert "launch_options(" in source or path.name == "cuts.py", path.name
    assert seen >= 25  # the scan finds the launches (about 30)


@pytest.mark.parametrize("flag", [False, True])
def test_a_runner_hands_its_setting_to_every_kernel_it_launches(monkeypatch, flag):
    seen = []
    for module, name in LAUNCHERS:
        original = getattr(module, name)
        signature = inspect.signature(original)

        @functools.wraps(original)
        def spy(*args, _original=original, _signature=signature, _name=name, **kwargs):
            bound = _signature.bind(*args, **kwargs)
            seen.append((_name, bound.arguments.get("dependent", False)))
            bound.arguments["dependent"] = bound.arguments.get("dependent", False) and HOPPER
            return _original(*bound.args, **bound.kwargs)

        monkeypatch.setattr(module, name, spy)
    each = runner(_tiny(), kernels=kernels(**STEP_KERNELS, dependent_launch=flag), capacity=128)
    with torch.inference_mode():
        each.forward(torch.arange(9, device=DEVICE), want_logits=False)  # an eager prefill
        for n in (1, 5):
            with each.step_context(n):
                each.step(torch.arange(n, device=DEVICE), torch.zeros(n, 96, device=DEVICE))
    assert {name for name, _ in seen} == {name for _, name in LAUNCHERS}
    assert {value for _, value in seen} == {flag}


@hopper
@pytest.mark.parametrize("split", [1, 4])
def test_a_chain_of_dependent_kernels_equals_plain_launches(split):
    """64 layers of norm -> q/k/v -> attention -> o + residual -> add + norm -> gate/up -> down +
    residual -> an argmax over 20,000 logits, each kernel reading the one before's output, eagerly
    on one stream."""
    gen = torch.Generator(device=DEVICE).manual_seed(split)
    hidden, inter, heads, kv_heads, dim, capacity = 512, 1536, 8, 2, 64, 256

    def w(*shape):
        return (torch.randn(*shape, generator=gen, device=DEVICE) * 0.05).to(torch.bfloat16)

    layers = [dict(qkv=w(hidden + 2 * kv_heads * dim, hidden), o=w(hidden, hidden), g=w(inter, hidden),
                   u=w(inter, hidden), d=w(hidden, inter), n1=w(hidden) + 1, n2=w(hidden) + 1) for _ in range(64)]
    caches = [(w(1, kv_heads, capacity, dim), w(1, kv_heads, capacity, dim)) for _ in layers]
    head = w(20000, hidden)
    x0 = w(5, hidden)
    position = torch.tensor(capacity - 5, device=DEVICE)
    workspace = Workspace(DEVICE)
    counters = linear.split_k_counters(workspace)
    config = (True, 16, 256, 4, 4, split)

    def chain(flag: bool) -> torch.Tensor:
        x = x0
        for layer, (keys, values) in zip(layers, caches):
            keys, values = keys.clone(), values.clone()
            h = norm.rms_norm(x, layer["n1"], 1e-5, flag)
            qkv = linear.linear(h, layer["qkv"], None, config, counters=counters, dependent=flag)
            q = qkv[:, :hidden].reshape(1, 5, heads, dim).transpose(1, 2)
            k = qkv[:, hidden:hidden + kv_heads * dim].reshape(1, 5, kv_heads, dim).transpose(1, 2)
            v = qkv[:, hidden + kv_heads * dim:].reshape(1, 5, kv_heads, dim).transpose(1, 2)
            cos = torch.ones(1, 5, dim, dtype=torch.bfloat16, device=DEVICE)
            out = attention.decode_attention(q, keys, values, position, dim ** -0.5, 0, (k, v, cos, cos * 0.5),
                                             dependent=flag)
            x = linear.linear(out.reshape(5, hidden), layer["o"], None, config, counters=counters,
                              residual=x, dependent=flag)
            h, x = norm.add_rms_norm(x, x, layer["n2"], 1e-5, flag)
            a = linear.gate_up(h, layer["g"], layer["u"], "silu", config, counters=counters, dependent=flag)
            x = linear.linear(a, layer["d"], None, config, counters=counters, residual=x, dependent=flag)
            picks = torch.empty(5, dtype=torch.int64, device=DEVICE)
            argmax.argmax(linear.linear(x, head, None, config, counters=counters, dependent=flag), picks,
                        workspace, dependent=flag)  # a draft's pick, in 3 segments and merged
            x = x + picks.to(x.dtype).unsqueeze(1) * 1e-3  # the next layer reads the pick
        return x

    want = chain(False)
    for _ in range(3):
        assert torch.equal(chain(True), want)


@hopper
@pytest.mark.parametrize("vocab", [8192, 128256])
def test_a_sampled_round_chain_equals_plain_launches(vocab):
    """A sampled round's own kernels chained 40 times: a projection to logits, warp with its race
    (stats, the parallel cut search's passes, cut, probs: top-p, and top-k with min-p for the
    one-program search) into a row of q, the target's warp, verify_random and verify_greedy, each
    reading what the kernel before wrote, eagerly on one stream."""
    from specgen.core.sampling.warp import WarpParams
    from specgen.gpu.kernels import verify

    gen = torch.Generator(device=DEVICE).manual_seed(vocab)
    hidden, k = 256, 4
    head = (torch.randn(vocab, hidden, generator=gen, device=DEVICE) * 0.3).to(torch.bfloat16)
    x0 = torch.randn(k + 1, hidden, generator=gen, device=DEVICE).to(torch.bfloat16)
    expo = -torch.rand(k + 1, vocab, generator=gen, device=DEVICE).log1p().neg().clamp_min(1e-6)
    uniform = torch.rand(k, generator=gen, device=DEVICE).clamp_min(1e-6)
    cu = torch.tensor([k], dtype=torch.int32, device=DEVICE)

    def params(rows, **values):
        base = dict(temperature=0.8, top_k=-1, top_p=0.95, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                    frequency_penalty=0.0) | values
        return WarpParams(**{name: torch.full((rows,), value, dtype=torch.int32 if name == "top_k" else torch.float32,
                                              device=DEVICE) for name, value in base.items()})

    draft_rows = [params(1), params(1, top_k=40, min_p=0.02)]
    target_rows = params(k + 1)
    workspace = Workspace(DEVICE)

    def chain(flag: bool) -> list[torch.Tensor]:
        x, outs = x0, []
        q = torch.zeros(k, vocab, device=DEVICE)
        drafts = torch.zeros(k, dtype=torch.int64, device=DEVICE)
        for turn in range(40):
            for i in range(k):
                logits = linear.linear(x[i : i + 1], head, None, dependent=flag)
                warp.warp(logits, draft_rows[(turn + i) % 2], None, None, workspace, expo[i : i + 1],
                          drafts[i : i + 1], probs_out=q[i : i + 1], dependent=flag)
            argmax, probs = warp.warp(linear.linear(x, head, None, dependent=flag), target_rows, None, None,
                                      workspace, dependent=flag)
            out = verify.verify_random(drafts, cu, q, probs, uniform, expo[k:], k, workspace, dependent=flag)
            greedy = verify.verify_greedy(drafts, cu, argmax, k, workspace, dependent=flag)
            outs += [out, greedy, drafts.clone()]
            x = x + (out[0, :1] % 7).to(x.dtype).unsqueeze(1) * 1e-2  # the next turn reads the verdict
        return outs

    want = chain(False)
    assert int(workspace.error) == 0
    for _ in range(2):
        got = chain(True)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@hopper
def test_captured_steps_equal_plain_ones():
    model = _tiny(torch.bfloat16)
    results = []
    for flag in (False, True):
        each = runner(model, kernels=kernels(**STEP_KERNELS, split_k=True, dependent_launch=flag), shapes=(1, 5),
                      use_graphs=True, capacity=256)
        out = [each.forward(torch.arange(20, device=DEVICE) * 5 % 96)]
        for n in (1, 5, 1, 5, 5):
            out.append(each.forward(torch.arange(n, device=DEVICE) * 11 % 96).clone())
            each.truncate(each.length - 1)  # a rejection's rollback
        results.append(out)
    for plain, fast in zip(*results):
        assert torch.equal(fast, plain)
