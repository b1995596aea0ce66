"""Linear layers for decode and verification steps: a Triton kernel that streams each weight once.

Why: a decode step of a large target reads every weight once, so its floor is weight bytes over
memory bandwidth. cuBLAS picks different kernels for 1 row and for the 5 rows of a k = 4
verification, and neither reaches the floor on a Llama-3-8B shape on an H200 (docs/benchmarks.md):
the 1-token step took 1.44x the floor; inductor's matrix-vector reduction reaches 1.23x for one
row, but the 5-token step stays on cuBLAS at 1.18x the 1-token step. Here one program owns
BLOCK_N output columns, walks K once, and multiplies each weight tile by every row (up to
MAX_ROWS, padded to 16 for a tensor-core product) while it is loaded, so 5 rows cost what 1 row
costs. With one configuration for 1 and for 5 rows (every N > 2048), each row is computed the same
way whatever the number of rows.

`gate_up` fuses the MLP's two input projections and its activation: act(x W_g^T) * (x W_u^T), one
pass over both weights with no [rows, 2 x intermediate] round trip; the rounding steps of the
unfused module (each projection, the activation, the product in the model's dtype) are kept.

The q, k and v projections of an attention module are fused the same way: their weights are
concatenated once into one buffer (the modules' weights become views of it, so no memory is
added), the q call computes all three in one pass and the k and v calls return slices of it.

Pre-norm decoder layers (Llama, Mistral, Qwen2, Qwen3, Gemma) lose their own norm and residual
kernels in steps: the q/k/v call applies the layer's input RMSNorm, the gate/up call adds the
attention output to the residual stream and applies the second RMSNorm, and the down call adds the
MLP's output (`_decoder_forward`). A norm is one scale per row, r = rsqrt(mean(x^2) + eps), so
norm(x) W^T = r * ((x * g) W^T): each program sums x^2 over the x tiles it loads anyway and scales
its accumulators at the end, with no extra pass before the first weight tile. That removes two
kernels per layer from a step (64 on Llama-3-8B). `SPECGEN_FUSE_NORMS=0` keeps the norms apart.

`install(model)` swaps the classes of a model's nn.Linear and gated-MLP modules for subclasses
whose forward takes this path for inputs of at most MAX_ROWS rows, inside `active()` only, and is
the original otherwise (prefill, other users of the model object); `uninstall` restores them.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 16
ACTIVATIONS = {"silu": 1, "gelu_pytorch_tanh": 2, "gelu_tanh": 2}  # HF hidden_act -> kernel code
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# (DOT, BLOCK_N, BLOCK_K, num_warps, num_stages), measured with bench_linear.py on an H200 over
# Llama-3-8B's projections (docs/benchmarks.md): one tensor-core configuration is within 5% of the
# best for 1 and for 5 rows on every shape with N > 2048; narrower outputs (k/v projections that
# could not be fused) want narrower tiles, and a single row there the register path.
WIDE = (True, 32, 256, 4, 4)
NARROW = (True, 16, 256, 4, 4)
NARROW_ONE_ROW = (False, 2, 2048, 4, 1)


def _config(rows: int, n: int, k: int):
    if rows > MAX_ROWS:
        raise ValueError(f"{rows} rows > MAX_ROWS {MAX_ROWS}")
    if n > 2048:
        return WIDE
    if rows == 1:
        return NARROW_ONE_ROW[:2] + (min(NARROW_ONE_ROW[2], triton.next_power_of_2(k)),) + NARROW_ONE_ROW[3:]
    return NARROW


NORMS = {"llama": 1, "gemma": 2}  # RMSNorm kinds: weight * x_normed (rounded first) / x_normed * (1 + weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           config: tuple | None = None, norm: tuple | None = None,
           add_to_output: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for inputs of at most MAX_ROWS rows: x [..., K], weight [N, K] -> [..., N].

    norm = (weight [K], eps, kind) applies an RMSNorm of that kind (NORMS) to x first, inside the
    kernel; add_to_output [..., N] is added to the result (a residual connection), rounded like
    torch's `residual + y` in the model's dtype."""
    return _launch(x, weight, None, bias, 0, config, norm, None, add_to_output)[0]


def gate_up(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str,
            config: tuple | None = None, norm: tuple | None = None,
            add_to_input: torch.Tensor | None = None):
    """act(x gate^T) * (x up^T) with the rounding of the unfused module: x [..., K] -> [..., N].

    With add_to_input, x is first replaced by s = x + add_to_input (in the model's dtype) and the
    result is (output, s): a decoder layer's residual sum, computed while the weights stream. norm
    as in `linear`, applied to x (or s)."""
    out, total = _launch(x, gate, up, None, ACTIVATIONS[activation], config, norm, add_to_input, None)
    return out if add_to_input is None else (out, total)


def _launch(x, weight, up, bias, act, config, norm=None, add_in=None, add_out=None):
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    assert rows <= MAX_ROWS and weight.stride(-1) == 1
    dot, block_n, block_k, warps, stages = config or _config(rows, n, k)
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    second = up if up is not None else weight
    assert second.shape == weight.shape and second.stride() == weight.stride()
    total = None
    if add_in is not None:
        add_in = add_in.reshape(rows, k).contiguous()
        x2 = x2.contiguous()
        total = torch.empty(rows, k, dtype=x.dtype, device=x.device)
    if add_out is not None:
        add_out = add_out.reshape(rows, n).contiguous()
    norm_weight, eps, kind = norm if norm is not None else (weight, 0.0, None)
    if norm is not None:
        assert norm_weight.shape == (k,) and norm_weight.is_contiguous()
    _linear_kernel[(triton.cdiv(n, block_n),)](
        x2, weight, second, bias if bias is not None else weight, out,
        add_in if add_in is not None else x2, total if total is not None else x2,
        norm_weight, add_out if add_out is not None else out,
        rows, n, k, x2.stride(0), weight.stride(0), out.stride(0), float(eps),
        HAS_BIAS=bias is not None, ACT=act, EVEN_K=k % block_k == 0, DOT=dot,
        F32_DOT=x.dtype == torch.float32 or _INTERPRETED,
        NORM=NORMS[kind] if kind is not None else 0, ADD_IN=add_in is not None, ADD_OUT=add_out is not None,
        BLOCK_M=16 if dot else triton.next_power_of_2(rows), BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages,
    )
    return out.reshape(*lead, n), (total.reshape(*lead, k) if total is not None else None)


def rms_norm_reference(x, weight, eps: float, kind: str):
    """What Hugging Face's RMSNorm modules compute: LlamaRMSNorm (and Mistral's, Qwen2's, Qwen3's)
    for "llama", GemmaRMSNorm for "gemma"."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if NORMS[kind] == 1:
        return weight * normed.to(x.dtype)
    return (normed * (1.0 + weight.float())).type_as(x)


def linear_reference(x, weight, bias=None, norm=None, add_to_output=None):
    if norm is not None:
        x = rms_norm_reference(x, *norm)
    y = F.linear(x, weight, bias)
    return y if add_to_output is None else add_to_output + y


def gate_up_reference(x, gate, up, activation: str, norm=None, add_to_input=None):
    """What the unfused module computes: act(F.linear(x, gate)) * F.linear(x, up) in x's dtype
    (after the residual sum and the norm when given: then (output, sum))."""
    total = x if add_to_input is None else add_to_input + x
    h = total if norm is None else rms_norm_reference(total, *norm)
    g = F.linear(h, gate)
    act = F.silu(g) if ACTIVATIONS[activation] == 1 else F.gelu(g, approximate="tanh")
    out = act * F.linear(h, up)
    return out if add_to_input is None else (out, total)


@triton.jit
def _act(g, ACT: tl.constexpr):
    if ACT == 1:  # silu
        return g / (1.0 + tl.exp(-g))
    else:  # gelu, tanh approximation; tanh(z) = 2 sigmoid(2z) - 1
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        return g * (1.0 - 1.0 / (1.0 + tl.exp(2.0 * z)))


@triton.jit
def _linear_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    u_ptr,  # [N, K] the up projection when ACT > 0 (else w_ptr again, unread)
    b_ptr,  # [N] when HAS_BIAS
    out_ptr,  # [M, N]
    a_ptr,  # [M, K] added to x first when ADD_IN (contiguous, like x then)
    s_ptr,  # [M, K] x + a, written by program 0 when ADD_IN
    g_ptr,  # [K] the RMSNorm's weight when NORM > 0
    r_ptr,  # [M, N] added to the output when ADD_OUT (contiguous)
    M, N, K, sxm, swn, som, eps,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr, F32_DOT: tl.constexpr,
    NORM: tl.constexpr, ADD_IN: tl.constexpr, ADD_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program p computes out[:, p * BLOCK_N : (p + 1) * BLOCK_N] over the whole of K, one weight
    tile at a time: a tensor-core product with the rows padded to BLOCK_M = 16 (DOT), or products
    summed along K in registers (one row: a matrix-vector product).

    The RMSNorm (NORM) is folded into the walk: norm(x) W^T = r * ((x * g) W^T) with one scale r per
    row, so each program sums x^2 over the tiles it loads anyway and scales its accumulators at the
    end; no pass over x comes before the first weight tile."""
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [N]
    col_ok = cols < N
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    kk = tl.arange(0, BLOCK_K)
    dtype = out_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    squares = tl.zeros([BLOCK_M], tl.float32)
    w_base = w_ptr + cols[:, None].to(tl.int64) * swn + kk[None, :]
    u_base = u_ptr + cols[:, None].to(tl.int64) * swn + kk[None, :]
    x_base = x_ptr + rows[:, None] * sxm + kk[None, :]
    a_base = a_ptr + rows[:, None] * K + kk[None, :]
    s_base = s_ptr + rows[:, None] * K + kk[None, :]
    for start in range(0, K, BLOCK_K):
        if EVEN_K:
            k_ok = kk < BLOCK_K
            w_mask = col_ok[:, None]
            x_mask = row_ok[:, None]
        else:
            k_ok = (start + kk) < K
            w_mask = col_ok[:, None] & k_ok[None, :]
            x_mask = row_ok[:, None] & k_ok[None, :]
        x = tl.load(x_base + start, mask=x_mask, other=0.0)
        w = tl.load(w_base + start, mask=w_mask, other=0.0)
        if ADD_IN:  # the residual sum, rounded like torch's in the model's dtype
            x = (x.to(tl.float32) + tl.load(a_base + start, mask=x_mask, other=0.0).to(tl.float32)).to(dtype)
            if pid == 0:
                tl.store(s_base + start, x, mask=x_mask)
        if NORM > 0:
            xf = x.to(tl.float32)
            squares += tl.sum(xf * xf, axis=1)
            g = tl.load(g_ptr + start + kk, mask=k_ok, other=0.0).to(tl.float32)
            if NORM == 2:
                g = 1.0 + g
            x = (xf * g[None, :]).to(x.dtype)
        acc = _accumulate(acc, x, w, DOT, F32_DOT)
        if ACT > 0:
            u = tl.load(u_base + start, mask=w_mask, other=0.0)
            acc_u = _accumulate(acc_u, x, u, DOT, F32_DOT)
    if NORM > 0:
        scale = 1.0 / tl.sqrt(squares / K + eps)
        acc = acc * scale[:, None]
        acc_u = acc_u * scale[:, None]
    if HAS_BIAS:
        acc = acc.to(dtype).to(tl.float32) + tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACT > 0:  # each rounding step of act(gate(x)) * up(x) in the model's dtype
        g = _act(acc.to(dtype).to(tl.float32), ACT).to(dtype).to(tl.float32)
        acc = g * acc_u.to(dtype).to(tl.float32)
    out_mask = row_ok[:, None] & col_ok[None, :]
    if ADD_OUT:  # residual + y, y rounded first
        acc = acc.to(dtype).to(tl.float32) + tl.load(r_ptr + rows[:, None] * N + cols[None, :], mask=out_mask,
                                                     other=0.0).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * som + cols[None, :], acc.to(dtype), mask=out_mask)


@triton.jit
def _accumulate(acc, x, w, DOT: tl.constexpr, F32_DOT: tl.constexpr):
    """acc [M, N] + x [M, K] @ w [N, K]^T in float32."""
    if DOT:
        if F32_DOT:
            return acc + tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        return acc + tl.dot(x, tl.trans(w))
    return acc + tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)


# -- installing into a model ------------------------------------------------------------------------


_ACTIVE = False  # set by a runner around its own forwards (and captures) only


@contextlib.contextmanager
def active(on: bool = True):
    """Installed modules take the kernel path inside this context (when `on`), F.linear outside:
    other users of the same model object (Hugging Face's generate in a benchmark) are unaffected."""
    global _ACTIVE
    saved, _ACTIVE = _ACTIVE, on
    try:
        yield
    finally:
        _ACTIVE = saved


def _small(x: torch.Tensor) -> bool:
    return _ACTIVE and 0 < x.numel() and x.numel() // x.shape[-1] <= MAX_ROWS


class SkinnyLinear(torch.nn.Linear):
    """nn.Linear whose forward runs gpu/linear.py's kernel for inputs of at most MAX_ROWS rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _small(x):
            return linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class _Fused:
    """The q, k and v projections of one attention module, concatenated: one weight [Nq + Nk + Nv, K]
    whose row blocks are the three modules' weights (views, no copy kept)."""

    def __init__(self, parts):
        self.weight = torch.cat([p.weight.detach() for p in parts])
        self.bias = torch.cat([p.bias.detach() for p in parts]) if parts[0].bias is not None else None
        self.bounds = []
        at = 0
        for part in parts:
            rows = part.weight.shape[0]
            self.bounds.append((at, at + rows))
            part.weight = torch.nn.Parameter(self.weight[at:at + rows], requires_grad=False)
            if self.bias is not None:
                part.bias = torch.nn.Parameter(self.bias[at:at + rows], requires_grad=False)
            at += rows
        self.pending = None  # (input, fused output) between the q call and the v call
        self.norm = None  # (weight, eps, kind): the decoder layer's input RMSNorm, when it is fused
        self.raw = None  # the un-normalised input the fused decoder layer passes, during its call


class SkinnyQKV(SkinnyLinear):
    """q_proj / k_proj / v_proj of one attention module. The q call computes all three outputs in
    one pass over the fused weight; the k and v calls on the same input return their slices. Given
    the raw input of a fused decoder layer (`_Fused.raw`), the layer's input RMSNorm is applied in
    the kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _small(x):
            return F.linear(x, self.weight, self.bias)
        fused, role = self._specgen_fused, self._specgen_role
        lo, hi = fused.bounds[role]
        norm = fused.norm if fused.raw is x else None
        if role == 0:
            y = linear(x, fused.weight, fused.bias, norm=norm)
            fused.pending = (x, y)
            return y[..., lo:hi]
        pending = fused.pending
        if pending is not None and pending[0] is x:
            if role == len(fused.bounds) - 1:
                fused.pending = None
            return pending[1][..., lo:hi]
        return linear(x, self.weight, self.bias, norm=norm)


def _mlp_forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """With `residual` (from a fused decoder layer only): residual + mlp(norm(residual + x)), the
    sum, the norm and the final add inside the two kernels."""
    if residual is not None:
        hidden, total = gate_up(x, self.gate_proj.weight, self.up_proj.weight, self._specgen_act,
                                norm=self._specgen_norm, add_to_input=residual)
        return linear(hidden, self.down_proj.weight, add_to_output=total)
    if _small(x):
        return self.down_proj(gate_up(x, self.gate_proj.weight, self.up_proj.weight, self._specgen_act))
    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _decoder_forward(self, hidden_states: torch.Tensor, attention_mask=None, position_ids=None,
                     past_key_values=None, use_cache=False, position_embeddings=None, **kwargs):
    """A pre-norm decoder layer (Llama, Mistral, Qwen2, Qwen3, Gemma) for steps of at most MAX_ROWS
    rows, with no norm or residual kernels of its own: the q/k/v kernel applies the input norm, the
    gate/up kernel adds the attention output to the residual stream and applies the second norm, the
    down kernel adds the MLP's output. The module's own forward otherwise."""
    if not _small(hidden_states):
        return self._specgen_class.forward(self, hidden_states, attention_mask=attention_mask,
                                           position_ids=position_ids, past_key_values=past_key_values,
                                           use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    fused = self.self_attn.q_proj._specgen_fused
    fused.raw = hidden_states
    attended, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                 position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache,
                                 position_embeddings=position_embeddings, **kwargs)
    fused.raw = None
    return self.mlp(attended, residual=hidden_states)


# Decoder layers whose forward is residual + attn(norm(x)), then residual + mlp(norm(.)), and nothing
# else (transformers 5's interface), with the RMSNorm kind of their norms.
_DECODERS = {"LlamaDecoderLayer": "llama", "MistralDecoderLayer": "llama", "Qwen2DecoderLayer": "llama",
             "Qwen3DecoderLayer": "llama", "GemmaDecoderLayer": "gemma"}
_NORM_CLASSES = {"llama": ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"),
                 "gemma": ("GemmaRMSNorm",)}
_DECODER_CLASSES: dict[type, type] = {}


def _norm_spec(module, kind: str) -> tuple | None:
    if type(module).__name__ not in _NORM_CLASSES[kind] or "forward" in vars(module):
        return None
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not weight.is_contiguous() or eps is None:
        return None
    return weight, float(eps), kind


def _fusable_decoder(module) -> tuple | None:
    """(input norm, post-attention norm) of a decoder layer that can run fused, else None."""
    kind = _DECODERS.get(type(module).__name__)
    if kind is None or "forward" in vars(module) or _TRANSFORMERS_MAJOR < 5:
        return None
    if {name for name, _ in module.named_children()} != {"input_layernorm", "self_attn",
                                                         "post_attention_layernorm", "mlp"}:
        return None
    if not isinstance(getattr(module.self_attn, "q_proj", None), SkinnyQKV) or not hasattr(module.mlp, "_specgen_act"):
        return None
    norms = (_norm_spec(module.input_layernorm, kind), _norm_spec(module.post_attention_layernorm, kind))
    if None in norms or module.self_attn.q_proj.weight.dtype != module.mlp.gate_proj.weight.dtype:
        return None
    return norms


def _transformers_major() -> int:
    try:
        import transformers
        return int(transformers.__version__.split(".")[0])
    except Exception:  # noqa: BLE001 - no transformers: nothing to fuse
        return 0


_TRANSFORMERS_MAJOR = _transformers_major()
_MLP_CLASSES: dict[type, type] = {}


def _activation(module) -> str | None:
    """The kernel's name for a gated MLP's activation, or None when it is not one the kernel has."""
    act = getattr(module, "act_fn", None)
    if isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU"):
        return "silu"
    if type(act).__name__ in ("PytorchGELUTanh", "GELUTanh") or (
            isinstance(act, torch.nn.GELU) and act.approximate == "tanh"):
        return "gelu_tanh"
    return None


def _gated_mlp(module) -> str | None:
    parts = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(p, torch.nn.Linear) and p.bias is None for p in parts):
        return None
    if parts[0].weight.shape != parts[1].weight.shape or parts[0].weight.stride() != parts[1].weight.stride():
        return None
    return _activation(module)


def _qkv(module) -> list | None:
    parts = [getattr(module, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    if not all(type(p) is torch.nn.Linear for p in parts):
        return None
    first = parts[0].weight
    if any(p.weight.shape[1] != first.shape[1] or p.weight.dtype != first.dtype or p.weight.device != first.device
           or (p.bias is None) != (parts[0].bias is None) for p in parts):
        return None
    return parts


def install(model) -> int:
    """Route the model's linear layers (and gated MLPs) through the kernel for short inputs; fuse
    each attention module's q/k/v weights into one. Returns how many modules were switched;
    idempotent."""
    switched = 0
    for module in list(model.modules()):
        parts = _qkv(module)
        if parts is not None:
            fused = _Fused(parts)
            for role, part in enumerate(parts):
                part._specgen_class = torch.nn.Linear
                part._specgen_fused = fused
                part._specgen_role = role
                part.__class__ = SkinnyQKV
            switched += 3
    for module in model.modules():
        if hasattr(module, "_specgen_class"):
            continue
        if type(module) is torch.nn.Linear and module.weight.stride(-1) == 1:
            module._specgen_class = torch.nn.Linear
            module.__class__ = SkinnyLinear
            switched += 1
            continue
        act = _gated_mlp(module)
        if act is not None and "forward" not in vars(module):
            base = type(module)
            if base not in _MLP_CLASSES:
                _MLP_CLASSES[base] = type(f"Skinny{base.__name__}", (base,), {"forward": _mlp_forward})
            module._specgen_class = base
            module._specgen_act = act
            module.__class__ = _MLP_CLASSES[base]
            switched += 1
    if os.environ.get("SPECGEN_FUSE_NORMS", "1") != "0":
        for module in model.modules():
            norms = None if hasattr(module, "_specgen_class") else _fusable_decoder(module)
            if norms is None:
                continue
            base = type(module)
            if base not in _DECODER_CLASSES:
                _DECODER_CLASSES[base] = type(f"Skinny{base.__name__}", (base,), {"forward": _decoder_forward})
            module.self_attn.q_proj._specgen_fused.norm = norms[0]
            module.mlp._specgen_norm = norms[1]
            module._specgen_class = base
            module.__class__ = _DECODER_CLASSES[base]
            switched += 1
    return switched


def uninstall(model) -> None:
    for module in model.modules():
        base = module.__dict__.pop("_specgen_class", None)
        if base is not None:  # fused q/k/v weights stay views of one buffer: same values
            module.__class__ = base
            for key in ("_specgen_act", "_specgen_fused", "_specgen_role", "_specgen_norm"):
                module.__dict__.pop(key, None)


def installed(model) -> bool:
    return any(hasattr(module, "_specgen_class") for module in model.modules())
