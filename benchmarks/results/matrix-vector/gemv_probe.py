"""Per-projection chains on the Llama-3.2-1B shapes: the project's linear kernel (table pick, plain
pick, split-K without its handoff) against a register GEMV with no split-K (each program holds its
columns' whole share of the weights, loaded in one go). 16 distinct weights per chain, one captured
graph, dependent launch on. Prints us per call and checks the GEMV against F.linear."""
import sys, time, itertools, torch, triton, triton.language as tl
from specgen.gpu import linear as L
from specgen.gpu.dependent import launch_options, release_next, wait_previous

dev = "cuda"
torch.manual_seed(0)
CHAIN = 16


@triton.jit
def gemv_kernel(x_ptr, w_ptr, u_ptr, out_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr, K_TILE: tl.constexpr,
                GATED: tl.constexpr, DEPENDENT: tl.constexpr):
    wait_previous(DEPENDENT)
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, K_TILE)
    acc = tl.zeros([BLOCK_N, K_TILE], tl.float32)
    acc_u = tl.zeros([BLOCK_N, K_TILE], tl.float32)
    for c in tl.static_range(K // K_TILE):
        w = tl.load(w_ptr + cols[:, None].to(tl.int64) * K + c * K_TILE + kk[None, :])
        if GATED:
            u = tl.load(u_ptr + cols[:, None].to(tl.int64) * K + c * K_TILE + kk[None, :])
        x = tl.load(x_ptr + c * K_TILE + kk).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
        if GATED:
            acc_u += u.to(tl.float32) * x[None, :]
    release_next(DEPENDENT)
    y = tl.sum(acc, axis=1)
    if GATED:
        g = y.to(tl.bfloat16).to(tl.float32)
        g = (g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32)
        y = g * tl.sum(acc_u, axis=1).to(tl.bfloat16).to(tl.float32)
    tl.store(out_ptr + cols, y.to(tl.bfloat16))


def gemv(x, w, u, cfg, dependent=True):
    n, k = w.shape
    block_n, k_tile, warps = cfg
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    gemv_kernel[(n // block_n,)](x, w, u if u is not None else w, out, n, K=k, BLOCK_N=block_n, K_TILE=k_tile,
                                 GATED=u is not None, DEPENDENT=dependent, num_warps=warps, **launch_options(dependent))
    return out


def w(n, k):
    return torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02


SHAPES = {  # name: (n, k, gated)
    "qkv": (3072, 2048, False), "o": (2048, 2048, False), "gate_up": (8192, 2048, True), "down": (2048, 8192, False),
}
only = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
counters = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
table = L.packaged()


def timed(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    res = []
    for _ in range(5):
        for _ in range(3): g.replay()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(50): g.replay()
        e1.record(); torch.cuda.synchronize()
        res.append(e0.elapsed_time(e1) / 50 / CHAIN * 1e3)
    return sorted(res)[2]


a = torch.empty(2 << 30, dtype=torch.uint8, device=dev); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): b.copy_(a)
torch.cuda.synchronize(); bw = 2 * a.numel() * 10 / (time.perf_counter() - t)
del a, b
print(f"copy bw {bw / 1e12:.2f} TB/s", flush=True)

for name in only:
    n, k, gated = SHAPES[name]
    W = [w(n, k) for _ in range(CHAIN)]
    U = [w(n, k) for _ in range(CHAIN)] if gated else [None] * CHAIN
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    floor = n * k * 2 * (2 if gated else 1) / bw * 1e6
    print(f"== {name} {n}x{k}{' gated' if gated else ''}: floor {floor:.2f} us", flush=True)
    pick_s, pick_p = table.pick(n, k, gated, True), table.pick(n, k, gated, False)

    def lin(cfg):
        def f():
            for i in range(CHAIN):
                if gated:
                    L.gate_up(x, W[i], U[i], "silu", cfg, counters=counters, dependent=True)
                else:
                    L.linear(x, W[i], None, cfg, counters=counters, dependent=True)
        return f
    rows = [("table split " + str(pick_s), lin(tuple(pick_s))), ("table plain " + str(pick_p), lin(tuple(pick_p)))]
    for bn, kt, wp in itertools.product((1, 2, 4, 8, 16), (512, 1024, 2048, 4096), (4, 8)):
        if n % bn or kt > k or (bn * kt * (2 if gated else 1)) > 32768 or (bn * kt) < 2048:
            continue
        cfg = (bn, kt, wp)
        ref = (torch.nn.functional.silu(x @ W[0].T) * (x @ U[0].T)) if gated else x @ W[0].T
        got = gemv(x, W[0], U[0], cfg)
        err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        if err > 5e-2:
            print(f"  gemv {cfg}: WRONG rel err {err:.3g}", flush=True)
            continue
        rows.append((f"gemv {cfg}", (lambda c: (lambda: [gemv(x, W[i], U[i], c) for i in range(CHAIN)]))(cfg)))
    results = []
    for label, fn in rows:
        try:
            us = timed(fn)
        except Exception as e:  # noqa: BLE001
            print(f"  {label}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        results.append((us, label))
        print(f"  {label}: {us:.2f} us ({us / floor:.2f}x)", flush=True)
    best = sorted(results)[:4]
    print("  best:", "; ".join(f"{l} {u:.2f}" for u, l in best), flush=True)
    W = U = None  # free the chain before the next shape
