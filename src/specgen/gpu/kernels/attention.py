"""Attention for captured steps: a Triton kernel over the live part of a static KV cache.

Why: a captured step attends over the whole static cache (capacity positions) through SDPA with a
[q, capacity] mask. On an H200 (`git show 1b54921:docs/benchmarks.md`, "Linear and attention kernels")
cuDNN SDPA then costs far more for the 5 tokens of a k = 4 verification than for 1 token, and that
one difference is most of what a verification step costs over a 1-token step. This kernel reads the position
straight from the runner's device tensor and visits only keys [0, position + q): its cost follows
the sequence, not the cache, and barely grows with q: every key block is loaded from memory once
for all query heads that share its KV head (GQA), and a step's other row tiles read it from L2.

Layout (flash decoding): program (b * KVH + kv head, tile, split) takes BLOCK_M rows of the step's
(query token, query head of the group) pairs, token-major, and keys [split * split_keys, ...) up to
its last token's last visible key; an online softmax in base 2. A step of several tokens shares each
key block between the tokens of a tile instead of loading it once per token (Llama-3-8B shape,
H200: the 5-token step's split kernel took twice the one-token step's time with a program per
token, `git show 1b54921:docs/benchmarks.md`, "Dependent launch (H200)"). One split writes the
output directly; several write normalised partial outputs and their log-sum-exp, and _combine_kernel
merges them in split order, each row's up to the split holding its last key. A program whose split
lies past all its rows' keys and the step's new keys exits at once, writing nothing: the splits
follow the cache, so with a short sequence in a large cache most programs are such. Query token t
sits at position + t and sees keys n with n <= position + t (and, with a sliding window w,
n > position + t - w, the mask transformers applies).

Trees and any other rows (core/step/rows.py's layout: per sequence a start, per row a tail of slots
in path order, `tail` and `depth`): each row walks logical keys, the prefix's slots in place, then
its tail gathered, key j at position j. The splits wholly before the one holding the start hold the
same keys for every row of a sequence: there shared programs take tiles of several tokens' heads,
token-major as a chain's (where a token's heads fill more than a tile, each token takes whole
tiles), and load each key block once for the whole tile: a program takes one tile over a run of at
most MAX_RUN splits, one after another, its query loaded and rotated once (shared_runs). From the
split holding the start on, each token has programs of its own (its heads laid out as a one-token
chain step's), over the few splits its path can reach, walking the blocks from where its one-token
step's walk starts (its window) to its last key. So a tree node visits its path's keys in the order,
blocks and splits of a one-token chain step at its position over a cache that holds its path in
place, and gets its output bit for bit; a sliding window compares those positions. A batch's
sequences each read their own start. Why shared tiles: with one token's heads a program over every
split, every tree node re-read the whole prefix (Llama-3.1-8B shapes: 12 of 16 rows of each tile
empty), and a 33-row tree verification's split kernel took 1.30 ms a round over 32 layers on an H200
against 0.22 ms for a 7-row chain, whose tiles share each key block. Why own programs past the
start: a shared tile walking its tokens' own blocks in turn made one dependent pass a token (see the
kernel).

Soft-capping (Gemma 2's attn_logit_softcapping, `softcap` > 0): each score becomes
softcap * tanh(score / softcap) before the mask and the softmax, as transformers' eager attention
computes it (see the kernel).

Row invariance (bit-exact greedy decoding): a row's result is the same whatever the number of query
tokens in the step: the same tile size (set by the model), the same key blocks and splits (block
and split boundaries are absolute positions, splits set by the cache's capacity), and the blocks
it walks beyond its own keys leave it bitwise unchanged (see the kernel). Its place in the tile
moves with its token; a tensor-core product computes each row by itself, which the GPU tests check
(tests/gpu/kernels/test_exact.py); in the Triton interpreter, whose matmul does not, the products are summed
per row. So the token at position p gets bitwise the same output from a 1-token step at p as from
a (k+1)-token step that holds it.

With rope (the rope fusion of [kernels]), the query and the step's new keys arrive before their
rotary embedding: the kernel rotates them, and each split writes the new keys and values whose
positions fall in its key range (the split that reads them) into their rows' slots before
reading the cache. Every tile's program of a split writes all of them (the same values; none
exits early in a split that holds one), so what a program reads was there before the launch or
was written by itself (another program's write of that slot is the same bits): a row's key at
position p lies in its program's split, and past the start a tree row's key at p is its
ancestor's at p, which p's split writes.

Torch references: gpu/kernels/reference.py. Calls from a model step: gpu/ops.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from specgen.gpu.kernels.dependent import launch_options, release_next, wait_previous

# Keys per program: at least SPLIT_KEYS, more when the cache holds over MAX_SPLITS x SPLIT_KEYS. Short
# splits spread even a short sequence over many programs; the merge reads at most MAX_SPLITS partials.
# Heads wider than 128 take key blocks of 32 and splits of one block: Gemma 2's (head_dim 256, 4 or
# 8 KV heads) otherwise ran too few programs, each two dependent blocks long (H200: its 2B step
# 1.741 -> 1.723 ms, `git show 1b54921:docs/benchmarks.md`, "Gemma 2's layers on the kernels (H200)").
# Splits depend on the model and the cache, never on tokens.
SPLIT_KEYS = 64
# The merge's block is always MAX_SPLITS wide, whatever the cache's splits: a row's unread splits
# load as exact zeros, so the same reduction over the same positions gives the same bits. With a
# block of next_power_of_2(splits) the reduction's shape followed the capacity: on an H200 a float32
# row merged from two splits of a 128-slot cache differed from the same row's merge in a 4096-slot
# cache (tests/gpu/kernels/test_attention.py, two splits), so a batch's cache and a prompt's own could
# disagree.
MAX_SPLITS = 64
MAX_ROWS = 64  # query rows (one token's heads per KV head) per program
# A tree's shared programs (see the kernel) take one tile over a run of at most this many splits, one
# after another: the tile's query is loaded and rotated once a program, not once a tile and split.
# A sequence's S shared splits (those wholly before the one holding its start) form one run while
# S < MAX_RUN, else max(2, cdiv(S, MAX_RUN)) runs of as even a length as divides them. Why (H200,
# Llama-3.1-8B shapes, 32 tree rows in a 1,024-slot cache, split kernel us a layer call; trees.json
# `split-runs-2026-11-30`): after 200 / 290 / 320 / 480 / 700 / 900 tokens (S = 3, 4, 5, 7, 10, 14)
# programs of 3 tiles of one split took 14.3 / 15.9 / 16.4 / 17.1 / 20.5 / 23.5; runs: one of 3
# 13.4, two of 2 12.1 (one of 4: 15.9, the launch's longest program), two 13.7, two 17.2, three
# 19.4, four 20.3; runs of at most 3 splits gave 17.7 / 20.0 / 23.0 at S = 7, 10, 14, of at most 2
# 18.7 / 20.2 / 21.4 (more programs than the SMs hold at once).
MAX_RUN = 4


def shared_runs(shared_splits: int) -> int:
    """The runs of a sequence's shared splits (the kernel computes the same on the device)."""
    if shared_splits < MAX_RUN:
        return min(shared_splits, 1)
    return max(2, triton.cdiv(shared_splits, MAX_RUN))


# A tree's split kernel is capped at this many registers a thread: 3 programs an SM instead of 2
# (168 registers and 24 bytes spilled against 193; sm_90, Triton 3.6). On an H200, Llama-3.1-8B
# shapes, 33 rows after 1,000 tokens: 33.5 -> 28.4 us a layer; 128 (4 an SM, 120 bytes spilled)
# lost after short prompts (12.5 -> 15.5 us at 10 tokens). A chain's launch keeps Triton's choice.
TREE_REGISTERS = 168
MAX_GRAPH_QUERY = 64  # longer steps (prefill) take the SDPA path
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # the online softmax is in base 2


def decode_attention(
    query: torch.Tensor,  # [B, H, q, D]
    key: torch.Tensor,  # [B, KVH, C, D]
    value: torch.Tensor,  # [B, KVH, C, D]
    position: torch.Tensor,  # [] or [B] int64: each sequence's start (where a chain's token 0 sits)
    scale: float,
    window: int = 0,  # sliding window (0: none)
    rope: tuple | None = None,  # (new keys, new values, cos, sin): see below
    softcap: float = 0.0,  # attention logit soft-capping (0: none)
    dependent: bool = False,  # launched dependent on the kernel before (gpu/kernels/dependent.py)
    tail: torch.Tensor | None = None,  # [B, q, T] int64: each row's slots past the start, in path order
    depth: torch.Tensor | None = None,  # [B, q] int64: the tail entries each row sees
) -> torch.Tensor:  # [B, q, H, D]
    """Without `tail`, the rows are chains: token t of sequence b sits at position[b] + t and sees
    slots 0 .. position[b] + t. With it (core/step/rows.py's layout: a token tree, or any rows), row
    t sees slots 0 .. position[b] - 1, then tail[b, t, :depth[b, t]], and sits at position
    position[b] + depth[b, t] - 1, where its own slot is its tail's last entry.
    With rope = (k_new [B, KVH, q, D], v_new [B, KVH, q, D], cos [B, q, D], sin [B, q, D]): the
    query and the new keys come before their rotary embedding, and the kernel rotates them
    (rotate-half form, float32, one rounding) and writes the new keys and values into the cache at
    each row's slot before attending. Otherwise the cache holds them already and the query is
    rotated. With softcap > 0 each scaled score s becomes softcap * tanh(s / softcap) before the mask."""
    return run(query, key, value, position, scale, window, rope, softcap, dependent, tail, depth)


def tiles_of(group: int, gathered: bool) -> tuple[int, int]:
    """(BLOCK_M, pitch): rows a tile (by the model, never by tokens) and rows a token in the tile
    layout: token-major (a chain's, and a tree's where a tile holds several tokens), or a tree's
    token padded to whole tiles where its heads fill more than one."""
    block_m = max(16, min(MAX_ROWS, triton.next_power_of_2(group)))
    pitch = group if not gathered or group <= block_m else triton.cdiv(group, block_m) * block_m
    return block_m, pitch


def run(query, key, value, position, scale, window, rope, softcap, dependent, tail=None, depth=None):
    """decode_attention's launches."""
    batch, heads, tokens, dim = query.shape
    kv_heads, capacity = key.shape[1], key.shape[2]
    assert key.shape == value.shape == (batch, kv_heads, capacity, dim) and heads % kv_heads == 0
    assert query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
    assert capacity * max(key.stride(2), value.stride(2)) < 2**31  # _attend's int32 slot offsets
    assert position.numel() in (1, batch) and position.dtype == torch.int64
    assert tokens <= MAX_GRAPH_QUERY, f"{tokens} query tokens > MAX_GRAPH_QUERY {MAX_GRAPH_QUERY}"
    assert softcap >= 0.0, f"softcap {softcap} < 0"
    group = heads // kv_heads
    block_m, pitch = tiles_of(group, tail is not None)
    tiles = triton.cdiv(tokens * pitch, block_m)
    block_d = max(16, triton.next_power_of_2(dim))
    block_n = 64 if block_d <= 128 else 32
    split_keys = max(min(SPLIT_KEYS, block_n), block_n * triton.cdiv(triton.cdiv(capacity, MAX_SPLITS), block_n))
    splits = triton.cdiv(capacity, split_keys)
    out = torch.empty(batch, tokens, heads, dim, dtype=query.dtype, device=query.device)
    if splits == 1:
        part, lse = out, out  # unused: the kernel writes out directly
    else:
        part = torch.empty(batch, heads, tokens, splits, dim, dtype=torch.float32, device=query.device)
        lse = torch.empty(batch, heads, tokens, splits, dtype=torch.float32, device=query.device)
    gathered = tail is not None
    if gathered:
        # shared tiles over every split, then each token's own programs over the splits that can
        # hold its path: positions start .. start + T - 1 span at most `span` splits
        per_token = triton.cdiv(group, block_m)
        span = 1 + triton.cdiv(max(tail.shape[2] - 1, 0), split_keys)
        # room for the shared programs of the longest start (the kernel's runs per sequence)
        shared_programs = tiles * shared_runs(splits - 1)  # a start's split is at most the last
        grid = (batch * kv_heads, shared_programs + tokens * per_token * span, 1)
    else:
        per_token = span = 1
        shared_programs = 0
        grid = (batch * kv_heads, tiles, splits)
    if rope is None:
        k_new = v_new = cos = sin = query  # unused
        new_strides = (0,) * 8
    else:
        k_new, v_new, cos, sin = rope
        assert k_new.shape == v_new.shape == (batch, kv_heads, tokens, dim) and dim % 2 == 0
        assert cos.shape == sin.shape == (cos.shape[0], tokens, dim) and cos.stride() == sin.stride()
        assert k_new.stride(-1) == v_new.stride(-1) == cos.stride(-1) == 1
        new_strides = (*k_new.stride()[:3], *v_new.stride()[:3], 0 if cos.shape[0] == 1 else cos.stride(0), cos.stride(1))
    starts = position.reshape(-1)
    start_stride = 0 if starts.numel() == 1 else starts.stride(0)
    if not gathered:
        tail = depth = starts  # unused
        tail_strides = (0,) * 4
    else:
        assert tail.dtype == depth.dtype == torch.int64 and tail.stride(-1) == 1
        assert tail.dim() == 3 and tail.shape[:2] == depth.shape == (batch, tokens)
        tail_strides = (tail.stride(0), tail.stride(1), depth.stride(0), depth.stride(1))
    _split_kernel[grid](
        query, key, value, starts, tail, depth, out, part, lse, k_new, v_new, cos, sin,
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], *new_strides, start_stride, *tail_strides,
        kv_heads, group, tokens, dim, capacity, pitch, tiles, shared_programs, per_token, span,
        scale if softcap else scale * LOG2E.value,
        WINDOW=window, SOFTCAP=float(softcap), SPLITS=splits, SPLIT_KEYS=split_keys, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_D=block_d,
        F32_DOT=query.dtype == torch.float32, PER_ROW=INTERPRETED, ROPE=rope is not None, TAIL=gathered,
        BLOCK_T=max(16, triton.next_power_of_2(max(tokens, tail.shape[2] if gathered else 0))),
        MAX_RUN=MAX_RUN, DEPENDENT=dependent, num_warps=4,
        **({"maxnreg": TREE_REGISTERS} if gathered else {}), **launch_options(dependent),
    )
    if splits > 1:
        _combine_kernel[(batch * heads * tokens,)](
            part, lse, out, starts, depth, start_stride, *tail_strides[2:], heads, tokens, dim, splits,
            SPLIT_KEYS=split_keys, TAIL=gathered,
            BLOCK_S=MAX_SPLITS, BLOCK_D=block_d, DEPENDENT=dependent, HOLD=tokens > 1, num_warps=4,
            **launch_options(dependent),
        )
    return out


# -- kernels ----------------------------------------------------------------------------------------


@triton.jit
def _split_kernel(
    q_ptr,  # [B, H, q, D]
    k_ptr,  # [B, KVH, C, D]
    v_ptr,  # [B, KVH, C, D]
    start_ptr,  # [B] (or [1], stride 0) int64: each sequence's start
    tail_ptr,  # [B, q, T] int64: each row's slots past the start, in path order (TAIL)
    depth_ptr,  # [B, q] int64: the tail entries each row sees (TAIL)
    out_ptr,  # [B, q, H, D] contiguous (SPLITS == 1)
    part_ptr,  # [B, H, q, SPLITS, D] float32 (SPLITS > 1)
    lse_ptr,  # [B, H, q, SPLITS] float32, base 2 (SPLITS > 1)
    kn_ptr,  # [B, KVH, q, D] new keys before rotary (ROPE)
    vn_ptr,  # [B, KVH, q, D] new values (ROPE)
    cos_ptr,  # [B or 1, q, D] (ROPE)
    sin_ptr,  # [B or 1, q, D] (ROPE)
    sqb, sqh, sqt,
    skb, skh, skn,
    svb, svh, svn,
    snkb, snkh, snkt,
    snvb, snvh, snvt,
    scb, sct,
    ssb,
    stb, stt, sdb, sdt,
    kv_heads, group, tokens, dim, capacity,
    pitch,  # TAIL: rows per token in a shared tile (group, or whole tiles where group > BLOCK_M)
    tiles,  # TAIL: shared tiles
    shared_programs,  # TAIL: the grid's second axis holds these shared programs, then the tokens' own
    per_token,  # TAIL: a token's programs a split (its heads over BLOCK_M rows each)
    span,  # TAIL: splits a token's programs cover from the one holding the start
    score_scale,  # the model's scale with SOFTCAP, else scale x log2(e): base-2 scores in one product
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, SPLITS: tl.constexpr, SPLIT_KEYS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, F32_DOT: tl.constexpr, PER_ROW: tl.constexpr,
    ROPE: tl.constexpr, TAIL: tl.constexpr,
    BLOCK_T: tl.constexpr, MAX_RUN: tl.constexpr, DEPENDENT: tl.constexpr,
):
    wait_previous(DEPENDENT)  # first, in every program: gpu/kernels/dependent.py
    bkv = tl.program_id(0)
    b = bkv // kv_heads
    kvh = bkv % kv_heads
    prefix = tl.load(start_ptr + b * ssb)
    if TAIL:
        # Two kinds of programs. Shared: a tile of several tokens' heads, token-major as in a chain,
        # over a run of splits wholly before the one holding the start, one after another: their
        # keys are the prefix's, in place, the same for every row, so each key block serves a whole
        # tile. Own: one token's heads (as a one-token chain step lays them out) over a split from the
        # one holding the start on, walking its logical keys: the prefix's in place, then its tail
        # gathered. Why not every token of a shared tile walking its own blocks in turn: in the split
        # holding the start, a tile of 4 tokens then made 4 dependent passes (Llama-3.1-8B shapes,
        # H200, a 33-row tree after 1,000 tokens: 64 us a layer against 39 with own programs).
        # Shared programs run-major (a run's tiles, then the next run's), so that the live ones, over
        # the splits before the start's, are the first on the grid. A sequence's start_split shared
        # splits form `runs` runs of as even a length as divides them (shared_runs on the host, which
        # sizes the grid; MAX_RUN: why these lengths). Why runs of splits rather than 3 tiles of
        # one split (before): the tile's query is loaded and rotated once a program rather than once
        # a tile and split. Which program computes a (tile, split) never changes its bits.
        work = tl.program_id(1)
        own = work - shared_programs  # < 0: a shared program
        shared = own < 0
        own = tl.maximum(own, 0)
        token = own // (per_token * span)  # an own program's token
        piece = (own // span) % per_token  # and which BLOCK_M of its heads
        start_split = prefix // SPLIT_KEYS
        runs = tl.where(start_split < MAX_RUN, tl.minimum(start_split, 1),
                        tl.maximum(2, (start_split + MAX_RUN - 1) // MAX_RUN))
        own_split = start_split + own % span
        at_token = prefix + tl.load(depth_ptr + b * sdb + token * sdt) - 1
        # a shared program past the live ones, an own one past its token's last key or the cache
        # (decided before the divisions below: most programs are idle, and exit at once)
        idle = tl.where(shared, work >= runs * tiles, (own_split * SPLIT_KEYS > at_token) | (own_split >= SPLITS))
    else:
        split = tl.program_id(2)
        shared = False
        token = 0
        piece = 0
        tile = tl.program_id(1)
        first_split = split
        end_split = split + 1
        # A split that starts past the last key of every row of the tile, and past every new key the
        # launch writes (every program of the split that holds one writes it), has nothing to read or
        # write: the merge never reads its rows' partials (_combine_kernel stops at each row's last
        # split). Why: the splits follow the cache, not the sequence, so most of a step's programs are
        # such, and each stored a zero partial that the merge loaded again (H200, Llama-3.1-8B shapes,
        # 32 layers, a 10-token prompt: a 33-row tree's attention 1.17 ms split + 0.16 ms merge a round
        # against 0.22 + 0.09 for a 7-row chain, about the ratio of rows).
        reach = prefix + tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // group, tokens - 1)
        if ROPE:
            reach = tl.maximum(reach, prefix + tokens - 1)
        idle = split * SPLIT_KEYS > reach
    if idle:
        release_next(DEPENDENT)  # every program releases (gpu/kernels/dependent.py)
        return
    if TAIL:
        run = work // tiles  # a shared program's run: splits [start_split * run // runs, ...)
        runs = tl.maximum(runs, 1)  # an own program's is not read
        tile = tl.where(shared, work % tiles, 0)
        first_split = tl.where(shared, start_split * run // runs, own_split)
        end_split = tl.where(shared, start_split * (run + 1) // runs, own_split + 1)
        split = first_split  # the ROPE writes' split: an own program's (a shared run holds no new key)
    split_lo = (split * SPLIT_KEYS).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < dim
    if ROPE:
        # The new keys and values whose positions fall in this split (the split that reads them):
        # rotated, into the cache at their slots. They sit at the start or after it, so a split
        # that ends before the start holds none (a shared program's never does). An own program
        # writes those on its token's path, the only ones of the launch its walk reads; every new
        # key is on its own row's path, so each is written.
        if split_lo + SPLIT_KEYS > prefix:
            half = dim // 2
            partner = tl.where(d < half, d + half, d - half)
            sign = tl.where(d < half, -1.0, 1.0)
            j = tl.arange(0, BLOCK_T)
            j_ok = j < tokens
            if TAIL:
                depth_new = tl.load(depth_ptr + b * sdb + j * sdt, mask=j_ok, other=1)
                at_new = prefix + depth_new - 1
                slot_new = tl.load(tail_ptr + b * stb + j * stt + depth_new - 1, mask=j_ok, other=0)
                walked = j < at_token - prefix + 1  # the token's tail entries
                path = tl.load(tail_ptr + b * stb + token * stt + j, mask=walked, other=-1)
                on_path = tl.max((slot_new[:, None] == path[None, :]).to(tl.int32), axis=1) > 0
                j_ok = j_ok & on_path
            else:
                at_new = prefix + j
                slot_new = at_new
            mine = j_ok & (at_new >= split_lo) & (at_new < split_lo + SPLIT_KEYS) & (slot_new < capacity)
            new_mask = mine[:, None] & d_ok[None, :]
            kn_base = kn_ptr + b * snkb + kvh * snkh + j[:, None] * snkt
            kn = tl.load(kn_base + d[None, :], mask=new_mask, other=0.0).to(tl.float32)
            kn_partner = tl.load(kn_base + partner[None, :], mask=new_mask, other=0.0).to(tl.float32)
            trig_new = b * scb + j[:, None] * sct + d[None, :]
            cos_new = tl.load(cos_ptr + trig_new, mask=new_mask, other=0.0).to(tl.float32)
            sin_new = tl.load(sin_ptr + trig_new, mask=new_mask, other=0.0).to(tl.float32)
            kr = kn * cos_new + sign[None, :] * kn_partner * sin_new
            tl.store(k_ptr + b * skb + kvh * skh + slot_new[:, None] * skn + d[None, :], kr.to(k_ptr.dtype.element_ty),
                     mask=new_mask)
            vn = tl.load(vn_ptr + b * snvb + kvh * snvh + j[:, None] * snvt + d[None, :], mask=new_mask, other=0.0)
            tl.store(v_ptr + b * svb + kvh * svh + slot_new[:, None] * svn + d[None, :], vn.to(v_ptr.dtype.element_ty),
                     mask=new_mask)
            tl.debug_barrier()  # this program's stores are visible to all its threads before the key loop

    f = tl.arange(0, BLOCK_M)
    if TAIL:
        f_shared = tile * BLOCK_M + f  # a shared tile's rows, token-major
        t = tl.where(shared, f_shared // pitch, token)  # [M] each row's query token
        g = tl.where(shared, f_shared % pitch, piece * BLOCK_M + f)  # and its head within the group
        row_ok = (t < tokens) & (g < group)
        at = prefix + tl.load(depth_ptr + b * sdb + t * sdt, mask=row_ok, other=1) - 1  # [M] its position
        at_last = tl.max(tl.where(row_ok, at, prefix), axis=0)  # the tile's deepest and shallowest rows'
        at_first = tl.min(tl.where(row_ok, at, at_last), axis=0)
    else:
        f = tile * BLOCK_M + f  # this tile's rows, token-major
        t = f // group
        g = f % group
        row_ok = t < tokens
        at = prefix + t  # [M] each row's position: it sees keys [.., at]
        at_first = prefix + (tile * BLOCK_M) // group  # the tile's first and last tokens' positions
        at_last = prefix + tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // group, tokens - 1)
    head = kvh * group + g
    q = _query(q_ptr, cos_ptr, sin_ptr, sqb, sqh, sqt, scb, sct, b, head, t, row_ok, d, d_ok, dim, ROPE)
    for s in range(first_split, end_split):
        _tile(q, k_ptr, v_ptr, tail_ptr, out_ptr, part_ptr, lse_ptr,
              skb, skh, skn, svb, svh, svn, stb, stt,
              b, kvh, head, prefix, s, split_lo + (s - split) * SPLIT_KEYS, token, t, row_ok, at, at_first, at_last,
              d, d_ok, kv_heads, group, tokens, dim, capacity, score_scale,
              WINDOW, SOFTCAP, SPLITS, SPLIT_KEYS, BLOCK_M, BLOCK_N, BLOCK_D, F32_DOT, PER_ROW, TAIL)
    release_next(DEPENDENT)


@triton.jit
def _query(q_ptr, cos_ptr, sin_ptr, sqb, sqh, sqt, scb, sct, b, head, t, row_ok, d, d_ok, dim, ROPE: tl.constexpr):
    """A tile's query rows [M, D] (query token t, head `head`; zeros where not row_ok), rotated
    with rope."""
    q = tl.load(q_ptr + b * sqb + head[:, None] * sqh + t[:, None] * sqt + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [M, D]
    if ROPE:  # rotate-half: x * cos + [-x2, x1] * sin
        half = dim // 2
        partner = tl.where(d < half, d + half, d - half)
        sign = tl.where(d < half, -1.0, 1.0)
        q_mask = row_ok[:, None] & d_ok[None, :]
        q_partner = tl.load(q_ptr + b * sqb + head[:, None] * sqh + t[:, None] * sqt + partner[None, :],
                            mask=q_mask, other=0.0)
        trig = b * scb + t[:, None] * sct + d[None, :]  # [M, D]: each row's token's
        cos = tl.load(cos_ptr + trig, mask=q_mask, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + trig, mask=q_mask, other=0.0).to(tl.float32)
        q = (q.to(tl.float32) * cos + sign[None, :] * q_partner.to(tl.float32) * sin).to(q_ptr.dtype.element_ty)
    return q


@triton.jit
def _tile(q, k_ptr, v_ptr, tail_ptr, out_ptr, part_ptr, lse_ptr,
          skb, skh, skn, svb, svh, svn, stb, stt,
          b, kvh, head, prefix, split, split_lo, token, t, row_ok, at, at_first, at_last, d, d_ok,
          kv_heads, group, tokens, dim, capacity, score_scale,
          WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, SPLITS: tl.constexpr, SPLIT_KEYS: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, F32_DOT: tl.constexpr,
          PER_ROW: tl.constexpr, TAIL: tl.constexpr):
    """One tile's rows (query q [M, D] of token t, head `head`; valid where row_ok, each at position
    `at`) over one split's keys -> their output (one split) or partial and log-sum-exp."""
    lo = split_lo
    hi = tl.minimum(tl.minimum(lo + SPLIT_KEYS, at_last + 1), capacity)
    if WINDOW > 0:
        first = tl.maximum(at_first - WINDOW + 1, 0)
        lo = tl.maximum(lo, first - first % BLOCK_N)

    # The walk covers every row's keys. A key block outside a row's keys (past its last one, or
    # before its window) leaves that row's running max, sum and output bitwise as they were: its
    # scores are -inf, so it adds products of 0 and rescales by exp2(0) = 1, or, before the row's
    # first key, leaves them at their start. So a row's result does not depend on the other tokens
    # in its tile.
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = k_ptr + b * skb + kvh * skh
    v_base = v_ptr + b * svb + kvh * svh
    if TAIL:
        # A shared tile's keys are all the prefix's, in place. An own program walks its token's
        # logical keys: the prefix's in place up to the start, then its tail gathered, so its rows
        # see their one-token step's blocks, keys and order, over a cache that holds the path in
        # place, and sit where that step's rows sit in its tile.
        for block in range(lo, hi, BLOCK_N):
            n = block + tl.arange(0, BLOCK_N)  # [N] logical keys: a key's index is its position
            n_ok = n < hi
            past = n_ok & (n >= prefix)  # never in a shared tile
            slot = tl.where(past, tl.load(tail_ptr + b * stb + token * stt + n - prefix, mask=past, other=0), n)
            m, l, acc = _attend(q, m, l, acc, k_base, v_base, slot, n, n_ok, at, d, d_ok, skn, svn, score_scale,
                                WINDOW, SOFTCAP, F32_DOT, PER_ROW)
    else:
        for block in range(lo, hi, BLOCK_N):
            n = block + tl.arange(0, BLOCK_N)  # [N] logical keys: a key's index is its position
            m, l, acc = _attend(q, m, l, acc, k_base, v_base, n, n, n < hi, at, d, d_ok, skn, svn, score_scale,
                                WINDOW, SOFTCAP, F32_DOT, PER_ROW)

    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    heads = kv_heads * group
    if SPLITS == 1:
        dst = out_ptr + ((b * tokens + t[:, None]) * heads + head[:, None]) * dim + d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:
        row_id = (b * heads + head) * tokens + t  # [M] index into [B, H, q]
        # a row's splits past its last key are left unwritten: the merge does not read them
        kept = row_ok & (at >= split_lo)
        tl.store(part_ptr + (row_id[:, None] * SPLITS + split) * dim + d[None, :], o,
                 mask=kept[:, None] & d_ok[None, :])
        lse = tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
        tl.store(lse_ptr + row_id * SPLITS + split, lse, mask=kept)


@triton.jit
def _attend(q, m, l, acc, k_base, v_base, slot, n, n_ok, at, d, d_ok, skn, svn, score_scale,
            WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, F32_DOT: tl.constexpr, PER_ROW: tl.constexpr):
    """One key block's step of the online softmax for the tile's rows: logical keys n (valid where
    n_ok) at cache slots `slot`, each row seeing those at or before its position `at` (and inside
    the window) -> the rows' running max, sum and output."""
    # slots as int32 (run() checks the offsets fit): the int64 key rows held the tree kernel at 232
    # registers a thread, 193 with these (sm_90, Triton 3.6; benchmarks/sm90_resources.py)
    slot = slot.to(tl.int32)
    k = tl.load(k_base + slot[:, None] * skn + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    if PER_ROW:
        s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
    elif F32_DOT:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = (s * score_scale).to(tl.float32)  # [M, N]; inductor passes Python floats as fp64
    if SOFTCAP > 0:
        # transformers' Gemma 2 eager attention in its order: (q.k * scale) / cap, tanh, * cap,
        # then the mask. Kept: that order and a float32 rounding after each step; not kept: eager's
        # roundings to the model's dtype between the steps (in bf16 it rounds the product, the
        # scaled score and each soft-cap step to bf16; flash-attention's soft-capping does not
        # either). The base-2 factor joins the last product, as it joins the scale without a cap.
        s = _tanh(s / SOFTCAP) * (SOFTCAP * LOG2E)
    visible = n_ok[None, :] & (n[None, :] <= at[:, None])
    if WINDOW > 0:
        visible = visible & (n[None, :] > at[:, None] - WINDOW)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    v = tl.load(v_base + slot[:, None] * svn + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    if PER_ROW:
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
    elif F32_DOT:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l, acc


@triton.jit
def _tanh(x):
    """tanh in float32 from exp2 of -2|x| (no overflow; the interpreter has no libdevice): within
    a few units of float32 rounding of 1, absolute, which the cap scales like the score itself."""
    e = tl.exp2(tl.abs(x) * (-2.0 * LOG2E))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _combine_kernel(
    part_ptr,  # [B, H, q, S, D] float32
    lse_ptr,  # [B, H, q, S] float32, base 2
    out_ptr,  # [B, q, H, D]
    start_ptr,  # [B] (or [1], stride 0) int64: each sequence's start
    depth_ptr,  # [B, q] int64: the tail entries each row sees (TAIL)
    ssb, sdb, sdt,
    heads, tokens, dim, splits,
    SPLIT_KEYS: tl.constexpr, TAIL: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, DEPENDENT: tl.constexpr, HOLD: tl.constexpr,
):
    """Program (b * H + h) * q + t merges the splits of head h, token t in split order, up to the
    one that holds the row's last key (its position, as _split_kernel computes it: a window moves
    only its first). The splits past it are loaded as what an empty split's program computes (log-
    sum-exp -inf, output 0.0), so the merge is bitwise what it would be over all of them; their
    programs wrote nothing (see _split_kernel). HOLD (steps of
    several tokens): the next kernel is released once the partials are loaded and merged, not at the
    start. Measured, not explained (H200, captured steps, `git show 1b54921:docs/benchmarks.md`,
    "Dependent launch (H200)"): released at the start, the Llama-3-8B-shaped 5-token step took
    4.47 ms against 4.37 and the Llama-3.2-1B-shaped one 0.999 against 0.960 ms, while the 1B's
    1-token step was 4 µs faster than with HOLD. Where the release sits never changes a result."""
    wait_previous(DEPENDENT)
    if not HOLD:  # a one-token step's merge is all tail
        release_next(DEPENDENT)
    row = tl.program_id(0)  # (b * H + h) * q + t
    t = row % tokens
    bh = row // tokens
    h = bh % heads
    b = bh // heads
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    if TAIL:
        at = tl.load(start_ptr + b * ssb) + tl.load(depth_ptr + b * sdb + t * sdt) - 1
    else:
        at = tl.load(start_ptr + b * ssb) + t
    last = tl.minimum(at // SPLIT_KEYS, splits - 1)  # the split holding the row's last key
    kept = s <= last
    lse = tl.load(lse_ptr + row * splits + s, mask=kept, other=float("-inf"))  # [S]
    top = tl.max(lse, axis=0)
    weight = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - top))  # [S]
    part = tl.load(part_ptr + (row * splits + s[:, None]) * dim + d[None, :],
                   mask=kept[:, None] & (d[None, :] < dim), other=0.0)  # [S, D]
    o = tl.sum(part * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    if HOLD:
        release_next(DEPENDENT)
    tl.store(out_ptr + ((b * tokens + t) * heads + h) * dim + d, o.to(out_ptr.dtype.element_ty), mask=d < dim)

# float32 products without TF32 for float32 models (their graph-vs-eager checks are exact to 1e-5).
# The Triton interpreter (CPU tests: Triton made interpreted functions, not JITFunctions) sums float32
# products per row instead (PER_ROW): its bf16 tl.dot is wrong, and its matmul's result for a row
# depends on where the row sits in the tile.
INTERPRETED = not isinstance(_split_kernel, JITFunction)
